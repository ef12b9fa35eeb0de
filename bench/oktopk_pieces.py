"""How close is Ok-Topk's exchange to one pass over memory? One rank's step, piece by piece, an earlier
commit's code vs now, beside the streaming floor measured in the same run.

    .venv/bin/python bench/oktopk_pieces.py --baseline 1579905 [--numel 27569568] [--density 0.02] [--P 2] \
        [--repeats 7]

One process, one thread. The floor is one `d += b` over n float32 (two reads and a write of n entries: a pass
over memory). The step is rank 0's part of a P-rank step at a reused threshold (31 steps in 32 reuse both
thresholds), without MPI: the other ranks' messages are made beforehand from their own accumulators (the
synthetic generator's gradients, 4 more steps' worth of the shared part piled up in each residual, so that
the top entries overlap as in training), and the allgather's output is assembled untimed. The regions split
the selected entries evenly (as repartitioning does); the thresholds are the exact k-th largest (local: of
each rank's |acc|; global: of the owners' sums). Pieces, in the order a step runs them:
  accumulate        residual += grad
  local scan        the entries with |acc| >= t, indices and values
  pack              the selection as (index, value) records
  counts and cuts   where each owner's region starts in the selection; the count above t (1 + 2%)
  merge received    the P runs at the owner (each sorted by index) summed by index
  global scan       the owner's sums >= the global threshold, packed for the allgather
  unpack            the allgathered records as indices and values
  applied           this rank's selected entries that made it into the global selection
  zero output       the gradient's buffer cleared for the update
  scatter + clear   update[idx] = values / P and residual[applied] = 0
Each repeat runs the floor, the old step and the new one, in turns (a busy machine slows all alike), from the
same state; the table gives medians and checks that both steps leave the same residual and update, bit for
bit. The baseline's sparse_asr is imported as sparse_asr_baseline (bench/oktopk_vs_baseline.py's export); its
steps are restated here as its OkTopk.exchange and SparseCompressor.step ran them, and so are now's (on the
CPU kernels: compression/kernels.py, which needs numba).
"""
import argparse
import bisect
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from sparse_asr.compression.synthetic import GradientSource
from oktopk_vs_baseline import export_baseline, import_baseline
from sparse_asr.comm import Communicator
from sparse_asr.compression import base, kernels, selection
from sparse_asr.compression.oktopk import ELASTICITY_STEP, sum_sorted_runs
from sparse_asr.training.launch import setup_process

PIECES = ("accumulate", "local scan", "pack", "counts and cuts", "merge received", "global scan", "unpack",
          "applied", "zero output", "scatter + clear")
HOW = {
    "old": {"accumulate": "torch add_", "local scan": "numpy over cache-sized chunks, values picked up",
            "pack": "idx.to(int32), torch.cat of two columns", "counts and cuts": "torch searchsorted, abs + sum",
            "merge received": "cat + unpack copies + numpy stable sort + index_add",
            "global scan": "numpy scan, two gathers, pack", "unpack": "two copies",
            "applied": "numpy stable sort of both (a merge)", "zero output": "torch zero_",
            "scatter + clear": "torch index_put (indices to int64 first)"},
    "now": {"accumulate": "in the local scan", "local scan": "one kernel: accumulate + zero + scan into records",
            "pack": "none: the scan wrote records", "counts and cuts": "bisect on the records, counting kernel",
            "merge received": "linear merge kernel on the records", "global scan": "kernel into records",
            "unpack": "views of the records", "applied": "linear intersection kernel",
            "zero output": "in the local scan", "scatter + clear": "kernels, indices as they are"},
}


class Data:
    """Rank 0's state before the step and what the other ranks contribute to it."""

    def __init__(self, n: int, k: int, P: int):
        sources = [GradientSource(n, r) for r in range(P)]
        residuals = [4 * s.shared * s.scale for s in sources]
        self.grad = sources[0].gradient(0)
        self.residual = residuals[0]
        accs = [s.gradient(0) + r for s, r in zip(sources, residuals)]
        self.t_local = selection.kth_largest_magnitude(accs[0], k)
        picks = [selection.threshold_select(a, selection.kth_largest_magnitude(a, k)) for a in accs]
        everything = torch.cat([i for i, _ in picks]).double()
        cuts = [int(everything.quantile(q / P)) for q in range(1, P)] if P > 1 else []
        self.bounds = [0] + cuts + [n]
        # owner q's runs (its own first, then from rank q - 1, q - 2, ... as the rounds bring them), summed
        regions = []
        for q in range(P):
            lo, hi = self.bounds[q], self.bounds[q + 1]
            order = [(q - i) % P for i in range(P)]
            runs = [(i[(i >= lo) & (i < hi)].int(), v[(i >= lo) & (i < hi)]) for i, v in (picks[r] for r in order)]
            if q == 0:  # what arrives, one run per sender, in one buffer (as MPI's receives leave it)
                self.received = [base.pack_pairs(*run) for run in runs[1:]]
                self.arrived = torch.cat(self.received)
            regions.append(sum_sorted_runs(torch.cat([i for i, _ in runs]), torch.cat([v for _, v in runs])))
        sums = torch.cat([v for _, v in regions])
        self.t_global = selection.kth_largest_magnitude(sums[sums != 0], k)
        self.others_global = [base.pack_pairs(i[v.abs() >= self.t_global], v[v.abs() >= self.t_global])
                              for i, v in regions[1:]]
        self.P = P


