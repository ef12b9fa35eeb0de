"""Half-precision allreduce (`bf16`, `fp16`): the arithmetic of PyTorch's DDP hooks `bf16_compress_hook` and
`fp16_compress_hook` (torch.distributed.algorithms.ddp_comm_hooks.default_hooks) through our Communicator.

The hook casts the gradient to half precision, divides it by P in half precision, allreduces the halves (the
backend sums in half precision: every partial sum rounded to half) and casts the result back to float32. MPI has
no bfloat16 (nor, portably, float16) sum, so the allreduce is done by hand as the reduce-scatter + allgather a
ring does (compression/wire.py): rank j receives every rank's half-precision chunk j and sums them in rank order,
((h_0 + h_1) + h_2) + ..., each addition rounded to half (torch's CPU half addition adds in float32 and rounds once,
which is the correctly rounded half sum: float32 has more than 2 x 11 + 2 bits), then every rank gathers every
owned chunk: the same bits everywhere. Why this and not an allgather of whole vectors summed in float32: the hook
rounds every partial sum to half (and overflows where a partial sum does), and a ring moves 2n(P-1)/P halves per
rank, where an allgather moves n(P-1). At P <= 2 the sum has one addition, so the result is bitwise the hook's
(tests/mpi/half_check.py checks it against the hook on a gloo group); beyond, gloo's ring adds in another order,
which changes the last bits only.

Volume per rank: 2n(P-1)/P half words (2 bytes) received and sent, i.e. n(P-1)/P 4-byte words, half of dense's.

Overflow: a float16 holds at most 65504. A gradient entry beyond it becomes inf at the cast, as in the hook, and
the update is then non-finite on every rank alike (the same bits everywhere); the trainer checks the update after
the exchange and skips the step on every rank (trainer.py), so nothing non-finite reaches the weights. bfloat16
has float32's range: it does not overflow where float32 does not. No state: nothing is carried between steps.
"""
from __future__ import annotations

import torch

from sparse_asr.compression.base import Compressor, Cost, StepStats
from sparse_asr.compression.wire import from_owners, owner_bounds, to_owners


class HalfAllreduce(Compressor):
    """The shared implementation; `dtype` is the half-precision type on the wire."""

    dtype: torch.dtype
    uses_density = False  # everything is sent, in half precision

    @staticmethod
    def cost(n: int, k: int, P: int, shapes=None, options=None) -> Cost:
        """Half-precision ring: rank r receives (P-1) halves of its chunk and the n - len_r others (2 bytes each)."""
        bounds = owner_bounds(n, P)
        words = [((P - 1) * (bounds[r + 1] - bounds[r]) + n - (bounds[r + 1] - bounds[r])) / 2 if P > 1 else 0.0
                 for r in range(P)]
        return Cost(min(words), max(words), sum(words) / P, 2 * (P - 1), "n(P-1)/P (2-byte halves)")

    def describe(self) -> str:
        return f"{self.name} allreduce (PyTorch's {self.name}_compress_hook arithmetic)"

    def step(self, flat_grad: torch.Tensor) -> StepStats:
        comm, n, P = self.comm, self.numel, self.comm.size
        bounds = owner_bounds(n, P)
        lengths = [bounds[j + 1] - bounds[j] for j in range(P)]
        with self.comm.measure() as moved:
            half = flat_grad.to(self.dtype).div_(P)  # the hook's order: cast, then divide in half precision
            bits = half.view(torch.int16)  # MPI moves the bits; it never adds them
            parts = [bits[bounds[j]:bounds[j + 1]] for j in range(P)]
            received = to_owners(comm, parts, [lengths[comm.rank]] * P)
            total = received[0].view(self.dtype).clone()
            for part in received[1:]:
                total += part.view(self.dtype)  # in rank order, each partial sum rounded to half
            owned = from_owners(comm, total.view(torch.int16), lengths)
            flat_grad.copy_(torch.cat(owned).view(self.dtype))
        return self.stats(moved, n, n, k=n)  # every entry, compressed: not a dense step


class BF16Allreduce(HalfAllreduce):
    name = "bf16"
    dtype = torch.bfloat16


class FP16Allreduce(HalfAllreduce):
    name = "fp16"
    dtype = torch.float16
