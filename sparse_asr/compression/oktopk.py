"""Ok-Topk sparse allreduce (Li & Hoefler, "Near-Optimal Sparse Allreduce", PPoPP 2022), DESIGN 4.

One step on every rank r, with acc = grad + residual and k = density * n:
  1. local selection S_r = {i : |acc_i| >= local threshold}. The threshold is exact (the k-th
     largest |acc|, compression.selection.topk_threshold_select) on the first step and every
     `local_threshold_interval` steps; in between it is reused and nudged (see `nudged`), and
     recomputed exactly at once if the reused one selects outside [k/2, 2k] (the guard);
  2. on the first step, every `repartition_interval` steps, and on steps 1, 2, 4, ... before the
     first interval, [0, n) is cut into P contiguous regions holding about equal numbers of
     selected entries (a global count histogram: one allreduce); every rank gets the same cuts;
  3. reduce: the pairs of S_r in region j go to rank j, point-to-point after one count exchange,
     with destination rotation (round i sends to rank+i, receives from rank-i); each owner sums
     what arrives for its region with its own pairs;
  4. global selection inside each region: |reduced| >= global threshold, exact (the k-th largest
     over all regions: radix select whose histograms are allreduced) on the first step and every
     `global_threshold_interval` steps, reused/nudged/guarded in between like the local one;
  5. the selected pairs are re-blocked (one alltoallv) so rank q holds the q-th contiguous block of
     about total/P pairs, then allgathered (allgatherv); all ranks get them sorted by index.
The base class divides by P and clears exactly applied = S_r ∩ G from the residual, computed with
an order-free membership test (the original intersected unsorted arrays and left residuals
uncleared on recompute steps). P = 1 runs the same code: no transfers, G = S_0 above the global
threshold. Volume per rank ~ 2k(P-1)/P words for the reduce + 2k(P-1)/P for the allgather, plus
small count/histogram exchanges, below the paper's 6k(P-1)/P bound.

Point-to-point rather than alltoallv for the reduce: the rotation is the algorithm's, not left to
the MPI library, empty messages are skipped, and the same isend/irecv calls exist in
torch.distributed. (On this project's 2-core machine a timing comparison would be noise.)
"""
from __future__ import annotations

import dataclasses
import math
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from sparse_asr.compression.base import Cost, Exchange, SparseCompressor, Timer, pack_pairs, pair_bytes, unpack_pairs
from sparse_asr.compression.selection import isin_sorted, kth_largest_magnitude_radix, threshold_indices, topk_threshold_select

# A reused threshold is lowered by a factor (1 - s) when its count fell below 3k/4 and raised by
# (1 + s) above 5k/4. s starts at NUDGE and doubles, up to MAX_NUDGE, while the count stays out of
# that band on the same side (the error-feedback transient after a cold start pushes the count
# up for tens of steps); it falls back to NUDGE once the count is back or crosses over.
NUDGE = 0.01
MAX_NUDGE = 0.16
# Repartition histogram: about 4 selected entries per rank per bin, at most 1024 bins (its
# allreduce then costs ~2% of the pairs' volume at k = 500, far less for real models).
MAX_HISTOGRAM_BINS = 1024
MIN_THRESHOLD = float(torch.finfo(torch.float32).tiny)  # never select exact zeros
REDUCE_TAG = 4711
PHASES = ("repartition", "reduce", "global_threshold", "global_count", "rebalance", "allgather")


def nudged(threshold: float, last_nudge: float, count: int, k: int) -> tuple[float, float]:
    """(threshold for the next step, signed nudge applied), given the count it selected this step
    and the nudge applied before (0.0 after an exact recomputation or a count in band)."""
    if 0.75 * k <= count <= 1.25 * k:
        return threshold, 0.0
    direction = 1.0 if count > 1.25 * k else -1.0
    size = min(2 * abs(last_nudge), MAX_NUDGE) if last_nudge * direction > 0 else NUDGE
    return max(threshold * (1.0 + direction * size), MIN_THRESHOLD), direction * size


def above(indices: torch.Tensor, values: torch.Tensor, threshold: float):
    keep = values.abs() >= threshold
    return indices[keep], values[keep]


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


@dataclass(frozen=True)
class OkTopkOptions:
    local_threshold_interval: int = 32  # exact local threshold every N steps (reused in between)
    global_threshold_interval: int = 32  # exact global threshold every N steps
    repartition_interval: int = 64  # regions rebalanced every N steps

    def check(self, name: str) -> None:
        for f in dataclasses.fields(self):
            if getattr(self, f.name) < 1:
                raise ValueError(f"{name}: compression.options.{f.name} must be a positive integer, "
                                 f"got {getattr(self, f.name)!r}")


