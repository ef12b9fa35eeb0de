"""Gaussiank: threshold selection from a Gaussian fit of acc, allgatherv (DESIGN 4).

Selection rule (per rank, no state across steps):
  mean, std = mean and population std of acc;
  z = the standard normal quantile with two-sided tail `density`: P(|X| >= z) = density;
  select the entries with |acc - mean| >= t, starting from t = z * std.
Real gradients have heavier tails than a Gaussian, so the first count is often off. When the
count c is outside [k / tolerance, k * tolerance] (default [k/2, 2k]) the threshold is corrected,
at most `max_adjust` times (default 4): a count too high makes t a lower bound, too low an upper
bound; the next t doubles the lower bound or halves the upper bound while only one side is known,
and is the geometric mean of the two once both are. The last threshold tried is used, in range
or not.
Then an allgatherv of every rank's pairs (sizes vary, so they are exchanged first as 'meta'),
scatter-add; every local selection is applied. Volume ~2k(P-1) words, like TopkA.
"""
import math
from dataclasses import dataclass
from statistics import NormalDist

import torch

from sparse_asr.compression import kernels
from sparse_asr.compression.base import Cost, SparseUpdate, SparseCompressor, Timer, pack_pairs, sum_pairs, unpack_pairs
from sparse_asr.settings import natural, setting


@dataclass(frozen=True)
class GaussiankOptions:
    # a count in [k / tolerance, k * tolerance] is accepted
    tolerance: float = setting(2.0, lambda v: v >= 1, "must be >= 1")
    max_adjust: int = setting(4, natural, "must be >= 0")  # threshold corrections at most per step


class Gaussiank(SparseCompressor):
    name = "gaussiank"
    Options = GaussiankOptions

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.tolerance = self.options.tolerance
        self.max_adjust = self.options.max_adjust
        self.set_density(self.density)

    def set_density(self, density: float) -> None:
        super().set_density(density)
        self.z = NormalDist().inv_cdf(1.0 - self.density / 2.0) if self.density < 1.0 else 0.0

    @staticmethod
    def cost(n: int, k: int, P: int, shapes=None, options=None) -> Cost:
        words = 2 * k * (P - 1)  # ~k pairs from every rank, after a count exchange
        return Cost(words, words, words, 2 * (P - 1), "2k(P-1)")

    def select(self, acc: torch.Tensor) -> tuple[torch.Tensor, float, int]:
        """(selected indices ascending, final threshold, corrections made)."""
        std, mean = torch.std_mean(acc, correction=0)
        if kernels.available(acc) and acc.dtype == torch.float32:  # each count one read of acc, no temporaries
            def count(t):
                return kernels.count_deviation(acc, mean, t)

            def chosen(t):
                return kernels.select_deviation(acc, mean, t)
        else:
            deviation = (acc - mean).abs()

            def count(t):
                return int((deviation >= t).sum().item())

            def chosen(t):
                return torch.nonzero(deviation >= t).flatten()
        t = self.z * std.item()
        lower, upper = 0.0, math.inf  # t bounds known so far (count too high at lower, too low at upper)
        for adjust in range(self.max_adjust + 1):
            selected = count(t)
            if self.k / self.tolerance <= selected <= self.k * self.tolerance or adjust == self.max_adjust:
                break
            if selected > self.k * self.tolerance:
                lower = t
            else:
                upper = t
            if upper == math.inf:
                t = 2.0 * lower if lower > 0 else 1e-30
            elif lower == 0.0:
                t = upper / 2.0
            else:
                t = math.sqrt(lower * upper)
        return chosen(t), t, adjust

    def exchange(self, acc: torch.Tensor) -> SparseUpdate:
        with Timer() as timer:
            local, threshold, adjusts = self.select(acc)
            send = pack_pairs(local.to(self.index_dtype), acc[local])
        received, _ = self.comm.allgatherv(send)
        indices, values = sum_pairs(*unpack_pairs(received, self.index_dtype), numel=self.numel)
        return SparseUpdate(
            indices,
            values,
            applied=local,
            selected_local=local.numel(),
            seconds_select=timer.seconds,
            extra={"threshold": threshold, "threshold_adjustments": float(adjusts)},
        )