def old_step(mod, data: Data, residual, grad, lap):
    """A reuse step as the baseline's OkTopk.exchange and SparseCompressor.step ran it (its functions)."""
    sel, base_, okt = mod["selection"], mod["base"], mod["oktopk"]
    P, bounds = data.P, torch.tensor(data.bounds)
    residual += grad
    lap("accumulate")
    idx, vals = sel.threshold_select(residual, data.t_local)
    lap("local scan")
    buf = base_.pack_pairs(idx.to(torch.int32), vals)
    lap("pack")
    cuts = torch.searchsorted(idx, bounds).tolist()
    int((vals.abs() >= data.t_local * (1 + ELASTICITY_STEP)).sum())
    lap("counts and cuts")
    runs = torch.cat([buf[cuts[0] * 8: cuts[1] * 8]] + data.received)
    region_idx, region_vals = okt.sum_sorted_runs(*base_.unpack_pairs(runs, torch.int32))
    lap("merge received")
    keep = sel.threshold_indices(region_vals, data.t_global)
    g_idx, g_vals = region_idx[keep], region_vals[keep]
    int((g_vals.abs() >= data.t_global * (1 + ELASTICITY_STEP)).sum())
    gathered = base_.pack_pairs(g_idx.to(torch.int32), g_vals)
    lap("global scan")
    gathered = torch.cat([gathered] + data.others_global)  # the allgather's output (MPI's part, untimed)
    lap(None)
    all_idx, all_vals = base_.unpack_pairs(gathered, torch.int32)
    lap("unpack")
    applied = sel.intersect_unique(idx, all_idx)
    lap("applied")
    grad.zero_()
    lap("zero output")
    grad[all_idx.long()] = all_vals / P
    residual[applied.long()] = 0.0
    lap("scatter + clear")


