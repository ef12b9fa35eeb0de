"""Selection helpers shared by the sparse algorithms: exact top-k and threshold selection.

Exact thresholds (the k-th largest |x|) are found by whatever is fastest on the tensor's device
(`topk_threshold_select`, measured in docs/results/selection.md and the GPU suite's table):
  - CPU: *sample and refine*: a threshold estimated from a deterministic sample is set a little
    low, one compare + nonzero pass over x keeps ~1.1k candidates, and the exact k-th largest is
    found among those. The result never depends on the sample (a bad sample only costs a retry).
    Its pass over x is the same scan that the threshold-reuse steps of Ok-Topk do anyway;
  - CUDA: torch.topk, then one compare + nonzero for every entry at or above its k-th value.
Both give the same threshold and the same (sorted) indices; either can be called on any device.
`topk_indices` (exactly k entries, ties cut by index) is the baselines' local top-k on top of it.

`threshold_indices` (every |x| >= t, sorted) scans a float32 CPU tensor with compression.kernels (one pass,
no temporaries) where numba is installed, else in cache-sized chunks with numpy, whose nonzero is several
times faster than torch's on one thread; other devices use torch (the reference).

`kth_largest_magnitude_radix` is the exact method for values spread over several ranks: a radix
select on the float bit patterns where each round's histogram can be summed over ranks.
"""
from __future__ import annotations

import math
import threading
from typing import Callable

import numpy as np
import torch

from sparse_asr.compression import kernels

SAMPLE_SIZE = 65536  # positions sampled to estimate the threshold (cheap next to one pass over n)
SAMPLE_SIGMAS = 4.0  # how far (in binomial standard deviations) the estimate is set below the target
GOLDEN = 0.6180339887498949  # frac(i * GOLDEN) spreads positions evenly with no period to alias with
SCAN_CHUNK = 1 << 16  # entries per step of the CPU threshold scan: |x| and the mask stay in cache


def topk_indices(x: torch.Tensor, k: int) -> torch.Tensor:
    """Indices (int64, ascending) of exactly min(k, n) entries of largest magnitude, by the fastest
    exact method on x's device (topk_threshold_select). Ties at the k-th value keep the lowest
    indices, so every rank knows the count (TopkA's allgather needs no size exchange)."""
    k = min(k, x.numel())
    if k == 0:
        return torch.zeros(0, dtype=torch.int64, device=x.device)
    indices, t = topk_threshold_select(x, k)
    if indices.numel() > k:  # ties at t: every entry above it, then the first of those equal to it
        at_t = x[indices].abs() == t
        above = indices[~at_t]
        indices = torch.cat([above, indices[at_t][: k - above.numel()]]).sort().values
    return indices


def threshold_indices(x: torch.Tensor, threshold: float) -> torch.Tensor:
    """Indices (int64, sorted ascending) of the entries with |x| >= threshold."""
    if _kernel_scan(x):
        return threshold_scan_kernel(x, threshold)[0]
    if _numpy_scan(x):
        return threshold_scan_cpu(x, threshold, with_values=False)[0]
    return threshold_indices_torch(x, threshold)


