"""CPU kernels of the sparse exchanges: the loops torch cannot fuse, compiled by numba (DESIGN 4).

A step of a sparse exchange touches all n entries once or twice and k entries a few times. In torch ops each
of `residual += grad`, the threshold scan and zeroing the gradient is its own pass over memory, and every
temporary of n entries (a mask, |x|) is a fresh mapping (glibc maps anything over 32 MB anew: ~27k page faults
per 110 MB). Here one loop does what several passes did:
  accumulate_select  residual += grad, grad = 0, and the entries with |residual| >= t, in one pass over n;
  select             the entries with |x| >= t (one read-only pass), straight into (index, value) records;
  merge_runs         the P sorted runs an owner receives, summed by index in one linear merge (no sort);
  intersect_sorted   the entries common to two sorted index lists, in one linear walk;
  scatter_scaled / clear   out[idx] = values / P, x[idx] = 0 without index copies.
Selections are written as 8-byte (int32 index, float32 value) records (PairBuffer), the wire format of
base.pack_pairs, so what a scan finds is sent as it is.

Every kernel computes exactly what its torch reference computes, bit for bit: float32 adds in the same order,
a float32 division, comparisons against the threshold rounded to float32 first (as torch and numpy compare a
Python float with a float32 tensor). tests/test_kernels.py checks each against its reference.

numba is optional: without it (a GPU image need not have it) or with SPARSE_ASR_KERNELS=0, and for tensors
that are not on the CPU, callers use the torch reference (`available` says which).
"""
from __future__ import annotations

import os

import numpy as np
import torch

try:
    if os.environ.get("SPARSE_ASR_KERNELS", "1") == "0":
        raise ImportError("SPARSE_ASR_KERNELS=0")  # not even imported (numba's import takes a second or two)
    import numba
    from numba.cpython.unsafe.numbers import trailing_zeros
except ImportError:  # the torch reference runs instead
    numba = None

    def trailing_zeros(bits):  # the plain-Python stand-in (tests run the loops uncompiled too)
        return (int(bits) & -int(bits)).bit_length() - 1

ENABLED = numba is not None


def jit(fn):
    """Compiled on first use (and cached on disk) when numba is there; the plain function otherwise, which no
    caller reaches unless ENABLED (the tests run it directly to check the loops without a compiler)."""
    if numba is None:
        return fn
    return numba.njit(cache=True, nogil=True, boundscheck=False)(fn)


def available(*tensors: torch.Tensor) -> bool:
    """True when the kernels may run on these tensors: numba is there and enabled, and all are 1-D CPU tensors."""
    return ENABLED and all(t.device.type == "cpu" and t.dim() == 1 for t in tensors)


def float32_threshold(t: float) -> float:
    """t rounded to float32 (as a Python float): comparing a float32 with it in double precision is comparing
    in float32, as torch does with a Python threshold (beyond the float32 range: +-inf)."""
    return float(torch.tensor(t, dtype=torch.float32))


