"""Dense allreduce: SUM / P. The reference every sparse algorithm is compared against."""
import torch

from sparse_asr.compression.base import Compressor, StepStats, dense_allreduce_bytes


class DenseAllreduce(Compressor):
    name = "dense"

    def step(self, flat_grad: torch.Tensor, step: int) -> StepStats:
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
