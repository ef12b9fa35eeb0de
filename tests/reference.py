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


# ---------------------------------------------------------------- owner chunks: bf16, fp16, onebit
def owner_chunks(n: int, P: int) -> list[slice]:
    """Chunk j = [j n // P, (j + 1) n // P), owned by rank j (the spec the exchanges follow)."""
    return [slice(j * n // P, (j + 1) * n // P) for j in range(P)]


def owner_volumes(n: int, P: int, message_bytes: Callable[[int], int]) -> list[tuple[int, int]]:
    """(sent, received) per rank of a reduce-scatter to the chunk owners and an allgather of the owned results,
    each chunk travelling as message_bytes(its length): rank r sends every other owner its chunk, receives its own
    chunk from the P-1 others, sends its result to them and receives theirs."""
    sizes = [message_bytes(c.stop - c.start) for c in owner_chunks(n, P)]
    volume = [sum(sizes) - sizes[r] + (P - 1) * sizes[r] for r in range(P)]
    return [(v, v) for v in volume]


def round_to(x: np.ndarray, kind: str) -> np.ndarray:
    """The nearest bf16 or fp16 of each value (ties to even), as float64. Through float32 first: double rounding
    via float32 is exact for these formats (24 bits >= 2 p + 2). bf16: the float32's upper 16 bits, rounded by
    integer arithmetic on its bit pattern (numpy has no bf16); fp16: numpy's float16."""
    x32 = np.asarray(x, dtype=np.float64).astype(np.float32)
    if kind == "fp16":
        with np.errstate(over="ignore"):
            return x32.astype(np.float16).astype(np.float64)
    bits = x32.view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def half_expected(kind: str):
    def expected(accs, k, density, options, step):
        """PyTorch's compress hook: h_r = half(half(g_r) / P); the owner sums in rank order, rounding each partial
        sum to half; SUM = P x that mean."""
        n, P = accs[0].size, len(accs)
        with np.errstate(invalid="ignore"):  # fp16 overflow: inf - inf
            mean = None
            for acc in accs:
                h = round_to(round_to(acc, kind) / P, kind)
                mean = h if mean is None else round_to(mean + h, kind)
        return Expected(P * mean, np.arange(n), None, owner_volumes(n, P, lambda length: 2 * length))
    return expected


def one_bit(x: np.ndarray) -> np.ndarray:
    """sign (+1 at 0) times the mean absolute value, float64."""
    return np.where(x >= 0, 1.0, -1.0) * (np.abs(x).mean() if x.size else 0.0)


def onebit_expected(accs, k, density, options, step, before):
    """Worker: acc = gradient + worker error (`accs` are the gradients: onebit keeps no residual), compressed chunk
    by chunk; owner j: the mean of the ranks' compressed chunk j plus its server error, compressed again. `before`:
    every rank's errors before the step; the errors after are returned as Expected.memory."""
    n, P = accs[0].size, len(accs)
    chunks = owner_chunks(n, P)
    sent, memory = [], []
    for grad, mine in zip(accs, before):
        acc = (mine["worker_error"] + grad).astype(np.float64)  # one float32 addition, as the compressor's
        compressed = np.concatenate([one_bit(acc[c]) for c in chunks])
        sent.append(compressed)
        memory.append({"worker_error": acc - compressed})
    total = np.zeros(n)
    for j, c in enumerate(chunks):
        averaged = np.mean([s[c] for s in sent], axis=0) + before[j]["server_error"]
        update = one_bit(averaged)
        total[c] = P * update
        memory[j]["server_error"] = averaged - update
    return Expected(total, np.arange(n), None, owner_volumes(n, P, lambda length: (length + 7) // 8 + 4),
                    memory=memory, exact=False)


def onebit_state(compressor) -> dict:
    return {key: value.numpy().copy() for key, value in compressor.state_dict().items()}


# ---------------------------------------------------------------- randomk
def randomk_expected(accs, k, density, options, step):
    """The indices come from the compressor's own draw (randomk.draw_indices: seeded by (seed, step) alike on every
    rank); the sum, the applied sets and the volume are computed here."""
    from sparse_asr.compression.randomk import RandomkOptions, draw_indices

    n, P = accs[0].size, len(accs)
    indices = draw_indices(n, k, options.get("seed", RandomkOptions().seed), step).numpy().astype(np.int64)
    assert np.array_equal(indices, np.unique(indices)) and indices.size == min(k, n), "draws not k distinct indices"
    total = np.zeros(n)
    total[indices] = np.sum([a[indices].astype(np.float64) for a in accs], axis=0)
    volume = ring_allreduce_bytes(indices.size, P)
    return Expected(total, indices, [indices] * P, [(volume, volume)] * P)


# ---------------------------------------------------------------- QSGD
def qsgd_quantize(v: np.ndarray, uniforms: np.ndarray, s: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """(signed levels, float32 bucket norms) in numpy: the norm in float64 then rounded to float32, x = |v| (s / N)
    in float32, level = floor(x) + [u < x - floor(x)] (at most s)."""
    n = v.size
    buckets = -(-n // d)
    padded = np.zeros(buckets * d)
    padded[:n] = v
    norms = np.sqrt(np.sum(padded.reshape(buckets, d) ** 2, axis=1)).astype(np.float32)
    with np.errstate(divide="ignore"):
        ratio = np.where(norms > 0, np.float32(s) / norms, np.float32(0)).astype(np.float32)
    x = np.abs(v).astype(np.float32) * np.repeat(ratio, d)[:n]
    low = np.floor(x)
    level = np.minimum(low + (uniforms < x - low), s)
    return np.where(v < 0, -level, level).astype(np.int64), norms


def qsgd_expected(accs, k, density, options, step):
    """Every rank's gradient quantized with its own draws (qsgd.draw_uniforms(seed, rank, step): the same uniforms
    the compressor uses), decoded in float32 as N / s x level, summed in float64."""
    from sparse_asr.compression.qsgd import QSGDOptions, draw_uniforms

    o = {**{f: getattr(QSGDOptions(), f) for f in ("levels", "bucket_size", "seed")}, **options}
    s, d, n, P = o["levels"], o["bucket_size"], accs[0].size, len(accs)
    total = np.zeros(n)
    for rank, acc in enumerate(accs):
        levels, norms = qsgd_quantize(acc, draw_uniforms(n, o["seed"], rank, step).numpy(), s, d)
        total += (levels.astype(np.float32) * np.repeat(norms / np.float32(s), d)[:n]).astype(np.float64)
    message = n * (1 if s <= 127 else 2) + 4 * -(-n // d)
    return Expected(total, np.arange(n), None, [(message * (P - 1), message * (P - 1))] * P)


# ---------------------------------------------------------------- the registry of references
@dataclass
class Expected:
    """What one step must produce: the update SUM (float64), the global indices, the applied index set per
    rank (None for dense), exact (sent, received) bytes per rank (None: checked elsewhere), extra figures,
    and for an exchange with its own memory (Reference.state) every rank's state after the step."""

    total: np.ndarray
    indices: np.ndarray
    applied: list[np.ndarray] | None
    volumes: list[tuple[int, int]] | None
    extra: dict = field(default_factory=dict)
    memory: list[dict] | None = None  # per rank, the state after the step (Reference.state's keys), to float tolerance
    exact: bool = True  # total / P is the compressor's float32 update exactly at P = 1 (False: to float tolerance)


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
    return Expected(total, indices, applied, cltk_bytes(indices.size, len(accs), step),
                    {"leader": float(step % len(accs))})


def powersgd_expected(accs, k, density, options, step):
    """This harness hands over one vector, which PowerSGD (as PyTorch's hook) sends uncompressed: the ranks'
    mean by one ring allreduce, leaving no error (by default; torch_compatible keeps acc - mean as the hook
    does). Matrices, and torch_compatible: tests/mpi/powersgd_check.py, against PyTorch's hook."""
    return dense_expected(accs, k, density, options, step)


@dataclass(frozen=True)
class Reference:
    expected: Callable  # (accs, k, density, options, step[, before=every rank's state]) -> Expected
    cases: list  # (density, options) to check
    extra_check: Callable | None = None  # (density, P, summed extras over the run) -> None: branches exercised
    # A memory that is not the residual of applied entries (onebit's errors): (compressor) -> its state by name as
    # numpy arrays, read before each step and given to `expected` as before=[every rank's], and after it, compared
    # with Expected.memory. The rank's owed mass is then the compressor's `owed`.
    state: Callable | None = None
    conserves: bool = True  # P x update + owed after == owed before + gradient, summed over ranks (False: lossy)


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
    "randomk": Reference(randomk_expected, [(0.02, {}), (0.3, {"seed": 12345})]),  # 0.3: the permutation's draw
    "bf16": Reference(half_expected("bf16"), [(1.0, {})], conserves=False),
    "fp16": Reference(half_expected("fp16"), [(1.0, {})], conserves=False),
    "onebit": Reference(onebit_expected, [(1.0, {})], state=onebit_state),
    "qsgd": Reference(qsgd_expected, [(1.0, {}), (1.0, {"levels": 300, "bucket_size": 1000, "seed": 5}),
                                      (1.0, {"levels": 2, "bucket_size": 4000})],  # int16 levels; one bucket
                      conserves=False),
}
