"""What each change to Ok-Topk's step bought: the pieces of one exchange, old (an earlier commit's code) vs now.

    .venv/bin/python bench/oktopk_pieces.py --baseline 98e56a1 [--numel 27569568] [--density 0.02] [--P 2] [--repeats 7]

One process, one thread. The data are two ranks' accumulated gradients from bench/comm_volume.py's generator
(rank r's gradient of step 0 plus 4 more steps' worth of the shared part, so the top entries overlap as in
training); k = density * n. Each piece runs old and new on the same inputs, taking turns within every repeat
(a busy machine slows both alike); the table gives medians and checks that both give the same result:
  threshold scan    a reused threshold: indices (and values) of |acc| >= t over all n entries
  exact threshold   the k-th largest |acc| and the entries at or above it (sample and refine)
  pack + unpack     k (index, value) pairs to and from one byte buffer
  merge received    the P runs arriving at an owner (each sorted) summed by index
  applied           this rank's selection that made it into the global one
  global threshold  radix select over an owner's reduced values (one rank: no histogram exchange)
The old code is loaded from the commit (bench/oktopk_vs_baseline.py's loader); the old merge and applied steps
were inline in OkTopk._reduce / exchange and are restated here as they were.
"""
import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from sparse_asr.compression.synthetic import GradientSource
from oktopk_vs_baseline import export_baseline, load_package
from sparse_asr.comm import Communicator
from sparse_asr.compression import base, selection
from sparse_asr.compression.oktopk import RADIX_BINS, sum_sorted_runs
from sparse_asr.training.launch import setup_process


def old_merge(local_idx, idx, vals):
    """98e56a1's OkTopk._reduce: an argsort of the (already sorted) local selection before sending,
    then, on the owner, torch.unique (another sort) and index_add over what arrived."""
    torch.argsort(local_idx)
    region_idx, where = torch.unique(idx, sorted=True, return_inverse=True)
    region_vals = torch.zeros(region_idx.numel(), dtype=torch.float32)
    region_vals.index_add_(0, where, vals)
    return region_idx, region_vals


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="commit with the old code (flat layout, e.g. 98e56a1)")
    parser.add_argument("--numel", type=int, default=27569568)
    parser.add_argument("--density", type=float, default=0.02)
    parser.add_argument("--P", type=int, default=2, help="ranks whose selections the owner merges")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    setup_process(Communicator(), "cpu", threads=1)
    with tempfile.TemporaryDirectory(prefix="oktopk-baseline-") as root:
        commit = export_baseline(args.baseline, Path(root))
        load_package("comm", Path(root))
        old = load_package("compression", Path(root))
    old_selection, old_base = old.selection, old.base

    n, P = args.numel, args.P
    k = max(1, round(args.density * n))
    accs = []
    for r in range(P):
        source = GradientSource(n, r)
        accs.append(source.gradient(0) + 4 * source.shared * source.scale)
    acc = accs[0]
    t = selection.kth_largest_magnitude(acc, k)
    selections = [selection.threshold_select(a, selection.kth_largest_magnitude(a, k)) for a in accs]
    idx, vals = selections[0]
    # The first owner's region: [0, the P-quantile of all selected indices), as repartitioning cuts it.
    region = int(torch.cat([i for i, _ in selections]).float().quantile(1 / P))
    runs = [(i[i < region].int(), v[i < region]) for i, v in selections]
    run_idx, run_vals = torch.cat([i for i, _ in runs]), torch.cat([v for _, v in runs])
    merged_idx, merged_vals = sum_sorted_runs(run_idx, run_vals)
    owner_vals = merged_vals[merged_vals != 0]
    owner_t = selection.kth_largest_magnitude(owner_vals, k // P)  # this owner's share of the global selection
    global_idx = torch.cat([merged_idx[merged_vals.abs() >= owner_t].long(),
                            idx[idx >= region][::2]])  # ~ the allgather's
    near = owner_t * 1.05  # a reused threshold, 5% off

    def same(a, b) -> bool:
        if isinstance(a, tuple):
            return all(same(x, y) for x, y in zip(a, b))
        if isinstance(a, torch.Tensor):
            return torch.equal(a.long() if not a.is_floating_point() else a,
                               b.long() if not b.is_floating_point() else b)
        return a == b

    pieces = [
        ("threshold scan", lambda: old_selection.threshold_indices(acc, t),
         lambda: selection.threshold_select(acc, t)[0],
         "torch nonzero over abs(acc) >= t", "numpy over cache-sized chunks"),
        ("threshold scan + values", lambda: (lambda i: (i, acc[i]))(old_selection.threshold_indices(acc, t)),
         lambda: selection.threshold_select(acc, t), "then acc[idx]", "values picked up during the scan"),
        ("exact threshold", lambda: old_selection.topk_threshold_select(acc, k),
         lambda: selection.topk_threshold_select(acc, k),
         "sample+refine, full abs(acc) and torch scan", "sample+refine on the chunked scan"),
        ("pack + unpack", lambda: old_base.unpack_pairs(old_base.pack_pairs(idx.int(), vals), torch.int32),
         lambda: base.unpack_pairs(base.pack_pairs(idx.int(), vals), torch.int32), "byte-wide columns", "4-byte words"),
        ("merge received", lambda: old_merge(idx, run_idx.long(), run_vals),
         lambda: (lambda i, v: (i[v != 0], v[v != 0]))(*sum_sorted_runs(run_idx, run_vals)),
         "argsort + torch.unique + index_add", "one stable sort (timsort merges the runs) + index_add"),
        ("applied", lambda: idx[old_selection.isin_sorted(idx, global_idx)],
         lambda: selection.intersect_unique(idx, global_idx),
         "sort + torch.searchsorted", "one stable sort of both (a merge)"),
        ("global threshold", lambda: old_selection.kth_largest_magnitude_radix(owner_vals, k // P),
         lambda: selection.kth_largest_magnitude_radix(owner_vals, k // P, near=near, max_bins=RADIX_BINS[1]),
         "4 rounds of 256 bins", "2 rounds of 4096 bins, the first around the reused threshold"),
    ]
    rows = []
    load_before = os.getloadavg()[0]
    for name, old_fn, new_fn, old_how, new_how in pieces:
        times = {"old": [], "new": []}
        results = {}
        for rep in range(args.repeats):
            for which, fn in (("old", old_fn), ("new", new_fn)) if rep % 2 == 0 else (("new", new_fn), ("old", old_fn)):
                t0 = time.perf_counter()
                results[which] = fn()
                times[which].append(time.perf_counter() - t0)
        old_ms, new_ms = (1e3 * statistics.median(times[w]) for w in ("old", "new"))
        rows.append((name, old_how, old_ms, new_how, new_ms, same(results["old"], results["new"])))

    print(f"Pieces of one Ok-Topk exchange, {commit[:7]} vs now: n = {n:,}, k = {k:,}, P = {P} (merge and global "
          f"threshold: the first of P owners), 1 thread, median of {args.repeats} (taking turns); load average "
          f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after, on {os.cpu_count()} cores\n")
    print(f"| piece | {commit[:7]} | ms | now | ms | speedup | same result |")
    print("|---|---|---|---|---|---|---|")
    for name, old_how, old_ms, new_how, new_ms, equal in rows:
        print(f"| {name} | {old_how} | {old_ms:.1f} | {new_how} | {new_ms:.1f} | {old_ms / new_ms:.1f}x "
              f"| {'yes' if equal else 'NO'} |")


if __name__ == "__main__":
    main()
