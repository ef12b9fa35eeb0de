"""Speed of exact top-k selection vs threshold reuse, on a gradient-sized vector (lstman4: 27,569,568).

    .venv/bin/python bench/selection.py [--numel 27569568] [--densities 0.02 0.01] [--threads 1 2]
                                        [--repeats 5] [--devices cpu cuda]

Every method returns what Ok-Topk's local selection needs: the selected indices and the
threshold (the k-th largest |x|). Exact methods:
  torch.topk        topk of |x|, k-th value = the smallest returned
  torch.kthvalue    quickselect for the (n-k+1)-th smallest |x|, then compare + nonzero
  radix select      histograms of the float bits of |x| (4 rounds), then compare + nonzero
  topk_threshold_select (ours)
                    what Ok-Topk's exact steps call; by device: on CPU sample+refine (a threshold
                    estimated from 65,536 sampled |x| and set a little low, one compare + nonzero
                    keeping ~1.1k candidates, exact k-th among those), on CUDA torch.topk for the
                    k-th value, then one compare + nonzero (every index at or above it, sorted)
and the in-between step of Ok-Topk, threshold reuse: compare + nonzero + count with a known
threshold (the floor for any method that returns indices: one pass over x).
Each row is the median of --repeats timed runs (after one untimed warm-up run; the methods take
turns within each repeat); ratios are torch.topk's median / the method's median, same run. Every exact
method's threshold is checked equal to torch.topk's.

Data: heavy-tailed like a gradient: 40 "layers" of seeded sizes with log-uniform scales over three
decades, times Student-t (3 degrees of freedom) entries.
"""
import argparse
import statistics
import time

import torch

from sparse_asr.comm import Communicator
from sparse_asr.compression.selection import kth_largest_magnitude_radix, threshold_indices, topk_threshold_select
from sparse_asr.training.launch import setup_process

LSTMAN4_NUMEL = 27_569_568


def heavy_tailed(n: int, device: str, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    cuts = torch.sort(torch.randperm(n - 1, generator=g)[:39] + 1).values
    sizes = torch.diff(torch.cat([torch.tensor([0]), cuts, torch.tensor([n])]))
    scales = 10.0 ** (3 * torch.rand(40, generator=g) - 3)
    return (torch.repeat_interleave(scales, sizes) * _student_t(n, g)).to(device)


def _student_t(n: int, g: torch.Generator, df: float = 3.0) -> torch.Tensor:
    """Student-t draws from a seeded generator: normal / sqrt(chi2(df) / df)."""
    z = torch.randn(n, generator=g)
    chi2 = torch.randn(n, int(df), generator=g).pow(2).sum(1)
    return z / torch.sqrt(chi2 / df)


def method_topk(x, k):
    top = torch.topk(x.abs(), k, sorted=False)
    return top.indices, float(top.values.min())


def method_kthvalue(x, k):
    mag = x.abs()
    t = float(torch.kthvalue(mag, x.numel() - k + 1).values)
    return torch.nonzero(mag >= t).flatten(), t


def method_radix(x, k):
    t = kth_largest_magnitude_radix(x, k)
    return threshold_indices(x, t), t


def method_ours(x, k):
    return topk_threshold_select(x, k)


METHODS = [
    ("torch.topk", method_topk),
    ("torch.kthvalue", method_kthvalue),
    ("radix select", method_radix),
    ("topk_threshold_select (ours)", method_ours),
]


def timed(fns: dict, device: str, repeats: int) -> dict:
    """{name: (median seconds, last result)}. The functions take turns within each repeat, so a
    load change on a shared machine hits all of them alike."""

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    results = {name: fn() for name, fn in fns.items()}  # warm-up (allocator, kernels)
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            sync()
            t0 = time.perf_counter()
            results[name] = fn()
            sync()
            times[name].append(time.perf_counter() - t0)
    return {name: (statistics.median(times[name]), results[name]) for name in fns}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--numel", type=int, default=LSTMAN4_NUMEL)
    ap.add_argument("--densities", type=float, nargs="+", default=[0.02, 0.01])
    ap.add_argument("--threads", type=int, nargs="+", default=[1])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--devices", nargs="+", default=["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])
    args = ap.parse_args()

    comm, rows = Communicator(), []
    for device in args.devices:
        if device == "cuda" and not torch.cuda.is_available():
            raise SystemExit("--devices cuda: no CUDA device here")
        x = heavy_tailed(args.numel, device)
        for threads in args.threads if device == "cpu" else [torch.get_num_threads()]:
            setup_process(comm, "cpu", threads=threads)  # the CPU threads are this bench's variable
            for density in args.densities:
                k = max(1, round(density * args.numel))
                t_ref = float(torch.topk(x.abs(), k, sorted=False).values.min())
                fns = {name: (lambda fn=fn: fn(x, k)) for name, fn in METHODS}
                fns["threshold reuse"] = lambda: (threshold_indices(x, t_ref), t_ref)
                measured = timed(fns, device, args.repeats)
                base = measured["torch.topk"][0]
                for name, (seconds, (idx, t)) in measured.items():
                    if t != t_ref or idx.numel() < k:
                        raise AssertionError(f"{name}: threshold {t} != torch.topk's {t_ref} or too few indices")
                    exact = "n/a" if name == "threshold reuse" else "yes"
                    rows.append((device, threads, density, k, name, seconds, base / seconds, exact))

    print(f"numel = {args.numel:,}, float32, median of {args.repeats} runs; ratio = torch.topk time / method time\n")
    print("| device | threads | density | k | method | median ms | vs torch.topk | exact |")
    print("|---|---|---|---|---|---|---|---|")
    for device, threads, density, k, name, seconds, ratio, exact in rows:
        print(f"| {device} | {threads} | {density} | {k:,} | {name} | {seconds * 1e3:.1f} | {ratio:.2f}x | {exact} |")


if __name__ == "__main__":
    main()
