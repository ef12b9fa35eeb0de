"""Selection helpers shared by the sparse algorithms: exact top-k and threshold selection.

Exact thresholds (the k-th largest |x|) are found by *sample and refine*: a threshold estimated
from a deterministic sample is set a little low, one compare + nonzero pass over x keeps ~1.1k
candidates, and the exact k-th largest is found among those. The result never depends on the
sample (a bad sample only costs a retry). It is ~5x faster than torch.topk on CPU for the
27.6M-parameter model (see bench/selection.py), and its pass over x is the same compare +
nonzero that the threshold-reuse steps of Ok-Topk do anyway.

`kth_largest_magnitude_radix` is the exact method for values spread over several ranks: a radix
select on the float bit patterns where each round's 256-bin histogram can be summed over ranks.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

SAMPLE_SIZE = 65536  # positions sampled to estimate the threshold (cheap next to one pass over n)
SAMPLE_SIGMAS = 4.0  # how far (in binomial standard deviations) the estimate is set below the target
GOLDEN = 0.6180339887498949  # frac(i * GOLDEN) spreads positions evenly with no period to alias with


def topk_indices(x: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k entries of largest magnitude (exact; order unspecified)."""
    k = min(k, x.numel())
    return torch.topk(x.abs(), k, sorted=False).indices


def threshold_indices(x: torch.Tensor, threshold: float) -> torch.Tensor:
    """Indices (sorted ascending) of the entries with |x| >= threshold."""
    return torch.nonzero(x.abs() >= threshold, as_tuple=False).flatten()


def sample_positions(n: int, size: int, device) -> torch.Tensor:
    """`size` deterministic, evenly spread positions in [0, n) (a golden-ratio sequence)."""
    i = torch.arange(size, dtype=torch.float64, device=device)
    return ((i * GOLDEN) % 1.0 * n).long().clamp_(max=n - 1)


def topk_threshold_select(x: torch.Tensor, k: int, sample_size: int = SAMPLE_SIZE) -> tuple[torch.Tensor, float]:
    """Exact top-k by threshold: (indices sorted ascending, t) where t is the k-th largest |x| and
    the indices are every entry with |x| >= t (k of them unless there are ties at t)."""
    n = x.numel()
    if not 0 < k:
        raise ValueError(f"k must be positive, got {k}")
    mag = x.abs()
    if k >= n:
        return torch.arange(n, device=x.device), float(mag.min()) if n else 0.0
    s = min(n, sample_size)
    sample = mag[sample_positions(n, s, x.device)]
    expected = s * k / n  # sample entries expected at or above the true threshold
    rank = int(math.ceil(expected + SAMPLE_SIGMAS * math.sqrt(expected) + 1))
    while True:
        if rank >= s:  # the sample cannot bound it from below: every entry is a candidate
            candidates = torch.arange(n, device=x.device)
            break
        low = torch.kthvalue(sample, s - rank + 1).values  # the rank-th largest sampled |x|
        candidates = torch.nonzero(mag >= low, as_tuple=False).flatten()
        if candidates.numel() >= k:
            break
        rank *= 2  # unlucky sample: set the estimate lower and try again
    cand_mag = mag[candidates]
    t = torch.kthvalue(cand_mag, cand_mag.numel() - k + 1).values
    return candidates[cand_mag >= t], float(t)


def kth_largest_magnitude(x: torch.Tensor, k: int) -> float:
    """The k-th largest |x| (exact; equals torch.topk(x.abs(), k).values[-1])."""
    return topk_threshold_select(x, k)[1]


# Radix select over the bit patterns of |x| (non-negative float32 order like their int32 bits):
# 31 bits in rounds of 8, 8, 8, 7, each round narrowing the bit prefix of the k-th largest.
RADIX_ROUNDS = ((23, 8), (15, 8), (7, 8), (0, 7))  # (shift, width)


def kth_largest_magnitude_radix(
    x: torch.Tensor,
    k: int,
    sum_counts: Callable[[torch.Tensor], torch.Tensor] | None = None,
    count_dtype: torch.dtype = torch.int64,
) -> float:
    """The k-th largest |x| over the union of every rank's `x`, exactly, by radix select.

    `sum_counts(h)` must return the element-wise sum of the histogram `h` over all ranks (e.g. an
    allreduce); leave it None for one tensor. `count_dtype` (int64, or int32 when the total count
    is known to fit) is the histograms' type: it sets the bytes a distributed round moves. If there are fewer than k values in total,
    returns 0.0 (as if the union were padded with zeros, which is what the values outside a
    sparse support are)."""
    if x.dtype != torch.float32:
        raise TypeError(f"radix select needs float32, got {x.dtype}")
    bits = x.abs().contiguous().view(torch.int32)
    prefix = 0
    remaining = k
    for shift, width in RADIX_ROUNDS:
        digits = (bits >> shift) & ((1 << width) - 1)
        hist = torch.bincount(digits, minlength=1 << width).to(count_dtype)
        if sum_counts is not None:
            hist = sum_counts(hist)
        hist = hist.cpu()
        above = torch.cumsum(hist.flip(0), 0)  # above[j] = count in the j+1 highest bins
        if int(above[-1]) < remaining:
            return 0.0
        j = int(torch.searchsorted(above, remaining))  # first j with above[j] >= remaining
        digit = (1 << width) - 1 - j
        remaining -= int(above[j - 1]) if j > 0 else 0
        prefix = (prefix << width) | digit
        bits = bits[digits == digit]
    return float(torch.tensor([prefix], dtype=torch.int32).view(torch.float32))


def isin_sorted(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Boolean mask over `a`: which entries of `a` occur in `b`. Works for any order of either
    (b is sorted here; sorting an already sorted array is cheap), unlike merge-style intersections
    that silently assume sorted inputs."""
    if b.numel() == 0 or a.numel() == 0:
        return torch.zeros(a.shape, dtype=torch.bool, device=a.device)
    b_sorted = torch.sort(b).values
    pos = torch.searchsorted(b_sorted, a.to(b_sorted.dtype)).clamp_(max=b_sorted.numel() - 1)
    return b_sorted[pos] == a
