"""1-bit error-compensated allreduce (`onebit`): Seide et al., "1-Bit Stochastic Gradient Descent and its
Application to Data-Parallel Distributed Training of Speech DNNs" (Interspeech 2014), in the compressed allreduce
of Tang et al., "1-bit Adam" (ICML 2021): error compensation on the workers and on the servers.

C(x), for a chunk x: sign(x) times one scale, the chunk's mean absolute value ||x||_1 / len (the scale that makes
C(x) closest to x in L2 for these signs); sign(0) = +1 (-0.0 too): a sign is one bit, x >= 0. An empty chunk has
scale 0. The vector is cut into P chunks, chunk j owned by rank j (compression/wire.py). One step on every rank r:
  1. acc = gradient + worker error; each chunk of acc compressed: c = C(acc) chunk by chunk;
     worker error = acc - c;
  2. chunk j of c (its bits packed 8 to a byte, and its float32 scale) sent to rank j;
  3. rank r, owner of chunk r: m = (sum over ranks q, in rank order, of c_q's chunk r) / P; a = m + server error;
     u = C(a); server error = a - u;
  4. u (packed bits + scale) allgathered; every rank decodes the same bits into the update (the same on every
     rank, bitwise).
Both errors are state (state_dict). What the ranks still owe the model, in units of the ranks' sum, is each rank's
worker error plus P times its server error on its chunk (`owed`): P * update + sum of owed after = sum of (gradient
+ owed before), exactly up to float rounding (tests/mpi/compressor_check.py checks it).

Volume per rank: its chunk's bits from each of the P-1 others and the other owners' bits back, about 2n(P-1)/P
bits, plus 2(P-1) scales: 1/32 of dense's (`cost`, exactly from the chunk lengths). No size exchange.
"""
from __future__ import annotations

import torch

from sparse_asr.compression.base import Compressor, Cost, StepStats, Timer
from sparse_asr.compression.gtopk import pack_bits, unpack_bits
from sparse_asr.compression.memory import copy_checked
from sparse_asr.compression.wire import bytes_float, float_bytes, from_owners, owner_bounds, to_owners

SCALE_BYTES = 4  # a float32 scale travels with each chunk's bits


def message_bytes(length: int) -> int:
    """Bytes of one compressed chunk of `length` entries: its bits, packed, and its scale."""
    return (length + 7) // 8 + SCALE_BYTES


def compress(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(bits, scale): x >= 0 (sign(0) = +1) and the mean absolute value (0 for an empty chunk)."""
    scale = x.abs().mean() if x.numel() else torch.zeros((), dtype=x.dtype, device=x.device)
    return x >= 0, scale


def decompress(bits: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return torch.where(bits, scale, -scale)


def encode(bits: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return torch.cat([pack_bits(bits), float_bytes(scale)])


def decode(message: torch.Tensor, length: int) -> torch.Tensor:
    return decompress(unpack_bits(message[:-SCALE_BYTES], length), bytes_float(message[-SCALE_BYTES:]))


class OneBit(Compressor):
    name = "onebit"
    uses_density = False  # one bit per entry, whatever the density

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.bounds = owner_bounds(self.numel, self.comm.size)
        mine = self.bounds[self.comm.rank + 1] - self.bounds[self.comm.rank]
        self.worker_error = torch.zeros(self.numel, dtype=torch.float32, device=self.device)
        self.server_error = torch.zeros(mine, dtype=torch.float32, device=self.device)  # on this rank's chunk

    @staticmethod
    def cost(n: int, k: int, P: int, shapes=None, options=None) -> Cost:
        """Rank r receives its chunk from the P-1 others and every other owner's chunk: sum over q != r of
        message(len_r) + message(len_q) bytes, a message being ceil(len / 8) + 4 bytes."""
        bounds = owner_bounds(n, P)
        sizes = [message_bytes(bounds[j + 1] - bounds[j]) for j in range(P)]
        words = [((P - 1) * sizes[r] + sum(sizes) - sizes[r]) / 4 for r in range(P)]
        return Cost(min(words), max(words), sum(words) / P, 2 * (P - 1), "2n(P-1)/P bits + 2(P-1) scales")

    def describe(self) -> str:
        return "1-bit allreduce with worker and server error feedback"

    @property
    def owed(self) -> torch.Tensor:
        """What this rank still owes the model, in units of the ranks' sum: its worker error plus P times its server
        error on its chunk (module docstring)."""
        owed = self.worker_error.clone()
        lo, hi = self.bounds[self.comm.rank], self.bounds[self.comm.rank + 1]
        owed[lo:hi] += self.comm.size * self.server_error
        return owed

    def step(self, flat_grad: torch.Tensor) -> StepStats:
        comm, P, rank, bounds = self.comm, self.comm.size, self.comm.rank, self.bounds
        lengths = [bounds[j + 1] - bounds[j] for j in range(P)]
        with comm.measure() as moved:
            with Timer() as t_worker:
                acc = self.worker_error.add_(flat_grad)  # acc lives in the worker error's buffer
                messages = []
                for j in range(P):
                    bits, scale = compress(acc[bounds[j]:bounds[j + 1]])
                    acc[bounds[j]:bounds[j + 1]] -= decompress(bits, scale)  # now the worker error
                    messages.append(encode(bits, scale))
            received = to_owners(comm, messages, [message_bytes(lengths[rank])] * P)
            with Timer() as t_server:
                mean = decode(received[0], lengths[rank])
                for message in received[1:]:
                    mean += decode(message, lengths[rank])  # in rank order
                averaged = self.server_error.add_(mean / P)  # a = m + server error, in its buffer
                bits, scale = compress(averaged)
                averaged -= decompress(bits, scale)  # now the server error
            owned = from_owners(comm, encode(bits, scale), [message_bytes(length) for length in lengths])
            flat_grad.copy_(torch.cat([decode(message, length) for message, length in zip(owned, lengths)]))
        extra = {"worker_error_norm": float(torch.linalg.vector_norm(self.worker_error)),
                 "server_error_norm": float(torch.linalg.vector_norm(self.server_error))}
        return self.stats(moved, self.numel, self.numel, t_worker.seconds + t_server.seconds, k=self.numel,
                          extra=extra)

    def state_dict(self) -> dict:
        return {"worker_error": self.worker_error.detach().cpu().clone(),
                "server_error": self.server_error.detach().cpu().clone()}

    def load_state_dict(self, state: dict) -> None:
        copy_checked(self.worker_error, state["worker_error"], f"{self.name} worker_error")
        copy_checked(self.server_error, state["server_error"], f"{self.name} server_error")
