"""Ok-Topk sparse allreduce (Li & Hoefler, "Near-Optimal Sparse Allreduce", PPoPP 2022), DESIGN 4.

One step on every rank r, with acc = grad + residual and k = density * n:
  1. local selection S_r = {i : |acc_i| >= local threshold}. The threshold is exact (the k-th
     largest |acc|, compression.selection.topk_threshold_select: the fastest exact method on the
     device) on the first step and every `local_threshold_interval` steps; in between it is
     reused, steered toward selecting k entries by a CountController, and recomputed exactly at
     once if the reused one selects outside [k/2, 2k] (the guard);
  2. on the first step, every `repartition_interval` steps, and on steps 1, 2, 4, ... before the
     first interval, [0, n) is cut into P contiguous regions holding about equal numbers of
     selected entries (a global count histogram: one allreduce); every rank gets the same cuts;
  3. reduce: the pairs of S_r in region j go to rank j, point-to-point after one count exchange,
     with destination rotation (round i sends to rank+i, receives from rank-i); each owner sums
     what arrives for its region with its own pairs (one merge of the sorted runs);
  4. global selection inside each region: |reduced| >= global threshold, exact (the k-th largest
     over all regions: radix select whose histograms are allreduced, its first round centred on
     the reused threshold) on the first step and every `global_threshold_interval` steps,
     reused/steered/guarded in between like the local one;
  5. the selected pairs are allgathered (allgatherv); all ranks get them sorted by index. With
     the `rebalance` option (on by default) and P > 2 they are first re-cut (point-to-point,
     sizes known from the counts) so rank q holds the q-th contiguous block of about total/P
     pairs: a ring allgatherv, which MPI uses at these sizes, takes P-1 steps each as long as the
     largest block, so evening the blocks out pays for moving the excess once more from P = 4 on
     in bench/project_scaling.py's model with the measured imbalance (docs/results/oktopk_floor.md);
     at P = 2 the excess crosses the one link either way, so it is skipped;
  6. only with the `complete_values` option (a remedy for local selection at few utterances per rank): step 5
     gathers the indices alone and one allreduce sums every rank's acc at them, so an applied entry carries
     all P ranks' values, not only those of the ranks that picked it locally, and leaves every rank's
     residual (applied = G).
     With `candidate_factor` g > 1 the global selection keeps g k candidates and the k largest of their
     complete sums are applied (the others stay in the residuals). What they gain along a dense
     trajectory and in training: docs/results.md.
The base class divides by P and clears exactly applied = S_r ∩ G from the residual, computed with
an order-free membership test (the original intersected unsorted arrays and left residuals
uncleared on recompute steps). P = 1 runs the same code: no transfers, G = S_0 above the global
threshold. Volume per rank ~ 2k(P-1)/P words for the reduce + 2k(P-1)/P for the allgather, plus
small count/histogram exchanges, below the paper's 6k(P-1)/P bound (complete_values: 2k(P-1)/P for the
reduce, k(P-1)/P for the indices and 2k(P-1)/P for the allreduce).

Point-to-point rather than alltoallv for the reduce: the rotation is the algorithm's, not left to
the MPI library, empty messages are skipped, and the same isend/irecv calls exist in
torch.distributed.

Host synchronisations on CUDA in a reuse step (each stalls the host until the GPU catches up): the
local selection's nonzero and the reduce's per-region counts (both set the reduce's message sizes),
the global selection's nonzero (the allgatherv's sizes), staging through host memory when MPI is
not CUDA-aware, and, after the last transfer, the applied set's size (SparseUpdate.applied is a list of
indices) and the local controller's elasticity count (the global one's rides with the owners' counts).
Exact steps add the k-th value of torch.topk and one histogram per radix round. The reduced region is
kept with its repeated indices (summed into the first, 0 elsewhere) so that no sync sizes a unique set.
"""
from __future__ import annotations

import bisect
import math
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from sparse_asr.compression import kernels
from sparse_asr.compression.base import (Cost, SparseUpdate, SparseCompressor, Timer, pack_pairs, pair_bytes,
                                         unpack_pairs)