class OkTopk(SparseCompressor):
    name = "oktopk"
    Options = OkTopkOptions

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        comm, numel = self.comm, self.numel
        self.local_threshold_interval = self.options.local_threshold_interval
        self.global_threshold_interval = self.options.global_threshold_interval
        self.repartition_interval = self.options.repartition_interval
        # Everything below is state a checkpoint must carry to resume exactly.
        self.sparse_steps = 0  # exchanges done so far (the intervals count these)
        self.local_threshold = 0.0
        self.global_threshold = 0.0
        self.local_nudge = 0.0  # signed factor last applied to the reused threshold (see nudged)
        self.global_nudge = 0.0
        P = comm.size
        self.boundaries = [numel * j // P for j in range(P + 1)]  # replaced on the first step

    @staticmethod
    def cost(n: int, k: int, P: int) -> Cost:
        """The paper's bounds [2k(P-1)/P, 6k(P-1)/P]; typically k pairs reduced to balanced regions and k
        pairs allgathered, 4k(P-1)/P. Messages: the reduce and the allgather, plus the threshold rounds."""
        rounds = math.ceil(math.log2(P)) if P > 1 else 0
        return Cost(2 * k * (P - 1) / P, 6 * k * (P - 1) / P, 4 * k * (P - 1) / P, 2 * (P - 1) + 2 * rounds,
                    "[2k(P-1)/P, 6k(P-1)/P]")

    # ------------------------------------------------------------------ one step
    def exchange(self, acc: torch.Tensor) -> Exchange:
        comm, k = self.comm, self.k
        repartition = self._repartition_due()
        figures = {f"{d}_{phase}": 0.0 for phase in PHASES for d in ("bytes_recv", "bytes_sent", "seconds")}

        # 1. local selection
        with Timer() as t_local:
            idx, recomputed_local, guard_local = self._select_local(acc, self._due(self.local_threshold_interval))
            vals = acc[idx]
        local_threshold_used = self.local_threshold

        # 2. space repartition
        if repartition:
            with self._phase(figures, "repartition"):
                self.boundaries = self._repartition(idx)

        # 3. reduce to region owners
        with self._phase(figures, "reduce"):
            region_idx, region_vals, recv_pairs = self._reduce(idx, vals)

        # 4. global selection inside my region
        with Timer() as t_global:
            g_idx, g_vals, counts, recomputed_global, guard_global = self._select_global(
                region_idx, region_vals, self._due(self.global_threshold_interval), figures
            )
        global_threshold_used = self.global_threshold

        # 5. balanced allgather of the selected pairs
        all_idx, all_vals, imbalance_before, imbalance_after = self._balanced_allgather(g_idx, g_vals, counts, figures)

        # Applied on this rank: its selected entries that made it into the global selection.
        # isin_sorted assumes no order of either array (the original's intersection did).
        applied = idx[isin_sorted(idx, all_idx)]

        count_local, count_global = int(idx.numel()), int(all_idx.numel())
        if recomputed_local:
            self.local_nudge = 0.0
        if recomputed_global:
            self.global_nudge = 0.0
        self.local_threshold, self.local_nudge = nudged(self.local_threshold, self.local_nudge, count_local, k)
        self.global_threshold, self.global_nudge = nudged(self.global_threshold, self.global_nudge, count_global, k)
        self.sparse_steps += 1

        figures.update(
            local_count=float(count_local),
            local_count_over_k=count_local / k,
            global_count=float(count_global),
            global_count_over_k=count_global / k,
            local_threshold=local_threshold_used,
            global_threshold=global_threshold_used,
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
        return Exchange(
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
        before = self.comm.counts()
        yield
        moved = self.comm.counts() - before
        figures[f"bytes_recv_{name}"] += moved.bytes_recv
        figures[f"bytes_sent_{name}"] += moved.bytes_sent
        figures[f"seconds_{name}"] += moved.seconds

    def _select_local(self, acc: torch.Tensor, due: bool) -> tuple[torch.Tensor, bool, bool]:
        """(selected indices, sorted; recomputed exactly?; was that the guard?)."""
        k = self.k
        if not due:
            idx = threshold_indices(acc, self.local_threshold)
            if in_guard_band(idx.numel(), k):
                return idx, False, False
        idx, t = topk_threshold_select(acc, k)
        self.local_threshold = max(t, MIN_THRESHOLD)
        if t < MIN_THRESHOLD:  # fewer than k nonzeros: never send zeros
            idx = idx[acc[idx].abs() >= MIN_THRESHOLD]
        return idx, True, not due

    def _select_global(self, region_idx, region_vals, due: bool, figures: dict):
        """My region's pairs with |value| >= the global threshold, every owner's count of them,
        recomputed exactly?, was that the guard? The counts are exchanged anyway for the
        allgather, so checking the guard band costs nothing unless it fires."""
        k, comm = self.k, self.comm
        if not due:
            g_idx, g_vals = above(region_idx, region_vals, self.global_threshold)
            with self._phase(figures, "global_count"):
                counts = comm.allgather_int(g_idx.numel())
            if in_guard_band(sum(counts), k):
                return g_idx, g_vals, counts, False, False
        with self._phase(figures, "global_threshold"):
            # The regions are disjoint parts of [0, n): total counts fit int32 when n does.
            count_dtype = torch.int32 if self.numel < 2**31 else torch.int64
            t = kth_largest_magnitude_radix(region_vals, k, lambda h: comm.allreduce_(h), count_dtype)
        self.global_threshold = max(t, MIN_THRESHOLD)
        g_idx, g_vals = above(region_idx, region_vals, self.global_threshold)
        with self._phase(figures, "global_count"):
            counts = comm.allgather_int(g_idx.numel())
        return g_idx, g_vals, counts, True, not due

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
        """Send my pairs (any order) of region j to rank j; return my region's summed pairs (indices sorted,
        unique) and how many pairs arrived from others. Round i sends to rank+i and receives from
        rank-i, all posted non-blocking after one count exchange, so no owner is hit by all at once."""
        comm, P, r = self.comm, self.comm.size, self.comm.rank
        order = torch.argsort(idx)  # selections come sorted already (cheap); any order works
        idx, vals = idx[order], vals[order]
        bounds = torch.tensor(self.boundaries, dtype=idx.dtype, device=idx.device)
        cuts = torch.searchsorted(idx, bounds).tolist()  # region j is idx[cuts[j]:cuts[j+1]]
        send_counts = [cuts[j + 1] - cuts[j] for j in range(P)]
        recv_counts = comm.alltoall_counts(send_counts)
        buf = pack_pairs(idx.to(self.index_dtype), vals)
        pb = pair_bytes(self.index_dtype)
        received, requests = [], []
        for i in range(1, P):
            src = (r - i) % P
            if recv_counts[src]:
                received.append(torch.empty(recv_counts[src] * pb, dtype=torch.uint8, device=buf.device))
                requests.append(comm.irecv(received[-1], src, tag=REDUCE_TAG))
        for i in range(1, P):
            dst = (r + i) % P
            if send_counts[dst]:
                requests.append(comm.isend(buf[cuts[dst] * pb : cuts[dst + 1] * pb], dst, tag=REDUCE_TAG))
        comm.waitall(requests)
        mine = unpack_pairs(buf[cuts[r] * pb : cuts[r + 1] * pb], self.index_dtype)
        parts = [mine] + [unpack_pairs(b, self.index_dtype) for b in received]
        all_idx = torch.cat([p[0] for p in parts])
        all_vals = torch.cat([p[1] for p in parts])
        region_idx, where = torch.unique(all_idx, sorted=True, return_inverse=True)
        region_vals = torch.zeros(region_idx.numel(), dtype=torch.float32, device=all_vals.device)
        region_vals.index_add_(0, where, all_vals)
        return region_idx, region_vals, sum(recv_counts) - recv_counts[r]

    def _balanced_allgather(self, g_idx: torch.Tensor, g_vals: torch.Tensor, counts: list[int], figures: dict):
        """Allgather every owner's selected pairs (concatenated in owner order, hence sorted),
        after re-blocking them so rank q contributes a contiguous block of about total/P.
        Returns (indices, values, max/mean contribution before, after)."""
        comm, P, r = self.comm, self.comm.size, self.comm.rank
        pb = pair_bytes(self.index_dtype)
        total = sum(counts)
        blocks = [total // P + (1 if q < total % P else 0) for q in range(P)]
        buf = pack_pairs(g_idx.to(self.index_dtype), g_vals)
        if counts != blocks:
            start = sum(counts[:r])
            send = []
            for q in range(P):
                b_start = sum(blocks[:q])
                overlap = min(start + counts[r], b_start + blocks[q]) - max(start, b_start)
                send.append(max(0, overlap) * pb)
            with self._phase(figures, "rebalance"):
                buf, _ = comm.alltoallv(buf, send)  # arrives in source order: my block, in order
        with self._phase(figures, "allgather"):
            out, _ = comm.allgatherv(buf, counts=[b * pb for b in blocks])
        indices, values = unpack_pairs(out, self.index_dtype)
        mean = total / P
        before = max(counts) / mean if total else 1.0
        after = max(blocks) / mean if total else 1.0
        return indices, values, before, after

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict:
        state = super().state_dict()
        state.update(
            sparse_steps=self.sparse_steps,
            local_threshold=self.local_threshold,
            global_threshold=self.global_threshold,
            local_nudge=self.local_nudge,
            global_nudge=self.global_nudge,
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
        self.local_threshold = float(state["local_threshold"])
        self.global_threshold = float(state["global_threshold"])
        self.local_nudge = float(state["local_nudge"])
        self.global_nudge = float(state["global_nudge"])
        self.boundaries = bounds
