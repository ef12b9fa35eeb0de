"""Dense allreduce: SUM / P. The reference every sparse algorithm is compared against. Also the two wrappers
that put dense allreduce beside another compressor: DenseWarmup (the first steps) and DenseVectors (the
one-dimensional parameters)."""
import dataclasses

import torch

from sparse_asr.compression.base import Compressor, Cost, StepStats, dense_allreduce_bytes


class DenseAllreduce(Compressor):
    name = "dense"
    uses_density = False

    @staticmethod
    def cost(n: int, k: int, P: int, shapes=None, options=None) -> Cost:
        words = 2 * n * (P - 1) / P
        return Cost(words, words, words, 2 * (P - 1), "2n(P-1)/P")

    def describe(self) -> str:
        return "dense allreduce"

    def step(self, flat_grad: torch.Tensor) -> StepStats:
        before = self.comm.counts()
        self.comm.allreduce_(flat_grad)
        flat_grad /= self.comm.size
        moved = self.comm.counts() - before
        return StepStats(
            algorithm=self.name,
            dense=True,
            numel=self.numel,
            k=self.numel,
            selected_local=self.numel,
            selected_global=self.numel,
            bytes_sent=moved.bytes_sent,
            bytes_recv=moved.bytes_recv,
            messages=moved.msgs_sent,
            seconds_select=0.0,
            seconds_comm=moved.seconds,
            dense_bytes=dense_allreduce_bytes(self.numel, self.comm.size, flat_grad.element_size()),
        )


class DenseWarmup(Compressor):
    """The first `steps` exchanges are dense allreduce, then `inner` takes over (compression.warmup_steps).
    Its own counter and state travel in checkpoints, so a resumed run switches at the same step."""

    def __init__(self, inner: Compressor, steps: int):
        self.inner, self.steps, self.taken = inner, steps, 0
        self.dense = DenseAllreduce(inner.comm, inner.numel, device=inner.device)
        self.name, self.comm, self.numel, self.density = inner.name, inner.comm, inner.numel, inner.density

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


class DenseVectors(Compressor):
    """The one-dimensional parameters (biases, BatchNorm scales and shifts: a small share of the entries)
    are averaged by dense allreduce; `inner` exchanges the rest, seeing zeros in their place, so it never
    selects them and keeps no residual for them (compression.dense_1d). Why: a bias followed by
    synchronized BatchNorm has a gradient that sums to exactly zero over ranks while no rank's own is zero,
    so under error feedback its residual grows without bound (docs/results.md)."""

    def __init__(self, inner: Compressor):
        self.inner = inner
        self.name, self.comm, self.numel, self.density = inner.name, inner.comm, inner.numel, inner.density
        self.device = inner.device
        offsets, positions = 0, []
        for shape in inner.shapes:  # the parameters' shapes in flat-buffer order
            size = shape.numel()
            if len(shape) == 1:
                positions.append(torch.arange(offsets, offsets + size))
            offsets += size
        self.positions = torch.cat(positions).to(inner.device) if positions else torch.zeros(0, dtype=torch.long)

    def describe(self) -> str:
        return f"{self.inner.describe()}, {self.positions.numel():,} entries of 1-D parameters by dense allreduce"

    def step(self, flat_grad: torch.Tensor) -> StepStats:
        vectors = flat_grad[self.positions]  # a copy (advanced indexing)
        flat_grad[self.positions] = 0.0
        stats = self.inner.step(flat_grad)
        before = self.comm.counts()
        self.comm.allreduce_(vectors)
        flat_grad[self.positions] = vectors / self.comm.size
        moved = self.comm.counts() - before
        return dataclasses.replace(
            stats, selected_global=stats.selected_global + self.positions.numel(),
            bytes_sent=stats.bytes_sent + moved.bytes_sent, bytes_recv=stats.bytes_recv + moved.bytes_recv,
            messages=stats.messages + moved.msgs_sent, seconds_comm=stats.seconds_comm + moved.seconds)

    def state_dict(self) -> dict:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state)