class NewStep:
    """The same step as now's OkTopk.exchange and SparseCompressor.step run it on the CPU kernels."""

    def __init__(self):
        self.local, self.region_pairs = kernels.PairBuffer(), kernels.PairBuffer()
        self.region = (torch.empty(0, dtype=torch.int32), torch.empty(0, dtype=torch.float32))

    def __call__(self, data: Data, residual, grad, lap):
        P = data.P
        lap("accumulate")
        count = kernels.accumulate_select(residual, grad, data.t_local, self.local)
        idx, vals = self.local.columns(count)
        lap("local scan")
        buf = base.pack_pairs(idx, vals)
        lap("pack")
        cuts = [bisect.bisect_left(idx.numpy(), b) for b in data.bounds]
        selection.count_at_least(vals, data.t_local * (1 + ELASTICITY_STEP))
        lap("counts and cuts")
        lengths = [r.numel() // 8 for r in data.received]
        total = cuts[1] + sum(lengths)
        if self.region[0].numel() < total:
            self.region = (torch.empty(2 * total, dtype=torch.int32), torch.empty(2 * total, dtype=torch.float32))
        region = (self.region[0][:total], self.region[1][:total])
        own = base.unpack_pairs(buf[: cuts[1] * 8], torch.int32)
        kernels.merge_runs(own, base.unpack_pairs(data.arrived, torch.int32), lengths, region, compact=False)
        lap("merge received")
        count = kernels.select_pairs(*region, data.t_global, self.region_pairs)
        g_idx, g_vals = self.region_pairs.columns(count)
        selection.count_at_least(g_vals, data.t_global * (1 + ELASTICITY_STEP))
        gathered = base.pack_pairs(g_idx, g_vals)
        lap("global scan")
        gathered = torch.cat([gathered] + data.others_global)
        lap(None)
        all_idx, all_vals = base.unpack_pairs(gathered, torch.int32)
        lap("unpack")
        applied = selection.intersect_unique(idx, all_idx)
        lap("applied")
        lap("zero output")
        kernels.scatter_scaled(grad, all_idx, all_vals, P)
        kernels.clear(residual, applied)
        lap("scatter + clear")


def timed(step, *args) -> tuple[dict, float]:
    """Run step(*args, lap): each lap(name) closes a piece (None: untimed); returns ({piece: s}, timed total s)."""
    laps, last = {}, [time.perf_counter()]

    def lap(name):
        now = time.perf_counter()
        if name is not None:
            laps[name] = laps.get(name, 0.0) + now - last[0]
        last[0] = time.perf_counter()

    step(*args, lap)
    return laps, sum(laps.values())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="commit with the old code (package layout, e.g. 1579905)")
    parser.add_argument("--numel", type=int, default=27569568)
    parser.add_argument("--density", type=float, default=0.02)
    parser.add_argument("--P", type=int, default=2, help="ranks (rank 0's step is timed)")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    if args.P < 2 or args.repeats < 1:
        parser.error("--P must be at least 2 (the merge needs runs from others), --repeats positive")
    if not kernels.ENABLED:
        raise SystemExit("oktopk_pieces: now's step runs on compression/kernels.py, which needs numba "
                         "(pip install -r requirements.txt) and SPARSE_ASR_KERNELS unset")
    setup_process(Communicator(), "cpu", threads=1)
    with tempfile.TemporaryDirectory(prefix="oktopk-baseline-") as root:
        commit = export_baseline(args.baseline, Path(root))
        old = {name: import_baseline(Path(root), f"compression.{name}") for name in ("selection", "base", "oktopk")}

    n, P = args.numel, args.P
    k = max(1, round(args.density * n))
    data = Data(n, k, P)
    state = {w: (data.residual.clone(), data.grad.clone()) for w in ("old", "now")}
    floor_d, floor_b = torch.zeros(n), torch.ones(n)
    new_step = NewStep()
    steps = {"old": lambda residual, grad, lap: old_step(old, data, residual, grad, lap),
             "now": lambda residual, grad, lap: new_step(data, residual, grad, lap)}

    def floor(lap):
        floor_d.add_(floor_b)
        lap("floor")

    pieces = {w: {p: [] for p in PIECES} for w in steps}
    totals = {w: [] for w in steps}
    floors = []
    load_before = os.getloadavg()
    for rep in range(args.repeats + 1):  # the first round is untimed (compilation, first touch of the buffers)
        order = ["floor", "old", "now"] if rep % 2 else ["now", "old", "floor"]
        for which in order:
            if which == "floor":
                laps, total = timed(floor)
                if rep:
                    floors.append(total)
                continue
            residual, grad = state[which]
            residual.copy_(data.residual)
            grad.copy_(data.grad)
            laps, total = timed(steps[which], residual, grad)
            if rep:
                totals[which].append(total)
                for p in PIECES:
                    pieces[which][p].append(laps.get(p, 0.0))
        if rep == 0:
            same = all(torch.equal(state["old"][i], state["now"][i]) for i in (0, 1))
    load_after = os.getloadavg()

    floor_ms = 1e3 * statistics.median(floors)
    ms = {w: {p: 1e3 * statistics.median(pieces[w][p]) for p in PIECES} for w in steps}
    low = {w: {p: 1e3 * min(pieces[w][p]) for p in PIECES} for w in steps}
    step_ms = {w: 1e3 * statistics.median(totals[w]) for w in steps}
    step_low = {w: 1e3 * min(totals[w]) for w in steps}
    print(f"One rank's Ok-Topk step at reused thresholds, {commit[:7]} vs now: n = {n:,}, k = {k:,}, P = {P} "
          f"(no MPI), 1 thread; ms: median (minimum) of {args.repeats} repeats taking turns with the floor; "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores; load average (1, 5, 15 min) "
          f"{' '.join(f'{x:.1f}' for x in load_before)} before, {' '.join(f'{x:.1f}' for x in load_after)} after\n")
    print(f"| piece | {commit[:7]} | ms | x floor | now | ms | x floor |")
    print("|---|---|---|---|---|---|---|")
    for p in PIECES:
        print(f"| {p} | {HOW['old'][p]} | {ms['old'][p]:.1f} ({low['old'][p]:.1f}) | {ms['old'][p] / floor_ms:.2f} "
              f"| {HOW['now'][p]} | {ms['now'][p]:.1f} ({low['now'][p]:.1f}) | {ms['now'][p] / floor_ms:.2f} |")
    print(f"| **step** (no MPI) | | **{step_ms['old']:.1f}** ({step_low['old']:.1f}) "
          f"| **{step_ms['old'] / floor_ms:.2f}** | | **{step_ms['now']:.1f}** ({step_low['now']:.1f}) "
          f"| **{step_ms['now'] / floor_ms:.2f}** |")
    print(f"| floor: one `d += b` over n | | {floor_ms:.1f} ({1e3 * min(floors):.1f}) | 1 | | | 1 |")
    print(f"\nnow / {commit[:7]}: step {step_ms['now'] / step_ms['old']:.2f}x ({step_ms['old'] / step_ms['now']:.1f}x "
          f"faster); minima: step {step_low['now'] / (1e3 * min(floors)):.2f}x the floor now, "
          f"{step_low['old'] / (1e3 * min(floors)):.2f}x at {commit[:7]}; the same residual and update bit for bit: "
          f"{'yes' if same else 'NO'}")

if __name__ == "__main__":
    main()
