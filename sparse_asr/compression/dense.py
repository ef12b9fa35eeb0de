"""Dense allreduce: SUM / P. The reference every sparse algorithm is compared against."""
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
