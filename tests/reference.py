"""Numpy references for the communicator and the sparse algorithms, written independently of the
torch code they check (other data structures, float64 sums, closed forms).

Every reference takes ALL ranks' accumulated gradients `accs` (list of float32 arrays, rank order)
and returns what the compressors must produce: the global update SUM (float64, length n, not yet
divided by P) and each rank's applied index set (sorted int64 arrays).

REFERENCES (at the end) maps every registered algorithm to its reference and the cases that check it;
tests/mpi/compressor_check.py iterates compression.COMPRESSORS and fails for an algorithm missing here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

PAIR_BYTES = 8  # int32 index + float32 value


# ---------------------------------------------------------------- closed forms (DESIGN 3)
def ring_allreduce_bytes(n: int, P: int, itemsize: int = 4) -> int:
    """Bytes one rank sends (and receives) in a ring allreduce of n elements."""
    return 2 * n * itemsize * (P - 1) // P


def meta_bytes(P: int) -> int:
    """One size exchange (allgather/alltoall of one int64 per rank): what a rank sends or receives."""
    return 8 * (P - 1)


def topk_np(acc: np.ndarray, k: int) -> np.ndarray:
    """Indices (sorted) of the k entries of largest |acc|."""
    k = min(k, acc.size)
    return np.sort(np.argsort(-np.abs(acc), kind="stable")[:k])


def sum_selections(accs: list[np.ndarray], selections: list[np.ndarray]) -> np.ndarray:
    total = np.zeros(accs[0].size, dtype=np.float64)
    for acc, sel in zip(accs, selections):
        total[sel] += acc[sel].astype(np.float64)
    return total


def union(selections: list[np.ndarray]) -> np.ndarray:
    return np.unique(np.concatenate(selections)) if selections else np.zeros(0, np.int64)


# ---------------------------------------------------------------- TopkA and TopkDSA
def topka_reference(accs: list[np.ndarray], k: int):
    """Sum of every rank's exact top-k; every local selection is applied."""
    selections = [topk_np(a, k) for a in accs]
    return sum_selections(accs, selections), union(selections), selections


def topka_bytes(n: int, k: int, P: int) -> tuple[int, int]:
    """(sent, received) bytes per rank: k pairs to each of P-1 others, and theirs back."""
    k = min(k, n)
    return k * PAIR_BYTES * (P - 1), k * PAIR_BYTES * (P - 1)