def threshold_select(x: torch.Tensor, threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(threshold_indices(x, threshold), x at them). On CPU the values are picked up during the
    scan, while each chunk is in cache: a separate gather over a large x misses it per entry."""
    if _kernel_scan(x):
        return threshold_scan_kernel(x, threshold)
    if _numpy_scan(x):
        return threshold_scan_cpu(x, threshold, with_values=True)
    idx = threshold_indices_torch(x, threshold)
    return idx, x[idx]


def _kernel_scan(x: torch.Tensor) -> bool:
    return kernels.available(x) and x.dtype == torch.float32


_scratch = threading.local()  # each thread's records for threshold_scan_kernel, kept between calls


def threshold_scan_kernel(x: torch.Tensor, threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """threshold_select by compression.kernels.select (a float32 CPU tensor): the records land in a kept
    buffer, and the k-sized results are copied out of it (int64 indices, as the other paths give)."""
    out = getattr(_scratch, "pairs", None)
    if out is None:
        out = _scratch.pairs = kernels.PairBuffer()
    idx, vals = out.columns(kernels.select(x.detach(), threshold, out))
    return idx.long(), vals.clone()


def count_at_least(x: torch.Tensor, threshold: float) -> int:
    """int((x.abs() >= threshold).sum()), on CPU without the temporaries."""
    if _kernel_scan(x):
        return kernels.count_at_least(x, threshold)
    return int((x.abs() >= threshold).sum())


def _numpy_scan(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and x.dim() == 1


def threshold_indices_torch(x: torch.Tensor, threshold: float) -> torch.Tensor:
    """threshold_indices in torch ops (any device; on CUDA the nonzero is one host sync)."""
    return torch.nonzero(x.abs() >= threshold, as_tuple=False).flatten()


def threshold_scan_cpu(x: torch.Tensor, threshold: float,
                       with_values: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """threshold_select for a 1-D CPU tensor: numpy over chunks, so |x| and the mask are never
    materialised at full size (a python float threshold compares in x's precision, as in torch).
    Returns (indices, values or None)."""
    a = x.detach().contiguous().numpy()
    size = min(a.size, SCAN_CHUNK)
    mag, keep = np.empty(size, dtype=a.dtype), np.empty(size, dtype=bool)
    indices, values = [np.zeros(0, dtype=np.int64)], [a[:0]]
    for start in range(0, a.size, SCAN_CHUNK):
        chunk = a[start : start + SCAN_CHUNK]
        m = keep[: chunk.size]
        np.greater_equal(np.abs(chunk, out=mag[: chunk.size]), threshold, out=m)
        hits = np.flatnonzero(m)
        indices.append(hits + start)
        if with_values:
            values.append(chunk[hits])
    idx = torch.from_numpy(np.concatenate(indices).astype(np.int64, copy=False))
    return idx, torch.from_numpy(np.concatenate(values)) if with_values else None


def sample_positions(n: int, size: int, device) -> torch.Tensor:
    """`size` deterministic, evenly spread positions in [0, n) (a golden-ratio sequence)."""
    i = torch.arange(size, dtype=torch.float64, device=device)
    return ((i * GOLDEN) % 1.0 * n).long().clamp_(max=n - 1)


def topk_threshold_select(x: torch.Tensor, k: int, sample_size: int = SAMPLE_SIZE) -> tuple[torch.Tensor, float]:
    """Exact top-k by threshold: (indices sorted ascending, t) where t is the k-th largest |x| and
    the indices are every entry with |x| >= t (k of them unless there are ties at t). The method
    is the fastest on x's device: torch.topk on CUDA, sample and refine elsewhere."""
    if x.is_cuda:
        return select_by_topk(x, k)
    return select_by_sample(x, k, sample_size)


def _all_if_k_covers(x: torch.Tensor, k: int):
    if not 0 < k:
        raise ValueError(f"k must be positive, got {k}")
    n = x.numel()
    if k >= n:
        return torch.arange(n, device=x.device), float(x.abs().min()) if n else 0.0
    return None


def select_by_topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, float]:
    """topk_threshold_select by torch.topk (the fastest exact method on a GPU)."""
    everything = _all_if_k_covers(x, k)
    if everything is not None:
        return everything
    mag = x.abs()
    t = torch.topk(mag, k, sorted=False).values.min()
    return torch.nonzero(mag >= t, as_tuple=False).flatten(), float(t)


def select_by_sample(x: torch.Tensor, k: int, sample_size: int = SAMPLE_SIZE) -> tuple[torch.Tensor, float]:
    """topk_threshold_select by sample and refine (the fastest exact method on a CPU)."""
    everything = _all_if_k_covers(x, k)
    if everything is not None:
        return everything
    n = x.numel()
    s = min(n, sample_size)
    sample = x[sample_positions(n, s, x.device)].abs()
    expected = s * k / n  # sample entries expected at or above the true threshold
    rank = int(math.ceil(expected + SAMPLE_SIGMAS * math.sqrt(expected) + 1))
    while True:
        if rank >= s:  # the sample cannot bound it from below: every entry is a candidate
            candidates, cand_vals = torch.arange(n, device=x.device), x
            break
        low = float(torch.kthvalue(sample, s - rank + 1).values)  # the rank-th largest sampled |x|
        candidates, cand_vals = threshold_select(x, low)
        if candidates.numel() >= k:
            break
        rank *= 2  # unlucky sample: set the estimate lower and try again
    cand_mag = cand_vals.abs()
    t = torch.kthvalue(cand_mag, cand_mag.numel() - k + 1).values
    return candidates[cand_mag >= t], float(t)


def kth_largest_magnitude(x: torch.Tensor, k: int) -> float:
    """The k-th largest |x| (exact; equals torch.topk(x.abs(), k).values[-1])."""
    return topk_threshold_select(x, k)[1]


FLOAT_BITS = 31  # non-negative float32 values order like their int32 bit patterns, in [0, 2^31)
OCTAVE = 1 << 23  # a factor of 2 in value is 2^23 in bit pattern (one step of the exponent)


def kth_largest_magnitude_radix(
    x: torch.Tensor,
    k: int,
    sum_counts: Callable[[torch.Tensor], torch.Tensor] | None = None,
    count_dtype: torch.dtype = torch.int64,
    near: float | None = None,
    max_bins: int = 256,
) -> float:
    """The k-th largest |x| over the union of every rank's `x`, exactly, by radix select.

    Each round cuts the interval of bit patterns known to hold the answer into at most `max_bins`
    (a power of two) equal bins, counts the values in each and keeps the bin holding the k-th
    largest: 31 bits take 4 rounds of 256 bins, 3 of 4096. `near`, a guess of the answer (e.g. the
    threshold reused so far), makes the first round count only [near/2, 2 near), 24 bits, plus
    one bin for everything above it: 2 rounds of 4096 bins; a wrong guess costs one or two more.

    `sum_counts(h)` must return the element-wise sum of the histogram `h` over all ranks (e.g. an
    allreduce); leave it None for one tensor. Every rank takes the same decisions from the summed
    counts, so all must pass the same `k`, `near` and `max_bins`. `count_dtype` (int64, or int32
    when the total count is known to fit) sets the bytes a distributed round moves. If there are
    fewer than k values in total, returns 0.0 (as if the union were padded with zeros, which is
    what the values outside a sparse support are)."""
    if x.dtype != torch.float32:
        raise TypeError(f"radix select needs float32, got {x.dtype}")
    if max_bins < 2 or max_bins & (max_bins - 1):
        raise ValueError(f"max_bins must be a power of two >= 2, got {max_bins}")
    bin_bits = max_bins.bit_length() - 1
    bits = x.abs().contiguous().view(torch.int32).long()  # int64: the bounds reach 2^31
    lo, hi = 0, 1 << FLOAT_BITS  # the answer's bit pattern lies in [lo, hi)
    above = 0  # values (over all ranks) with a pattern >= hi
    if near is not None and near > 0:
        center = int(torch.tensor([near], dtype=torch.float32).view(torch.int32))
        window = (max(0, center - OCTAVE), min(1 << FLOAT_BITS, center + OCTAVE))
    else:
        window = None
    while True:
        r_lo, r_hi = window or (lo, hi)
        shift = max(0, (r_hi - r_lo - 1).bit_length() - bin_bits)
        nbins = ((r_hi - r_lo - 1) >> shift) + 1
        inside = bits[(bits >= r_lo) & (bits < r_hi)]
        digits = (inside - r_lo) >> shift
        hist = torch.bincount(digits, minlength=nbins)
        if window is not None:  # one more bin: every value above the window
            hist = torch.cat([hist, (bits >= r_hi).sum().view(1)])
        hist = hist.to(count_dtype)
        if sum_counts is not None:
            hist = sum_counts(hist)
        hist = hist.cpu()
        if window is not None:
            window = None
            over, in_window = int(hist[-1]), int(hist[:-1].sum())
            if over >= k:  # the guess was too low: the answer is above the window
                lo, bits = r_hi, bits[bits >= r_hi]
                continue
            if over + in_window < k:  # too high: below it
                hi, above, bits = r_lo, over + in_window, bits[bits < r_lo]
                continue
            above, hist = over, hist[:-1]
        from_top = torch.cumsum(hist.flip(0), 0)  # from_top[j] = count in the j+1 highest bins
        if int(from_top[-1]) < k - above:
            return 0.0
        j = int(torch.searchsorted(from_top, k - above))  # first j with above + from_top[j] >= k
        digit = nbins - 1 - j
        above += int(from_top[j - 1]) if j > 0 else 0
        lo = r_lo + (digit << shift)
        if shift == 0:
            return float(torch.tensor([lo], dtype=torch.int32).view(torch.float32))
        hi = min(r_hi, lo + (1 << shift))
        bits = inside[digits == digit]


def intersect_unique(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The entries of `a` that also occur in `b` (sorted, a's dtype), for `a` and `b` each without
    repeats, in any order (merge-style intersections that assume sorted inputs are how the
    original Ok-Topk left residuals uncleared). Sorted inputs are merely faster: on CPU one linear walk
    (compression.kernels), else one sort, numpy's timsort, which merges two sorted runs in linear time."""
    if a.numel() == 0 or b.numel() == 0:
        return a[:0]
    if kernels.available(a, b):
        common = kernels.intersect_sorted(a, b)  # one linear walk when both are strictly increasing
        if common is not None:
            return common
    if a.device.type == "cpu":
        both = np.concatenate([a.numpy(), b.numpy().astype(a.numpy().dtype, copy=False)])
        both.sort(kind="stable")
        return torch.from_numpy(both[:-1][both[1:] == both[:-1]])
    return intersect_unique_torch(a, b)


def intersect_unique_torch(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """intersect_unique in torch ops (any device)."""
    if a.numel() == 0 or b.numel() == 0:
        return a[:0]
    both = torch.sort(torch.cat([a, b.to(a.dtype)])).values
    return both[:-1][both[1:] == both[:-1]]
