"""Dense allreduce: SUM / P. The reference every sparse algorithm is compared against. Also the two wrappers
that put dense allreduce beside another compressor: DenseWarmup (the first steps) and DenseVectors (the
one-dimensional parameters)."""
import dataclasses

import torch

from sparse_asr.compression.base import Compressor, CompressorWrapper, Cost, StepStats


class DenseAllreduce(Compressor):
    name = "dense"
    uses_density = False

    @staticmethod
    def cost(n: int, k: int, P: int, shapes=None, options=None) -> Cost:
        words = 2 * n * (P - 1) / P
        return Cost(words, words, words, 2 * (P - 1), "2n(P-1)/P")

    @property
    def applied_count(self) -> int:
        """Every entry, every step."""
        return self.numel

    def describe(self) -> str:
        return "dense allreduce"

    def step(self, flat_grad: torch.Tensor) -> StepStats:
        with self.comm.measure() as moved:
            self.comm.allreduce_(flat_grad)
            flat_grad /= self.comm.size
        return self.stats(moved, self.numel, self.numel, k=self.numel, dense=True)


class DenseWarmup(CompressorWrapper):
    """The first `steps` exchanges are dense allreduce, then `inner` takes over (compression.warmup_steps).
    Its own counter and state travel in checkpoints, so a resumed run switches at the same step."""

    def __init__(self, inner: Compressor, steps: int):
        super().__init__(inner)
        self.steps, self.taken = steps, 0
        self.dense = DenseAllreduce(inner.comm, inner.numel, device=inner.device)

    @property
    def warmup_steps(self) -> int:
        return self.steps

    def describe(self) -> str:
        return f"{self.inner.describe()} after {self.steps} dense warm-up steps"

    def step(self, flat_grad: torch.Tensor) -> StepStats:
        compressor = self.dense if self.taken < self.steps else self.inner
        self.taken += 1
        return compressor.step(flat_grad)

    def state_dict(self) -> dict:
        return {"warmup_taken": self.taken, "inner": self.inner.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.taken = int(state["warmup_taken"])
        self.inner.load_state_dict(state["inner"])


class DenseVectors(CompressorWrapper):
    """The one-dimensional parameters (biases, BatchNorm scales and shifts: a small share of the entries)
    are averaged by dense allreduce; `inner` exchanges the rest, seeing zeros in their place, so it never
    selects them and keeps no residual for them (compression.dense_1d). Why: a bias followed by
    synchronized BatchNorm has a gradient that sums to exactly zero over ranks while no rank's own is zero,
    so under error feedback its residual grows without bound (docs/results.md)."""

    def __init__(self, inner: Compressor):
        super().__init__(inner)
        offsets, positions = 0, []
        for shape in self.shapes:  # the parameters' shapes in flat-buffer order
            size = shape.numel()
            if len(shape) == 1:
                positions.append(torch.arange(offsets, offsets + size))
            offsets += size
        self.positions = torch.cat(positions).to(self.device) if positions else torch.zeros(0, dtype=torch.long)

    def describe(self) -> str:
        return f"{self.inner.describe()}, {self.positions.numel():,} entries of 1-D parameters by dense allreduce"

    def step(self, flat_grad: torch.Tensor) -> StepStats:
        vectors = flat_grad[self.positions]  # a copy (advanced indexing)
        flat_grad[self.positions] = 0.0
        with self.comm.measure() as moved:  # the inner step's traffic and the vectors' allreduce together
            stats = self.inner.step(flat_grad)
            self.comm.allreduce_(vectors)
        flat_grad[self.positions] = vectors / self.comm.size
        return dataclasses.replace(stats, selected_global=stats.selected_global + self.positions.numel(),
                                   bytes_sent=moved.bytes_sent, bytes_recv=moved.bytes_recv,
                                   messages=moved.msgs_sent, seconds_comm=moved.seconds)