def topkdsa_volume(selections: list[np.ndarray], n: int, dense_switch: float):
    """Per-rank (sent, received) bytes of TopkDSA and how many regions went dense, from the
    selections alone: region j = [j*n//P, (j+1)*n//P) is owned by rank j."""
    P = len(selections)
    edges = [j * n // P for j in range(P + 1)]
    owner = lambda idx: np.searchsorted(edges, idx, side="right") - 1  # noqa: E731
    reduced = [np.unique(np.concatenate([s[owner(s) == j] for s in selections])).size for j in range(P)]
    lengths = [edges[j + 1] - edges[j] for j in range(P)]
    dense = [reduced[j] > dense_switch * lengths[j] for j in range(P)]
    part = [4 * lengths[j] if dense[j] else PAIR_BYTES * reduced[j] for j in range(P)]
    volumes = []
    for r in range(P):
        scatter_sent = PAIR_BYTES * int(np.sum(owner(selections[r]) != r))
        scatter_recv = PAIR_BYTES * sum(int(np.sum(owner(selections[q]) == r)) for q in range(P) if q != r)
        sent = scatter_sent + part[r] * (P - 1) + 2 * meta_bytes(P)
        recv = scatter_recv + sum(part) - part[r] + 2 * meta_bytes(P)
        volumes.append((sent, recv))
    return volumes, sum(dense)


# ---------------------------------------------------------------- gTopk
def binomial_parent(i: int) -> int:
    """Parent of rank i > 0 in the binomial tree rooted at 0: clear the lowest set bit."""
    return i & (i - 1)


def gtopk_reference(accs: list[np.ndarray], k: int):
    """Simulate the merge tree with explicit bookkeeping of whose contribution each entry holds.

    A set is {index: (value, ranks whose value is in it)}; a merge sums values and unions the
    contributor sets, then keeps the k entries of largest |value|. A rank's applied set is the
    final entries that list it as a contributor. Returns (update sum, final indices, applied)."""
    P, n = len(accs), accs[0].size
    k = min(k, n)
    sets = []
    for r, acc in enumerate(accs):
        sets.append({int(i): (float(acc[i]), frozenset([r])) for i in topk_np(acc, k)})
    # Round d: rank i merges the set of rank i + d (the subtree whose parent is i).
    d = 1
    while d < P:
        for i in range(0, P, 2 * d):
            if i + d < P:
                assert binomial_parent(i + d) == i
                merged = dict(sets[i])
                for idx, (val, who) in sets[i + d].items():
                    old_val, old_who = merged.get(idx, (0.0, frozenset()))
                    merged[idx] = (old_val + val, old_who | who)
                best = sorted(merged, key=lambda idx: -abs(merged[idx][0]))[:k]
                sets[i] = {idx: merged[idx] for idx in best}
        d *= 2
    final = sets[0]
    total = np.zeros(n, dtype=np.float64)
    for idx, (val, _) in final.items():
        total[idx] = val
    applied = [np.array(sorted(i for i, (_, who) in final.items() if r in who), dtype=np.int64) for r in range(P)]
    return total, np.array(sorted(final), dtype=np.int64), applied


def gtopk_bytes(n: int, k: int, P: int) -> list[tuple[int, int]]:
    """(sent, received) bytes per rank: k pairs up each tree edge, k pairs + a k-bit mask down."""
    k = min(k, n)
    up, down = k * PAIR_BYTES, k * PAIR_BYTES + (k + 7) // 8
    volumes = []
    for i in range(P):
        children = sum(1 for j in range(1, P) if binomial_parent(j) == i)
        has_parent = i > 0
        volumes.append((has_parent * up + children * down, children * up + has_parent * down))
    return volumes


# ---------------------------------------------------------------- Gaussiank
def normal_two_sided_quantile(density: float) -> float:
    """z with P(|X| >= z) = density for X ~ N(0, 1), by bisection on erfc (no scipy)."""
    lo, hi = 0.0, 40.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if math.erfc(mid / math.sqrt(2)) > density:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def gaussiank_select(acc: np.ndarray, density: float, tolerance: float = 2.0, max_adjust: int = 4) -> np.ndarray:
    """The documented rule of compression/gaussiank.py, in float64 numpy."""
    k = max(1, int(round(density * acc.size)))
    a = acc.astype(np.float64)
    deviation = np.abs(a - a.mean())
    t = normal_two_sided_quantile(density) * a.std()
    lower, upper = 0.0, math.inf
    for adjust in range(max_adjust + 1):
        count = int(np.sum(deviation >= t))
        if k / tolerance <= count <= k * tolerance or adjust == max_adjust:
            break
        lower, upper = (t, upper) if count > k * tolerance else (lower, t)
        t = max(2 * lower, 1e-30) if upper == math.inf else upper / 2 if lower == 0 else math.sqrt(lower * upper)
    return np.flatnonzero(deviation >= t)


def gaussiank_reference(accs: list[np.ndarray], density: float, **options):
    selections = [gaussiank_select(a, density, **options) for a in accs]
    return sum_selections(accs, selections), union(selections), selections


# ---------------------------------------------------------------- Ok-Topk (every interval = 1: exact thresholds)
def oktopk_reference(accs: list[np.ndarray], k: int, local_k: int | None = None):
    """Local exact top-(local_k, default k), sum, exact global top-k of the sum; applied = S_r ∩ G."""
    acc = np.stack(accs)
    mag = np.abs(acc.astype(np.float32))
    selected = np.zeros(acc.shape, dtype=bool)
    for r in range(acc.shape[0]):
        selected[r, np.argsort(-mag[r], kind="stable")[:local_k or k]] = True
    reduced = np.where(selected, acc.astype(np.float64), 0.0).sum(axis=0)
    support = np.flatnonzero(selected.any(axis=0))
    chosen = np.sort(support[np.argsort(-np.abs(reduced[support]), kind="stable")[:k]])
    total = np.zeros(acc.shape[1])
    total[chosen] = reduced[chosen]
    applied = [np.intersect1d(np.flatnonzero(selected[r]), chosen) for r in range(acc.shape[0])]
    return total, chosen, applied


# ---------------------------------------------------------------- CLT-k
def cltk_reference(accs: list[np.ndarray], k: int, step: int):
    """The leader (step mod P) picks its exact top-k; every rank's acc is summed there; all ranks apply it all."""
    indices = topk_np(accs[step % len(accs)], k)
    total = np.zeros(accs[0].size)
    total[indices] = np.sum([a[indices].astype(np.float64) for a in accs], axis=0)
    return total, indices, [indices] * len(accs)


def cltk_bytes(k: int, P: int, step: int) -> list[tuple[int, int]]:
    """Per rank: the leader sends its k int32 indices to the P-1 others (the broadcast), then a ring allreduce of k."""
    ring = ring_allreduce_bytes(k, P)
    return [(ring + (4 * k * (P - 1) if r == step % P else 0), ring + (0 if r == step % P else 4 * k))
            for r in range(P)]


# ---------------------------------------------------------------- the registry of references
@dataclass
class Expected:
    """What one step must produce: the update SUM (float64), the global indices, the applied index set per
    rank (None for dense), exact (sent, received) bytes per rank (None: checked elsewhere), extra figures."""

    total: np.ndarray
    indices: np.ndarray
    applied: list[np.ndarray] | None
    volumes: list[tuple[int, int]] | None
    extra: dict = field(default_factory=dict)


def dense_expected(accs, k, density, options, step):
    n, P = accs[0].size, len(accs)
    volume = ring_allreduce_bytes(n, P)
    return Expected(np.sum([a.astype(np.float64) for a in accs], axis=0), np.arange(n), None, [(volume, volume)] * P)


def topka_expected(accs, k, density, options, step):
    total, indices, applied = topka_reference(accs, k)
    return Expected(total, indices, applied, [topka_bytes(accs[0].size, k, len(accs))] * len(accs))


def topkdsa_expected(accs, k, density, options, step):
    total, indices, applied = topka_reference(accs, k)
    volumes, dense = topkdsa_volume(applied, accs[0].size, options.get("dense_switch", 1 / 3))
    return Expected(total, indices, applied, volumes, {"dense_regions": dense})


def gtopk_expected(accs, k, density, options, step):
    total, indices, applied = gtopk_reference(accs, k)
    return Expected(total, indices, applied, gtopk_bytes(accs[0].size, k, len(accs)))


def gaussiank_expected(accs, k, density, options, step):
    total, indices, applied = gaussiank_reference(accs, density, **options)
    P, counts, meta = len(accs), [a.size for a in applied], meta_bytes(len(accs))
    volumes = [(c * PAIR_BYTES * (P - 1) + meta, (sum(counts) - c) * PAIR_BYTES + meta) for c in counts]
    return Expected(total, indices, applied, volumes)


def oktopk_expected(accs, k, density, options, step):
    n = accs[0].size
    local_k = min(n, max(1, round(options.get("local_factor", 1.0) * k)))
    global_k = min(n, max(1, round(options.get("candidate_factor", 1.0) * k)), len(accs) * local_k)
    total, indices, applied = oktopk_reference(accs, global_k, local_k)
    if options.get("complete_values"):  # the same global set; every rank's acc summed there, applied everywhere
        sums = np.sum([a[indices].astype(np.float64) for a in accs], axis=0)
        # candidate_factor: the k largest complete sums of the global_k candidates (ties: the lowest index)
        keep = np.sort(np.argsort(-np.abs(sums), kind="stable")[:k])  # indices ascend, so these positions do
        indices = indices[keep]
        total = np.zeros(n)
        total[indices] = sums[keep]
        applied = [indices] * len(accs)
    return Expected(total, indices, applied, None)  # data-dependent volume: tests/mpi/oktopk_check.py bounds it


def cltk_expected(accs, k, density, options, step):
    total, indices, applied = cltk_reference(accs, k, step)
    return Expected(total, indices, applied, cltk_bytes(indices.size, len(accs), step), {"leader": float(step % len(accs))})


def powersgd_expected(accs, k, density, options, step):
    """This harness hands over one vector, which PowerSGD (as PyTorch's hook) sends uncompressed: the ranks'
    mean by one ring allreduce, leaving no error (by default; torch_compatible keeps acc - mean as the hook
    does). Matrices, and torch_compatible: tests/mpi/powersgd_check.py, against PyTorch's hook."""
    return dense_expected(accs, k, density, options, step)


@dataclass(frozen=True)
class Reference:
    expected: Callable  # (accs, k, density, options, step) -> Expected
    cases: list  # (density, options) to check
    extra_check: Callable | None = None  # (density, P, summed extras over the run) -> None: branches exercised


def _topkdsa_went_dense(density, P, extras):
    assert (extras.get("dense_regions", 0) > 0) == (density > 0.1 and P > 1), (density, P, extras)


def _gaussiank_adjusted(density, P, extras):
    assert extras.get("threshold_adjustments", 0) > 0, "heavy tails should have needed threshold corrections"


EXACT_OKTOPK = {"local_threshold_interval": 1, "global_threshold_interval": 1, "repartition_interval": 1}
REFERENCES = {
    "dense": Reference(dense_expected, [(1.0, {})]),
    "topka": Reference(topka_expected, [(0.02, {})]),
    "topkdsa": Reference(topkdsa_expected, [(0.02, {}), (0.25, {"dense_switch": 0.3})], _topkdsa_went_dense),
    "gtopk": Reference(gtopk_expected, [(0.02, {}), (0.3, {}), (1.0, {})]),  # 0.3: many drops at merges; 1.0: k = n
    "gaussiank": Reference(gaussiank_expected, [(0.02, {})], _gaussiank_adjusted),
    "oktopk": Reference(oktopk_expected, [(0.02, EXACT_OKTOPK), (0.02, {**EXACT_OKTOPK, "local_factor": 2.5}),
                                          (0.02, {**EXACT_OKTOPK, "complete_values": True}),
                                          (0.02, {**EXACT_OKTOPK, "complete_values": True, "candidate_factor": 2.0,
                                                  "local_factor": 1.5})]),
    "cltk": Reference(cltk_expected, [(0.02, {}), (1.0, {})]),
    "powersgd": Reference(powersgd_expected, [(0.02, {})]),
}
