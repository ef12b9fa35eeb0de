"""QSGD (`qsgd`; Alistarh, Grubic, Li, Tomioka & Vojnovic, "QSGD: Communication-Efficient SGD via Gradient
Quantization and Encoding", NeurIPS 2017) with s levels and stochastic rounding, exchanged by allgather as GRACE's
QSGDCompressor is.

Bucketed, as the paper's experiments: the vector is cut into buckets of `bucket_size` entries (the last one
shorter), each with its own float32 norm ||v||_2 (computed in float64, then rounded: the same float32 wherever it
is computed). An entry v_i of a bucket with norm N becomes sign(v_i) * l_i with
    x = |v_i| * (s / N),  l_i = floor(x) + (1 if u_i < x - floor(x) else 0),
u_i uniform in [0, 1) from a generator seeded by (seed, rank, step) (compression/wire.py's step_generator: ranks
draw independently, a resume continues the same draws). E[l_i] = x, so the decoded value N / s * sign(v_i) * l_i is
unbiased; a bucket of zeros (N = 0) sends zeros. Whole-vector QSGD (one norm) is bucket_size >= n; its variance
grows as sqrt(n) / s, which for 27.6M entries would swamp the gradient.

On the wire: each entry's signed level in one int8 (s <= 127, the default: the largest s whose levels -s..s fit a
byte, GRACE's int8 case) or int16 (s up to 32767), plus the buckets' float32 norms. Every rank allgathers every
rank's levels and norms, decodes them and sums the P decoded vectors in rank order in float32, / P: the same bits
on every rank. No error feedback (it is unbiased) and no memory beyond the step count. Volume per rank: (P-1)
(n level bytes + 4 ceil(n / bucket_size) norm bytes): it grows with P, as an allgather does (`cost`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from sparse_asr.compression.base import Compressor, Cost, StepStats, Timer
from sparse_asr.compression.wire import step_generator
from sparse_asr.settings import positive, setting


@dataclass(frozen=True)
class QSGDOptions:
    levels: int = setting(127, lambda v: 1 <= v <= 32767, "must be in [1, 32767]")  # s
    bucket_size: int = setting(512, positive, "must be >= 1")  # entries sharing one norm (the paper's d)
    seed: int = setting(0, lambda v: 0 <= v < 2**32, "must be in [0, 2**32)")


def level_dtype(levels: int) -> torch.dtype:
    return torch.int8 if levels <= 127 else torch.int16


def draw_uniforms(numel: int, seed: int, rank: int, step: int, device="cpu") -> torch.Tensor:
    """The step's uniforms of one rank, from (seed, rank, step) alone."""
    return torch.rand(numel, generator=step_generator(torch.device(device), seed, rank, step), device=device)


def bucket_norms(v: torch.Tensor, bucket_size: int) -> torch.Tensor:
    """float32 norm of every bucket, summed in float64 (so the same float32 whatever the summation order)."""
    buckets = -(-v.numel() // bucket_size)
    padded = torch.zeros(buckets * bucket_size, dtype=torch.float64, device=v.device)
    padded[:v.numel()] = v
    return torch.linalg.vector_norm(padded.view(buckets, bucket_size), dim=1).to(torch.float32)


def per_entry(per_bucket: torch.Tensor, numel: int, bucket_size: int) -> torch.Tensor:
    return per_bucket.repeat_interleave(bucket_size)[:numel]


def quantize(v: torch.Tensor, uniforms: torch.Tensor, levels: int,
             bucket_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(signed levels, bucket norms) of v (module docstring)."""
    norms = bucket_norms(v, bucket_size)
    ratio = torch.full_like(norms, float(levels)).div_(torch.where(norms > 0, norms, 1.0))  # s / N: one division
    ratio[norms == 0] = 0.0
    x = v.abs() * per_entry(ratio, v.numel(), bucket_size)
    low = x.floor()
    # x can exceed s by an ulp (|v| = N times a rounded s / N): clamp, a bias of that ulp at most
    level = (low + (uniforms < x - low).to(x.dtype)).clamp_(max=levels)
    return torch.where(v < 0, -level, level).to(level_dtype(levels)), norms


def dequantize(signed_levels: torch.Tensor, norms: torch.Tensor, levels: int, bucket_size: int) -> torch.Tensor:
    step = per_entry(norms / levels, signed_levels.numel(), bucket_size)  # N / s, float32
    return signed_levels.to(torch.float32) * step


class QSGD(Compressor):
    name = "qsgd"
    Options = QSGDOptions
    uses_density = False  # every entry's level is sent

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.steps = 0  # the draws follow it (checkpointed)
        self.buckets = -(-self.numel // self.options.bucket_size)

    @staticmethod
    def cost(n: int, k: int, P: int, shapes=None, options: QSGDOptions | None = None) -> Cost:
        """Allgather: (P-1) x (n levels of 1 or 2 bytes + one float32 norm per bucket), from P-1 messages; it grows
        with P, where a ring allreduce's volume does not."""
        o = options if options is not None else QSGDOptions()
        level_bytes = torch.empty(0, dtype=level_dtype(o.levels)).element_size()
        words = (P - 1) * (n * level_bytes + 4 * math.ceil(n / o.bucket_size)) / 4
        return Cost(words, words, words, P - 1,
                    f"(P-1)(n/{4 // level_bytes} + n/{o.bucket_size}) (allgather of levels and norms)")

    def describe(self) -> str:
        o = self.options
        return f"QSGD, {o.levels} levels, buckets of {o.bucket_size}, allgather"

    def step(self, flat_grad: torch.Tensor) -> StepStats:
        comm, o, n, P = self.comm, self.options, self.numel, self.comm.size
        with comm.measure() as moved:
            with Timer() as t:
                uniforms = draw_uniforms(n, o.seed, comm.rank, self.steps, flat_grad.device)
                signed_levels, norms = quantize(flat_grad, uniforms, o.levels, o.bucket_size)
                message = torch.cat([signed_levels.view(torch.uint8), norms.view(torch.uint8)])
            gathered, _ = comm.allgatherv(message, counts=[message.numel()] * P)
            level_bytes = n * signed_levels.element_size()
            flat_grad.zero_()
            for part in gathered.view(P, -1):  # in rank order
                norms = part[level_bytes:].clone().view(torch.float32)  # a copy: its offset may not be aligned
                flat_grad += dequantize(part[:level_bytes].view(signed_levels.dtype), norms, o.levels, o.bucket_size)
            flat_grad /= P
        self.steps += 1
        return self.stats(moved, n, n, t.seconds, k=n)

    def state_dict(self) -> dict:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.steps = int(state["steps"])