from sparse_asr.compression.selection import (count_at_least, intersect_unique, kth_largest_magnitude_radix,
                                              threshold_indices, topk_indices, topk_threshold_select)
from sparse_asr.settings import between, positive, setting, tie

# Repartition histogram: about 4 selected entries per rank per bin, at most 1024 bins (its
# allreduce then costs ~2% of the pairs' volume at k = 500, far less for real models).
MAX_HISTOGRAM_BINS = 1024
# Global radix select: at most one bin per 128 selected entries (the histograms stay a fraction
# of a percent of the pairs' volume), between 256 (4 rounds over 31 bits) and 4096 (2 rounds
# when the first is centred on the reused threshold).
RADIX_BINS = (256, 4096)
MIN_THRESHOLD = float(torch.finfo(torch.float32).tiny)  # never select exact zeros
MAX_STEP = math.log(2.0)  # a reused threshold moves by at most a factor 2 per step
MAX_DRIFT = 0.25
MAX_ELASTICITY = 64.0
ELASTICITY_STEP = 0.02  # the elasticity is measured between t and t * (1 + this)
REDUCE_TAG = 4711
REBALANCE_TAG = 4712
PHASES = ("repartition", "reduce", "global_threshold", "global_count", "rebalance", "allgather", "complete")


@dataclass
class CountController:
    """Steers a reused threshold toward selecting exactly k entries.

    After a step that selected `count` entries with threshold t, where the count falls by a factor
    (1 + d)^-e when the threshold rises by (1 + d) (e, the elasticity, measured on the selected
    values just above t), the threshold that would have selected k is estimated as
        ideal = t * (count / k)^(1 / e)
    and the next step's threshold is
        t * (ideal / t)^count_gain * exp(drift)     (a factor in [1/2, 2])
    where drift, a moving average (weight drift_gain) of the step-to-step change of log(ideal),
    follows the steady rise of the ideal threshold under error feedback (the residual grows
    between selections), which the proportional term alone would trail by a constant offset.
    Dividing by the measured e matters: it grows from ~2 to ~16 over a few hundred steps as
    error feedback piles entries up just below the threshold, and a fixed exponent
    (count / k)^gamma that suits the start then oscillates with a growing amplitude."""

    count_gain: float
    drift_gain: float
    threshold: float = 0.0
    drift: float = 0.0  # moving average of log(ideal_s / ideal_{s-1})
    ideal: float = 0.0  # the last step's ideal threshold (0: unknown)

    def exact(self, threshold: float, guard: bool) -> None:
        """The threshold was recomputed exactly. If the guard did it, the reused threshold was far
        off: the drift learned so far is forgotten."""
        self.threshold = max(threshold, MIN_THRESHOLD)
        if guard:
            self.drift, self.ideal = 0.0, 0.0

    def update(self, count: int, k: int, elasticity: float) -> None:
        """After a step that selected `count` entries with `threshold` (see the class)."""
        if self.threshold <= MIN_THRESHOLD and count < k:
            return  # fewer than k nonzeros: the count says nothing about the threshold
        miss = math.log(max(count, 1) / k) / min(max(elasticity, 1.0), MAX_ELASTICITY)  # log(ideal / t)
        ideal = self.threshold * math.exp(miss)
        if self.ideal > 0:
            change = math.log(ideal / self.ideal)
            self.drift = min(max(self.drift + self.drift_gain * (change - self.drift), -MAX_DRIFT), MAX_DRIFT)
        self.ideal = ideal
        step = min(max(self.count_gain * miss + self.drift, -MAX_STEP), MAX_STEP)
        self.threshold = max(self.threshold * math.exp(step), MIN_THRESHOLD)


def elasticity(count: int, count_above: int) -> float:
    """|d log count / d log threshold| just above the threshold t, from the `count` selected
    entries and the `count_above` of them >= t * (1 + ELASTICITY_STEP)."""
    return math.log(max(count, 1) / max(count_above, 1)) / math.log1p(ELASTICITY_STEP)


def in_guard_band(count: int, k: int) -> bool:
    """A reused threshold whose count leaves [k/2, 2k] is recomputed exactly in the same step."""
    return k / 2 <= count <= 2 * k