# ---------------------------------------------------------------------------------------------- records
class PairBuffer:
    """(int32 index, float32 value) records, 8 bytes each, kept from step to step and grown when a selection
    does not fit (never shrunk): selecting into it allocates nothing in the steady state."""

    def __init__(self, capacity: int = 0):
        self._allocate(capacity)

    @property
    def capacity(self) -> int:
        return self.raw.numel()

    def reserve(self, capacity: int) -> None:
        """At least `capacity` records (the contents are not kept)."""
        if capacity > self.capacity:
            self._allocate(max(capacity, 2 * self.capacity))

    def _allocate(self, capacity: int) -> None:
        self.raw = torch.empty(capacity, dtype=torch.int64)
        words = self.raw.view(torch.int32).numpy().reshape(-1, 2)
        self.index_words, self.value_words = words, words.view(np.float32)  # the same records, two types

    def columns(self, m: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first m records as (indices int32, values float32): strided views, no copy."""
        words = self.raw[:m].view(torch.int32).view(m, 2)
        return words[:, 0], words[:, 1].view(torch.float32)


def records_of(indices: torch.Tensor, values: torch.Tensor) -> torch.Tensor | None:
    """The uint8 bytes holding (indices, values) when they are the two columns of one record buffer (as
    PairBuffer.columns gives them), else None: such pairs are packed already."""
    if (indices.dtype != torch.int32 or values.dtype != torch.float32 or indices.device.type != "cpu"
            or values.device != indices.device or indices.numel() != values.numel()):
        return None
    m = indices.numel()
    if m == 0:
        return torch.empty(0, dtype=torch.uint8)
    if (indices.stride(0) != 2 or values.stride(0) != 2 or values.data_ptr() != indices.data_ptr() + 4
            or indices.untyped_storage().data_ptr() != values.untyped_storage().data_ptr()):
        return None
    flat = torch.empty(0, dtype=torch.uint8)
    return flat.set_(indices.untyped_storage(), indices.storage_offset() * 4, (8 * m,))


def record_columns(buf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The (int32 index, float32 value) columns of packed records in a uint8 buffer, as views (no copy), or None
    when the buffer does not start on a 4-byte boundary (an int32 view needs it)."""
    if buf.device.type != "cpu" or buf.numel() % 8 or (buf.data_ptr() % 4):
        return None
    words = buf.view(torch.int32).view(-1, 2)
    return words[:, 0], words[:, 1].view(torch.float32)


# ---------------------------------------------------------------------------------------------- scans
# The scans test 64 entries at a time into a bit mask (a loop the compiler vectorizes: one compare per 16
# floats with AVX-512) and visit only the set bits: a branch per entry ran at 2-4x one pass over memory.
BLOCK = 64


@jit
def _emit(bits, start, x, count, index_words, value_words):
    """Records of the entries start + j of x for the set bits j of `bits`, while they fit; the new count."""
    capacity = index_words.shape[0]
    while bits:
        i = start + trailing_zeros(bits)
        if count < capacity:
            index_words[count, 0] = i
            value_words[count, 1] = x[i]
        count += 1
        bits &= bits - np.uint64(1)
    return count


@jit
def _accumulate_select(residual, grad, t, index_words, value_words):
    """residual += grad; grad = 0; records of |residual| >= t while they fit. Returns the count (all of them)."""
    n = residual.shape[0]
    count = 0
    for start in range(0, n - n % BLOCK, BLOCK):
        bits = np.uint64(0)
        for j in range(BLOCK):
            a = residual[start + j] + grad[start + j]
            residual[start + j] = a
            grad[start + j] = 0.0
            if abs(a) >= t:
                bits |= np.uint64(1) << np.uint64(j)
        count = _emit(bits, start, residual, count, index_words, value_words)
    for i in range(n - n % BLOCK, n):  # the last, partial block
        a = residual[i] + grad[i]
        residual[i] = a
        grad[i] = 0.0
        if abs(a) >= t:
            count = _emit(np.uint64(1), i, residual, count, index_words, value_words)
    return count


@jit
def _select(x, t, index_words, value_words):
    n = x.shape[0]
    count = 0
    for start in range(0, n - n % BLOCK, BLOCK):
        bits = np.uint64(0)
        for j in range(BLOCK):
            if abs(x[start + j]) >= t:
                bits |= np.uint64(1) << np.uint64(j)
        count = _emit(bits, start, x, count, index_words, value_words)
    for i in range(n - n % BLOCK, n):
        if abs(x[i]) >= t:
            count = _emit(np.uint64(1), i, x, count, index_words, value_words)
    return count


@jit
def _select_pairs(indices, values, t, index_words, value_words):
    """Records of the pairs with |value| >= t, in order. May write into the buffer it reads (never ahead)."""
    count = 0
    for j in range(indices.shape[0]):
        v = values[j]
        if abs(v) >= t:
            i = indices[j]
            index_words[count, 0] = i
            value_words[count, 1] = v
            count += 1
    return count


@jit
def _count_at_least(values, t):
    count = 0
    for j in range(values.shape[0]):
        if abs(values[j]) >= t:
            count += 1
    return count


@jit
def _count_deviation(x, mean, t):
    count = 0
    for i in range(x.shape[0]):
        if abs(x[i] - mean) >= t:
            count += 1
    return count


@jit
def _select_deviation(x, mean, t, out):
    count = 0
    for i in range(x.shape[0]):
        if abs(x[i] - mean) >= t:
            out[count] = i
            count += 1
    return count


def accumulate_select(residual: torch.Tensor, grad: torch.Tensor, t: float, out: PairBuffer) -> int:
    """residual += grad, grad zeroed, and the records of |residual| >= t (ascending index) in out's first
    records, all in one pass over n; returns their count. Reference: `residual += grad; grad.zero_();
    threshold_select(residual, t)`. t = inf accumulates and zeroes only."""
    t = float32_threshold(t)
    count = _accumulate_select(residual.numpy(), grad.numpy(), np.float32(t), out.index_words, out.value_words)
    if count > out.capacity:  # did not fit: the accumulated residual is scanned again into a larger buffer
        return select(residual, t, out)
    return count


def select(x: torch.Tensor, t: float, out: PairBuffer) -> int:
    """The records of |x| >= t (ascending index; x float32) in out's first records; returns their count.
    Reference: threshold_select(x, t)."""
    t32 = np.float32(float32_threshold(t))
    a = x.detach().numpy()
    count = _select(a, t32, out.index_words, out.value_words)
    if count > out.capacity:
        out.reserve(count)
        count = _select(a, t32, out.index_words, out.value_words)
    return count


def select_pairs(indices: torch.Tensor, values: torch.Tensor, t: float, out: PairBuffer) -> int:
    """The records of the pairs with |value| >= t, in their order, in out's first records (which may be where
    the pairs are); returns their count. Reference: keep = threshold_indices(values, t); indices[keep],
    values[keep]."""
    out.reserve(indices.numel())
    return _select_pairs(indices.numpy(), values.numpy(), np.float32(float32_threshold(t)), out.index_words,
                         out.value_words)


def count_at_least(values: torch.Tensor, t: float) -> int:
    """int((values.abs() >= t).sum()) without the temporaries."""
    return int(_count_at_least(values.numpy(), np.float32(float32_threshold(t))))


def count_deviation(x: torch.Tensor, mean: torch.Tensor, t: float) -> int:
    """int(((x - mean).abs() >= t).sum()) for a float32 x and its 0-d float32 mean, without the temporaries."""
    return int(_count_deviation(x.numpy(), np.float32(mean.item()), np.float32(float32_threshold(t))))


def select_deviation(x: torch.Tensor, mean: torch.Tensor, t: float) -> torch.Tensor:
    """torch.nonzero((x - mean).abs() >= t).flatten() (int64), in one pass and one k-sized output."""
    t32, mean32 = np.float32(float32_threshold(t)), np.float32(mean.item())
    a = x.numpy()
    out = np.empty(_count_deviation(a, mean32, t32), dtype=np.int64)
    _select_deviation(a, mean32, t32, out)
    return torch.from_numpy(out)


# ---------------------------------------------------------------------------------------------- merges
@jit
def _run_starts(indices, limit):
    """Where each maximal non-decreasing run of `indices` starts, plus the end; None past `limit` runs."""
    m = indices.shape[0]
    starts = np.empty(limit + 1, dtype=np.int64)
    runs = 0
    for j in range(m):
        if j == 0 or indices[j] < indices[j - 1]:
            if runs == limit:
                return starts[:0]
            starts[runs] = j
            runs += 1
    starts[runs] = m
    return starts[: runs + 1]


@jit
def _take(key, v, sum_at, written, out_idx, out_val, compact):
    """Put pair (key, v) after the merged output so far (its sum at `sum_at`); returns (sum_at, written)."""
    if written > 0 and key == out_idx[written - 1]:
        out_val[sum_at] += v
        if not compact:
            out_idx[written] = key
            out_val[written] = 0.0
            written += 1
    else:
        out_idx[written] = key
        out_val[written] = np.float32(0.0) + v
        sum_at = written
        written += 1
    return sum_at, written


@jit
def _merge_two(a, av, b, bv, out_idx, out_val, compact):
    """_merge_runs for two runs: the smaller head is picked without a branch (ties: a's first)."""
    i = j = written = sum_at = 0
    na, nb = a.shape[0], b.shape[0]
    last = -1
    while i < na and j < nb:
        x, y, vx, vy = a[i], b[j], av[i], bv[j]  # all four loaded: the picks below compile to selects
        take_a = x <= y
        key = x if take_a else y
        v = vx if take_a else vy
        i += take_a
        j += 1 - take_a
        if key == last:  # a repeat (rare): its value joins the sum
            out_val[sum_at] += v
            if not compact:
                out_idx[written] = key
                out_val[written] = 0.0
                written += 1
        else:
            out_idx[written] = key
            out_val[written] = np.float32(0.0) + v
            sum_at = written
            written += 1
            last = key
    for q in range(i, na):
        sum_at, written = _take(a[q], av[q], sum_at, written, out_idx, out_val, compact)
    for q in range(j, nb):
        sum_at, written = _take(b[q], bv[q], sum_at, written, out_idx, out_val, compact)
    return written


@jit
def _merge_runs(first_idx, first_val, rest_idx, rest_val, starts, out_idx, out_val, compact):
    """Merge run 0 (first_*) and the runs rest_*[starts[j - 1]:starts[j]] (each non-decreasing) into index
    order; equal indices are taken in run order (a stable sort of the concatenation) and their values summed
    from 0.0 in that order. compact: one output per distinct index; else the sum sits at the first of the
    repeats and 0.0 at the others. Returns the outputs written."""
    runs = starts.shape[0]  # run 0 plus runs - 1 in rest
    if runs == 2:
        return _merge_two(first_idx, first_val, rest_idx[starts[0]:starts[1]], rest_val[starts[0]:starts[1]],
                          out_idx, out_val, compact)
    pos = np.empty(runs, dtype=np.int64)
    end = np.empty(runs, dtype=np.int64)
    pos[0], end[0] = 0, first_idx.shape[0]
    for j in range(1, runs):
        pos[j], end[j] = starts[j - 1], starts[j]
    written, sum_at = 0, 0
    while True:
        best, key = -1, 0
        for j in range(runs):  # the lowest run holding the smallest head (P is small)
            if pos[j] < end[j]:
                head = first_idx[pos[j]] if j == 0 else rest_idx[pos[j]]
                if best < 0 or head < key:
                    best, key = j, head
        if best < 0:
            return written
        v = first_val[pos[best]] if best == 0 else rest_val[pos[best]]
        pos[best] += 1
        sum_at, written = _take(key, v, sum_at, written, out_idx, out_val, compact)


def merge_runs(first: tuple[torch.Tensor, torch.Tensor], rest: tuple[torch.Tensor, torch.Tensor],
               run_lengths: list[int], out: tuple[torch.Tensor, torch.Tensor], compact: bool) -> int:
    """Sum sorted runs by index in one linear merge: run 0 is `first` (indices, values), the others lie one
    after another in `rest`, `run_lengths` long. Into `out` (indices, values; as long as all the pairs), returns
    how many were written. Equal indices are summed in run order; compact gives each index once (reference:
    base.sum_pairs), else every input keeps its place in the order and repeats hold 0.0 (reference:
    oktopk.sum_sorted_runs)."""
    starts = np.cumsum(np.asarray([0] + list(run_lengths), dtype=np.int64))
    return int(_merge_runs(first[0].numpy(), first[1].numpy(), rest[0].numpy(), rest[1].numpy(), starts,
                           out[0].numpy(), out[1].numpy(), compact))


def sum_runs(indices: torch.Tensor, values: torch.Tensor, max_runs: int = 64):
    """base.sum_pairs (distinct indices ascending, int64; their float32 sums in input order) by merging the
    input's sorted runs, or None when it has more than `max_runs` of them (sorting is then the faster way)."""
    idx = indices.numpy()
    starts = _run_starts(idx, max_runs)
    if starts.shape[0] == 0 and idx.shape[0] > 0:
        return None
    out_idx, out_val = torch.empty(idx.shape[0], dtype=torch.int64), torch.empty(idx.shape[0], dtype=torch.float32)
    vals = values.to(torch.float32)
    m = int(_merge_runs(idx[:0], vals.numpy()[:0], idx, vals.numpy(), starts, out_idx.numpy(), out_val.numpy(), True))
    return out_idx[:m], out_val[:m]


@jit
def _increasing(a, start):
    bad = False
    for q in range(start + 1, a.shape[0]):
        bad |= a[q] <= a[q - 1]
    return not bad


@jit
def _intersect_sorted(a, b, out):
    """The entries of a also in b, both strictly increasing; -1 if either is not. Branch-free steps: which
    side advances is data, not a jump the processor mispredicts half the time; each step past an entry checks
    that the next one is larger, and what the walk did not reach is checked after it."""
    i = j = count = 0
    na, nb = a.shape[0], b.shape[0]
    bad = False
    while i < na and j < nb:
        x, y = a[i], b[j]
        next_x, next_y = a[min(i + 1, na - 1)], b[min(j + 1, nb - 1)]
        out[count] = x
        count += x == y
        step_a, step_b = x <= y, y <= x
        bad |= step_a & (i + 1 < na) & (next_x <= x)
        bad |= step_b & (j + 1 < nb) & (next_y <= y)
        i += step_a
        j += step_b
    if bad or not (_increasing(a, i) and _increasing(b, j)):
        return -1
    return count


def intersect_sorted(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor | None:
    """selection.intersect_unique(a, b) by one linear walk when both are strictly increasing (a's dtype, a
    fresh k-sized tensor), None when one is not."""
    out = torch.empty(a.numel(), dtype=a.dtype)
    count = _intersect_sorted(a.numpy(), b.numpy(), out.numpy())
    return None if count < 0 else out[:count]


# ---------------------------------------------------------------------------------------------- scatter
@jit
def _scatter_scaled(out, indices, values, divisor):
    for j in range(indices.shape[0]):
        out[indices[j]] = values[j] / divisor


@jit
def _clear(x, indices):
    for j in range(indices.shape[0]):
        x[indices[j]] = 0.0


def scatter_scaled(out: torch.Tensor, indices: torch.Tensor, values: torch.Tensor, divisor: int) -> None:
    """out[indices] = values / divisor (float32 division, as torch's), indices distinct, any integer type."""
    _scatter_scaled(out.numpy(), indices.numpy(), values.to(torch.float32).numpy(), np.float32(divisor))


def clear(x: torch.Tensor, indices: torch.Tensor) -> None:
    """x[indices] = 0 without converting the indices."""
    _clear(x.numpy(), indices.numpy())