def balanced_regions(hist: torch.Tensor, numel: int, parts: int) -> list[int]:
    """Boundaries b_0 = 0 <= ... <= b_parts = numel cutting [0, numel) into `parts` contiguous
    regions with about equal counts, from a count histogram over equal-width bins (linear
    interpolation inside a bin). Deterministic: equal inputs give equal boundaries on every rank."""
    nbins = hist.numel()
    total = int(hist.sum())
    if total == 0:
        return [numel * j // parts for j in range(parts + 1)]
    cum = torch.cumsum(hist.to(torch.float64), 0)
    targets = torch.arange(1, parts, dtype=torch.float64) * (total / parts)
    bins = torch.searchsorted(cum, targets).clamp_(max=nbins - 1)  # first bin reaching each target
    before = torch.where(bins > 0, cum[(bins - 1).clamp(min=0)], torch.zeros_like(targets))
    frac = (targets - before) / hist.to(torch.float64)[bins].clamp(min=1)
    lo = bins * numel // nbins
    hi = (bins + 1) * numel // nbins
    cuts = (lo + torch.round(frac.clamp(0, 1) * (hi - lo)).long()).tolist()
    bounds = [0]
    for c in cuts:
        bounds.append(min(max(c, bounds[-1]), numel))
    return bounds + [numel]


def sum_sorted_runs(indices: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`indices` is a concatenation of runs each sorted ascending (one per sender). Returns them
    sorted, with the values of a repeated index summed into its first position (in run order) and
    0 in the others, which fall below any threshold (so no host sync sizes a set of unique
    indices)."""
    order = stable_order(indices)
    ordered, vals = indices[order], values[order]
    first = torch.ones(ordered.shape, dtype=torch.bool, device=ordered.device)
    first[1:] = ordered[1:] != ordered[:-1]
    segment = torch.cumsum(first, 0) - 1
    sums = torch.zeros_like(vals).index_add_(0, segment, vals)
    return ordered, torch.where(first, sums[segment], torch.zeros_like(vals))


def stable_order(indices: torch.Tensor) -> torch.Tensor:
    """The permutation that sorts `indices` stably. On CPU numpy's stable sort, a timsort, which
    merges already sorted runs in about linear time; elsewhere torch.sort."""
    if indices.device.type == "cpu":
        return torch.from_numpy(np.argsort(indices.numpy(), kind="stable"))
    return stable_order_torch(indices)


def stable_order_torch(indices: torch.Tensor) -> torch.Tensor:
    return torch.sort(indices, stable=True).indices


def reblock_moves(counts: list[int], shares: list[int]) -> list[tuple[int, int, int, int]]:
    """(source, destination, first, end) for every run of positions of the owner-ordered sequence
    of pairs that moves when owner blocks of `counts` pairs are re-cut into blocks of `shares`."""
    have, want = np.cumsum([0] + counts), np.cumsum([0] + shares)
    moves = []
    for src in range(len(counts)):
        for dst in range(len(shares)):
            lo, hi = max(have[src], want[dst]), min(have[src + 1], want[dst + 1])
            if src != dst and hi > lo:
                moves.append((src, dst, int(lo), int(hi)))
    return moves


@dataclass(frozen=True)
class OkTopkOptions:
    # exact local / global threshold every N steps (reused in between); regions rebalanced every N steps
    local_threshold_interval: int = setting(32, positive, "must be a positive integer")
    global_threshold_interval: int = setting(32, positive, "must be a positive integer")
    repartition_interval: int = setting(64, positive, "must be a positive integer")
    # share of the estimated threshold error corrected per step (CountController)
    count_gain: float = setting(0.5, between(0, 1), "must be in [0, 1]")
    # weight of the latest step in the controller's drift estimate
    drift_gain: float = setting(0.3, between(0, 1), "must be in [0, 1]")
    rebalance: bool = setting(True)  # re-cut the selected pairs to equal shares before the allgatherv (P > 2)
    # Each rank selects local_factor x k entries locally (the global step still keeps k): more of every
    # rank's values reach the owners, so a globally selected entry carries more ranks' contributions
    # (a remedy: more candidates per rank); the reduce then moves local_factor times the pairs.
    local_factor: float = setting(1.0, between(1, 64), "must be in [1, 64]")
    # After the global selection G, every rank contributes its acc at every index of G (one allreduce of the
    # k values) instead of only at its own local picks: an applied entry carries all P ranks' values and
    # leaves every rank's residual, as in the oracle; only G is Ok-Topk's.
    complete_values: bool = setting(False)
    # With complete_values: the global selection keeps candidate_factor x k entries, their complete sums are
    # allreduced, and the k largest of those are applied (the rest stay in the residuals): the complete
    # values re-rank the candidates that the owners' partial sums chose.
    candidate_factor: float = setting(1.0, between(1, 64), "must be in [1, 64]")
    TIES = (tie("candidate_factor", lambda o: o.candidate_factor == 1.0 or o.complete_values,
                "needs complete_values=true (the candidates are re-ranked by their complete sums)"),)


class OkTopk(SparseCompressor):
    name = "oktopk"
    Options = OkTopkOptions
    scans_first = True  # the local selection is the first to read acc (on a CPU: one pass with accumulating)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        comm, numel, options = self.comm, self.numel, self.options
        self.local_threshold_interval = options.local_threshold_interval
        self.global_threshold_interval = options.global_threshold_interval
        self.repartition_interval = options.repartition_interval
        self.set_density(self.density)
        # Everything below is state a checkpoint must carry to resume exactly.
        self.sparse_steps = 0  # exchanges done so far (the intervals count these)
        self.local_control = CountController(options.count_gain, options.drift_gain)
        self.global_control = CountController(options.count_gain, options.drift_gain)
        P = comm.size
        self._set_boundaries([numel * j // P for j in range(P + 1)])  # replaced on the first step
        # compression.kernels' buffers, kept from step to step (a CPU step then allocates nothing n-sized and
        # packs nothing twice): the local selection's records, what arrives at the owner, its merged region
        # (indices, values) and the global selection's records
        self._local_pairs, self._received, self._global_pairs = (kernels.PairBuffer() for _ in range(3))
        self._region = (torch.empty(0, dtype=torch.int32), torch.empty(0, dtype=torch.float32))

    def set_density(self, density: float) -> None:
        """k and the targets derived from it; the thresholds then follow the new counts (their controllers, and
        the exact recomputation every interval)."""
        super().set_density(density)
        numel, options = self.numel, self.options
        self.k_local = min(numel, max(1, round(options.local_factor * self.k)))  # local selection's target
        # The global selection's target: never more than the P local selections can offer together.
        self.k_global = min(numel, max(1, round(options.candidate_factor * self.k)), self.comm.size * self.k_local)
        self.radix_bins = min(max(RADIX_BINS[0], 1 << max(0, (self.k // 128).bit_length() - 1)), RADIX_BINS[1])

    @staticmethod
    def cost(n: int, k: int, P: int, shapes=None, options=None) -> Cost:
        """The paper's bounds [2k(P-1)/P, 6k(P-1)/P]; typically k pairs reduced to balanced regions and k
        pairs allgathered, 4k(P-1)/P. With local_factor c the reduce moves c times the pairs: typically
        (2c + 2)k(P-1)/P, at most (4c + 2)k(P-1)/P. With complete_values the allgather moves k indices
        (k(P-1)/P) and a ring allreduce of k values (2k(P-1)/P) follows: typically (2c + 3)k(P-1)/P; with
        candidate_factor g those are gk indices and gk values: typically (2c + 3g)k(P-1)/P.
        Messages: the reduce and the allgather, plus the threshold rounds (and the allreduce)."""
        options = options or OkTopkOptions()
        c, g = options.local_factor, options.candidate_factor
        extra = 1 if options.complete_values else 0
        rounds = math.ceil(math.log2(P)) if P > 1 else 0
        # the allgather moves g k pairs (2g k words), or with complete_values g k indices and 2g k values
        low, high, typical = (2 + extra) * g, 4 * c + (2 + extra) * g, 2 * c + (2 + extra) * g
        formula = "[2k(P-1)/P, 6k(P-1)/P]" if (c, g, extra) == (1, 1, 0) else f"[{low:g}k, {high:g}k](P-1)/P"
        return Cost(low * k * (P - 1) / P, high * k * (P - 1) / P, typical * k * (P - 1) / P,
                    (2 + 2 * extra) * (P - 1) + 2 * rounds, formula)

    # ------------------------------------------------------------------ one step
    def exchange(self, acc: torch.Tensor) -> SparseUpdate:
        comm, k = self.comm, self.k
        repartition = self._repartition_due()
        figures = {f"{d}_{phase}": 0.0 for phase in PHASES for d in ("bytes_recv", "bytes_sent", "seconds")}

        # 1. local selection
        with Timer() as t_local:
            idx, vals, recomputed_local, guard_local = self._select_local(acc, self._due(self.local_threshold_interval))
        local_threshold_used = self.local_control.threshold

        # 2. space repartition
        if repartition:
            with self._phase(figures, "repartition"):
                self._set_boundaries(self._repartition(idx))

        # 3. reduce to region owners
        with self._phase(figures, "reduce"):
            region_idx, region_vals, recv_pairs = self._reduce(idx, vals)

        # 4. global selection inside my region
        with Timer() as t_global:
            g_idx, g_vals, owner_counts, recomputed_global, guard_global = self._select_global(
                region_idx, region_vals, self._due(self.global_threshold_interval), figures
            )
        global_threshold_used = self.global_control.threshold

        # 5. allgather of the selected pairs (of their indices alone with complete_values)
        counts = [count for count, _ in owner_counts]
        complete = self.options.complete_values
        all_idx, all_vals, imbalance_before, imbalance_after = self._allgather(
            g_idx, None if complete else g_vals, counts, figures)

        if complete:
            # 6. every rank's acc at every selected index, summed (the same bits on every rank): every rank
            # applies all of them, or with candidate_factor > 1 the k largest complete sums
            with self._phase(figures, "complete"):
                all_vals = comm.allreduce_(acc[all_idx.long()])
            if self.k_global > k:
                keep = topk_indices(all_vals, k)
                all_idx, all_vals = all_idx[keep], all_vals[keep]
            applied = all_idx
        else:
            # Applied on this rank: its selected entries that made it into the global selection.
            applied = intersect_unique(idx, all_idx)

        count_local, count_global = int(idx.numel()), sum(counts)
        local_above = count_at_least(vals, local_threshold_used * (1 + ELASTICITY_STEP))
        local_elasticity = elasticity(count_local, local_above)
        global_elasticity = elasticity(count_global, sum(above for _, above in owner_counts))
        self.local_control.update(count_local, self.k_local, local_elasticity)
        self.global_control.update(count_global, self.k_global, global_elasticity)
        self.sparse_steps += 1

        figures.update(
            local_count=float(count_local),
            local_count_over_k=count_local / k,
            global_count=float(count_global),
            global_count_over_k=count_global / k,
            local_threshold=local_threshold_used,
            global_threshold=global_threshold_used,
            local_elasticity=local_elasticity,
            global_elasticity=global_elasticity,
            local_drift=self.local_control.drift,
            global_drift=self.global_control.drift,
            recomputed_local_threshold=float(recomputed_local),
            recomputed_global_threshold=float(recomputed_global),
            guard_recomputed_local=float(guard_local),
            guard_recomputed_global=float(guard_global),
            repartitioned=float(repartition),
            region_size=float(self.boundaries[comm.rank + 1] - self.boundaries[comm.rank]),
            reduce_pairs_received=float(recv_pairs),
            allgather_imbalance_before=imbalance_before,
            allgather_imbalance_after=imbalance_after,
        )
        comm_seconds_global = figures["seconds_global_threshold"] + figures["seconds_global_count"]
        return SparseUpdate(
            indices=all_idx,
            values=all_vals,
            applied=applied,
            selected_local=count_local,
            seconds_select=t_local.seconds + t_global.seconds - comm_seconds_global,
            extra=figures,
        )

    # ------------------------------------------------------------------ phases
    @contextmanager
    def _phase(self, figures: dict, name: str):
        """Add the traffic and communication seconds of the enclosed calls to figures[*_name]."""
        with self.comm.measure() as moved:
            yield
        figures[f"bytes_recv_{name}"] += moved.bytes_recv
        figures[f"bytes_sent_{name}"] += moved.bytes_sent
        figures[f"seconds_{name}"] += moved.seconds

    def _set_boundaries(self, bounds: list[int]) -> None:
        self.boundaries = bounds
        self._bounds = torch.tensor(bounds, dtype=torch.int64, device=self.device)  # for searchsorted

    def _select_local(self, acc: torch.Tensor, due: bool):
        """(selected indices, sorted; acc at them; recomputed exactly?; was that the guard?). With the kernels
        a reused threshold's selection is the records of self._local_pairs, found while accumulating."""
        k = self.k_local
        if not due:
            self._local_pairs.reserve(2 * k + 1)  # what the guard band accepts fits the first time
            idx, vals = self.select_above(acc, self.local_control.threshold, self._local_pairs)
            if in_guard_band(idx.numel(), k):
                return idx, vals, False, False
        self.accumulated()
        idx, t = topk_threshold_select(acc, k)
        idx = torch.sort(idx).values  # sorted already (cheap) unless a replacement method says otherwise
        self.local_control.exact(t, guard=not due)
        if t < MIN_THRESHOLD:  # fewer than k nonzeros: never send zeros
            idx = idx[acc[idx].abs() >= MIN_THRESHOLD]
        return idx, acc[idx], True, not due

    def _select_global(self, region_idx, region_vals, due: bool, figures: dict):
        """My region's pairs with |value| >= the global threshold, every owner's [count of them, count
        of them >= threshold x (1 + ELASTICITY_STEP)], recomputed exactly?, was that the guard? The
        counts are exchanged anyway for the allgather (and the controller's elasticity), so checking
        the guard band costs nothing unless it fires."""
        k, comm, control = self.k_global, self.comm, self.global_control
        if not due:
            g_idx, g_vals = self._above(region_idx, region_vals, control.threshold)
            with self._phase(figures, "global_count"):
                counts = self._owner_counts(g_vals, control.threshold)
            if in_guard_band(sum(count for count, _ in counts), k):
                return g_idx, g_vals, counts, False, False
        with self._phase(figures, "global_threshold"):
            # The regions are disjoint parts of [0, n): total counts fit int32 when n does.
            count_dtype = torch.int32 if self.numel < 2**31 else torch.int64
            near = control.threshold if control.threshold > MIN_THRESHOLD else None
            t = kth_largest_magnitude_radix(region_vals, k, lambda h: comm.allreduce_(h), count_dtype,
                                            near=near, max_bins=self.radix_bins)
        control.exact(t, guard=not due)
        g_idx, g_vals = self._above(region_idx, region_vals, control.threshold)
        with self._phase(figures, "global_count"):
            counts = self._owner_counts(g_vals, control.threshold)
        return g_idx, g_vals, counts, True, not due

    def _above(self, region_idx: torch.Tensor, region_vals: torch.Tensor, threshold: float):
        """The region's pairs with |value| >= threshold; with the kernels, as the records of self._global_pairs
        (the allgather's message as it is)."""
        if kernels.available(region_idx, region_vals) and region_idx.dtype == torch.int32:
            count = kernels.select_pairs(region_idx, region_vals, threshold, self._global_pairs)
            return self._global_pairs.columns(count)
        keep = threshold_indices(region_vals, threshold)
        return region_idx[keep], region_vals[keep]

    def _owner_counts(self, kept_vals: torch.Tensor, threshold: float) -> list[list[int]]:
        above = count_at_least(kept_vals, threshold * (1 + ELASTICITY_STEP))
        return self.comm.allgather_ints([kept_vals.numel(), above])

    def _due(self, interval: int) -> bool:
        return self.sparse_steps % interval == 0  # the first step is always due

    def _repartition_due(self) -> bool:
        """Every `repartition_interval` steps, and more often at first: on steps 1, 2, 4, 8, ...
        too, because the selected entries move across the index space while the residuals fill
        up after a cold start (measured: owners received up to 1.7x the mean over the first 64
        steps with one repartition on step 0)."""
        s, interval = self.sparse_steps, self.repartition_interval
        return s % interval == 0 or (s < interval and s & (s - 1) == 0)

    def _repartition(self, idx: torch.Tensor) -> list[int]:
        """Boundaries with about equal numbers of selected entries (all ranks) per region."""
        n, P = self.numel, self.comm.size
        nbins = max(1, min(MAX_HISTOGRAM_BINS, n, self.k // 4))
        counts_fit_int32 = P * n < 2**31
        hist = torch.bincount(idx.long() * nbins // n, minlength=nbins)
        hist = hist.to(torch.int32 if counts_fit_int32 else torch.int64)
        self.comm.allreduce_(hist)
        return balanced_regions(hist.cpu(), n, P)

    def _reduce(self, idx: torch.Tensor, vals: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Send my pairs (idx sorted) of region j to rank j; return my region's pairs summed by
        sum_sorted_runs and how many pairs arrived from others. Round i sends to rank+i and
        receives from rank-i, all posted non-blocking after one count exchange, so no owner is
        hit by all at once."""
        comm, P, r = self.comm, self.comm.size, self.comm.rank
        if idx.device.type == "cpu":  # a binary search per boundary (idx may be a strided view)
            sorted_idx = idx.numpy()
            cuts = [bisect.bisect_left(sorted_idx, b) for b in self.boundaries]
        else:
            cuts = torch.searchsorted(idx, self._bounds).tolist()  # region j is idx[cuts[j]:cuts[j+1]]
        send_counts = [cuts[j + 1] - cuts[j] for j in range(P)]
        recv_counts = comm.alltoall_counts(send_counts)
        buf = pack_pairs(idx.to(self.index_dtype), vals)  # no copy when idx, vals are a kernel's records
        pb = pair_bytes(self.index_dtype)
        sources = [(r - i) % P for i in range(1, P)]  # round i receives from rank - i
        lengths = [recv_counts[src] for src in sources]
        kernel = kernels.available(buf) and self.index_dtype == torch.int32
        if kernel:
            self._received.reserve(sum(lengths))
            arrived = self._received.raw.view(torch.uint8)
        else:
            arrived = torch.empty(sum(lengths) * pb, dtype=torch.uint8, device=buf.device)
        offsets = np.cumsum([0] + lengths) * pb
        requests = []
        for i, src in enumerate(sources):
            if lengths[i]:
                requests.append(comm.irecv(arrived[offsets[i] : offsets[i + 1]], src, tag=REDUCE_TAG))
        for i in range(1, P):
            dst = (r + i) % P
            if send_counts[dst]:
                requests.append(comm.isend(buf[cuts[dst] * pb : cuts[dst + 1] * pb], dst, tag=REDUCE_TAG))
        comm.waitall(requests)
        own = buf[cuts[r] * pb : cuts[r + 1] * pb]
        arrived = arrived[: offsets[-1]]
        if kernel:  # one linear merge of the sorted runs, straight from the records
            total = send_counts[r] + sum(lengths)
            if self._region[0].numel() < total:
                self._region = (torch.empty(2 * total, dtype=torch.int32), torch.empty(2 * total, dtype=torch.float32))
            region = (self._region[0][:total], self._region[1][:total])
            kernels.merge_runs(unpack_pairs(own, torch.int32), unpack_pairs(arrived, torch.int32), lengths, region,
                               compact=False)
            region_idx, region_vals = region
        else:
            runs = torch.cat([own, arrived])  # each part sorted by index
            region_idx, region_vals = sum_sorted_runs(*unpack_pairs(runs, self.index_dtype))
        return region_idx, region_vals, sum(recv_counts) - recv_counts[r]

    def _allgather(self, g_idx: torch.Tensor, g_vals: torch.Tensor | None, counts: list[int], figures: dict):
        """Allgather every owner's selected pairs (concatenated in owner order, hence sorted), or
        its indices alone when g_vals is None, re-blocked first to equal shares if the `rebalance`
        option is on (P > 2). Returns (indices, values or None, max/mean contribution before,
        after); puts what a re-block moves to this rank (done or not) in figures, for
        bench/project_scaling.py's model of the allgatherv."""
        P, r = self.comm.size, self.comm.rank
        index_only = g_vals is None
        pb = torch.empty(0, dtype=self.index_dtype).element_size() if index_only else pair_bytes(self.index_dtype)
        total = sum(counts)
        shares = [total // P + (1 if q < total % P else 0) for q in range(P)]
        moves = [m for m in reblock_moves(counts, shares) if m[1] == r]
        figures["rebalance_pairs_in"] = float(sum(hi - lo for _, _, lo, hi in moves))
        figures["rebalance_messages_in"] = float(len(moves))
        g_idx = g_idx.to(self.index_dtype)
        buf = g_idx.contiguous().view(torch.uint8) if index_only else pack_pairs(g_idx, g_vals)  # idx: maybe a column
        rebalance = self.options.rebalance and P > 2  # at P = 2 the excess would cross the one link either way
        if rebalance and counts != shares:
            with self._phase(figures, "rebalance"):
                buf = self._reblock(buf, counts, shares, pb)
        sizes = shares if rebalance else counts
        with self._phase(figures, "allgather"):
            out, _ = self.comm.allgatherv(buf, counts=[s * pb for s in sizes])
        indices, values = (out.view(self.index_dtype), None) if index_only else unpack_pairs(out, self.index_dtype)
        mean = total / P
        before = max(counts) / mean if total else 1.0
        after = max(sizes) / mean if total else 1.0
        return indices, values, before, after

    def _reblock(self, buf: torch.Tensor, counts: list[int], shares: list[int], pb: int) -> torch.Tensor:
        """My `shares[r]` pairs of the owner-ordered sequence of all selected pairs, from the
        owners' `counts[q]`-pair blocks: point-to-point, every size known from the counts."""
        comm, r = self.comm, self.comm.rank
        start = sum(counts[:r])  # my block's first position in the sequence
        my_first = sum(shares[:r])
        pieces, requests = [], []
        for src, dst, lo, hi in reblock_moves(counts, shares):
            if dst == r:
                pieces.append((lo, torch.empty((hi - lo) * pb, dtype=torch.uint8, device=buf.device)))
                requests.append(comm.irecv(pieces[-1][1], src, tag=REBALANCE_TAG))
            elif src == r:
                requests.append(comm.isend(buf[(lo - start) * pb : (hi - start) * pb], dst, tag=REBALANCE_TAG))
        kept_lo, kept_hi = max(start, my_first), min(start + counts[r], my_first + shares[r])
        if kept_hi > kept_lo:
            pieces.append((kept_lo, buf[(kept_lo - start) * pb : (kept_hi - start) * pb]))
        comm.waitall(requests)
        return torch.cat([piece for _, piece in sorted(pieces, key=lambda p: p[0])]) if pieces else buf[:0]

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict:
        state = super().state_dict()
        state.update(
            sparse_steps=self.sparse_steps,
            local_threshold=self.local_control.threshold,
            global_threshold=self.global_control.threshold,
            local_drift=self.local_control.drift,
            global_drift=self.global_control.drift,
            local_ideal=self.local_control.ideal,
            global_ideal=self.global_control.ideal,
            boundaries=list(self.boundaries),
        )
        return state

    def load_state_dict(self, state: dict) -> None:
        bounds = list(state["boundaries"])
        if len(bounds) != self.comm.size + 1 or bounds[0] != 0 or bounds[-1] != self.numel:
            raise ValueError(
                f"oktopk: checkpoint region boundaries {bounds[:3]}...{bounds[-1:]} do not fit "
                f"{self.comm.size} ranks and {self.numel} parameters"
            )
        super().load_state_dict(state)
        self.sparse_steps = int(state["sparse_steps"])
        self.local_control.threshold = float(state["local_threshold"])
        self.global_control.threshold = float(state["global_threshold"])
        self.local_control.drift = float(state["local_drift"])
        self.global_control.drift = float(state["global_drift"])
        self.local_control.ideal = float(state["local_ideal"])
        self.global_control.ideal = float(state["global_ideal"])
        self._set_boundaries(bounds)
