"""Ok-Topk now vs Ok-Topk at an earlier commit, side by side in one job on the same gradient stream.

    OMP_NUM_THREADS=1 mpiexec -n P .venv/bin/python bench/oktopk_vs_baseline.py --baseline 98e56a1 \
        [--numel 27569568] [--density 0.02] [--steps 24] [--warmup 4] [--out bench/results/oktopk_vs_98e56a1_P2]

The baseline's `compression/` and `comm/` packages are taken from the given commit with `git archive`
(so the commit must have the flat layout of 98e56a1 and earlier, where they sit at the top of the tree)
and loaded under those top-level names beside the installed `sparse_asr`. Every rank builds both
compressors with their default options and feeds them identical gradients (bench/comm_volume.py's
generator, the same step numbers); each step runs both, alternating which goes first, after a barrier,
so a busy machine slows both alike. Per step and compressor: wall time of `exchange` and of the whole
`step` (error feedback included), the slowest rank's; words received and messages sent per rank; the
global count over k. Medians of the times and means of the rest are taken over the steps after
`--warmup` (steps 0 .. warmup-1 run, untimed, so both are past their cold start). Machine load
(os.getloadavg) is printed before and after. With --profile, rank 0 also runs each compressor's timed
exchanges under cProfile and prints the functions that took the most time (their own time).
"""
import argparse
import cProfile
import importlib.util
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from comm_volume import GradientSource
from sparse_asr.comm import Communicator
from sparse_asr.compression.oktopk import OkTopk
from sparse_asr.training.launch import setup_process

REPO = Path(__file__).resolve().parent.parent
WORD = 4


def export_baseline(commit: str, into: Path) -> str:
    """Extract compression/ and comm/ of `commit` into `into`; returns the full commit hash."""
    full = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{commit}^{{commit}}"],
                          capture_output=True, text=True)
    if full.returncode != 0:
        raise SystemExit(f"oktopk_vs_baseline: --baseline {commit!r} is not a commit of {REPO}: {full.stderr.strip()}")
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", commit, "compression", "comm"],
                             capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"oktopk_vs_baseline: commit {commit} has no top-level compression/ and comm/ "
                         f"(only the flat layout of 98e56a1 and earlier is supported): "
                         f"{archive.stderr.decode().strip()}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return full.stdout.strip()


def load_package(name: str, root: Path):
    """Import root/name as the top-level package `name` (its own absolute imports resolve to it)."""
    spec = importlib.util.spec_from_file_location(name, root / name / "__init__.py",
                                                  submodule_search_locations=[str(root / name)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def timed_exchange(compressor, seconds: list, profile: cProfile.Profile | None):
    """Make compressor.exchange record its wall time in `seconds` (last entry = last call) and run
    under `profile` while profile.active is set."""
    exchange = compressor.exchange

    def wrapper(*args):
        t0 = time.perf_counter()
        if profile is not None and profile.active:
            out = profile.runcall(exchange, *args)
        else:
            out = exchange(*args)
        seconds.append(time.perf_counter() - t0)
        return out

    compressor.exchange = wrapper


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="commit to compare against (flat layout, e.g. 98e56a1)")
    parser.add_argument("--numel", type=int, default=27569568)
    parser.add_argument("--density", type=float, default=0.02)
    parser.add_argument("--steps", type=int, default=24, help="timed steps")
    parser.add_argument("--warmup", type=int, default=4, help="untimed steps first")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", action="store_true", help="cProfile the timed exchanges on rank 0")
    parser.add_argument("--top", type=int, default=15, help="functions listed per profile")
    parser.add_argument("--out", type=Path, default=None, help="write OUT.md and OUT.json (rank 0)")
    args = parser.parse_args()
    if args.steps < 1 or args.warmup < 0 or args.numel < 1:
        parser.error("--steps must be positive, --warmup non-negative, --numel positive")

    comm = Communicator()
    setup_process(comm, "cpu", threads=1)
    P, rank = comm.size, comm.rank
    tmp = tempfile.TemporaryDirectory(prefix="oktopk-baseline-") if rank == 0 else None
    root = comm.bcast_object(tmp.name if tmp else None)
    commit = export_baseline(args.baseline, Path(root)) if rank == 0 else None
    commit = comm.bcast_object(commit)
    comm.barrier()
    old_comm_module = load_package("comm", Path(root))
    old_compression = load_package("compression", Path(root))
    comm.barrier()
    if tmp:
        tmp.cleanup()

    source = GradientSource(args.numel, rank, args.seed)
    old_comm = old_comm_module.Communicator()
    new = OkTopk(comm, args.numel, args.density)
    old = old_compression.OkTopk(old_comm, args.numel, args.density)
    impls = {"baseline": (old, old_comm), "now": (new, comm)}
    exchange_s = {name: [] for name in impls}
    profiles = {name: cProfile.Profile() if args.profile and rank == 0 else None for name in impls}
    for name, (compressor, _) in impls.items():
        timed_exchange(compressor, exchange_s[name], profiles[name])
    rows = {name: [] for name in impls}  # per timed step: (exchange s, step s, bytes recv, msgs, global/k)
    load_before = os.getloadavg()
    for step in range(args.warmup + args.steps):
        grad = source.gradient(step)
        for profile in profiles.values():
            if profile is not None:
                profile.active = step >= args.warmup
        order = list(impls) if step % 2 == 0 else list(reversed(impls))
        for name in order:
            compressor, c = impls[name]
            flat = grad.clone()
            comm.barrier()
            with c.measure() as moved:
                t0 = time.perf_counter()
                stats = compressor.step(flat, step) if name == "baseline" else compressor.step(flat)
                seconds = time.perf_counter() - t0
            if step >= args.warmup:
                rows[name].append((exchange_s[name][-1], seconds, moved.bytes_recv, moved.msgs_sent,
                                   stats.selected_global / compressor.k))
    load_after = os.getloadavg()

    k = new.k
    unit = 2 * k * (P - 1) / P  # words: k pairs reduced to their owners, the lower bound
    results = {}
    for name, per_step in rows.items():
        mine = np.array(per_step)  # steps x 5
        slowest = mine[:, :2].copy()
        comm.allreduce_(torch.from_numpy(slowest), "max")
        recv = comm.allgather_object(float(mine[:, 2].mean()))
        msgs = comm.allgather_object(float(mine[:, 3].mean()))
        results[name] = {
            "exchange_ms_median": 1e3 * statistics.median(slowest[:, 0]),
            "step_ms_median": 1e3 * statistics.median(slowest[:, 1]),
            "words_recv_mean": float(np.mean(recv)) / WORD,
            "words_recv_busiest": float(np.max(recv)) / WORD,
            "messages_mean": float(np.mean(msgs)),
            "global_over_k_mean": float(mine[:, 4].mean()),
        }
    if rank != 0:
        return
    base, now = results["baseline"], results["now"]
    lines = [
        f"Ok-Topk at {commit[:7]} (baseline) vs now: P = {P}, n = {args.numel:,}, density = {args.density}, k = {k:,}, "
        f"1 thread per rank, steps {args.warmup}..{args.warmup + args.steps - 1} timed (both run every step, "
        f"alternating which goes first); times are medians of the slowest rank's; load average (1, 5, 15 min) "
        f"{load_before[0]:.1f} {load_before[1]:.1f} {load_before[2]:.1f} before, "
        f"{load_after[0]:.1f} {load_after[1]:.1f} {load_after[2]:.1f} after, on {os.cpu_count()} cores",
        "",
        "| impl | words received/step, mean [busiest] | mean / 2k(P-1)/P | global selected / k | messages/step "
        "| median ms per exchange | median ms per step |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        label = f"{commit[:7]}" if name == "baseline" else "now"
        lines.append(f"| {label} | {r['words_recv_mean']:,.0f} [{r['words_recv_busiest']:,.0f}] "
                     f"| {r['words_recv_mean'] / unit:.2f} | {r['global_over_k_mean']:.2f} | {r['messages_mean']:.1f} "
                     f"| {r['exchange_ms_median']:.0f} | {r['step_ms_median']:.0f} |")
    lines += ["", f"now / {commit[:7]}: exchange {now['exchange_ms_median'] / base['exchange_ms_median']:.2f}x, "
                  f"step {now['step_ms_median'] / base['step_ms_median']:.2f}x"]
    for name, profile in profiles.items():
        if profile is not None:
            out = io.StringIO()
            pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(args.top)
            lines += ["", f"Profile of {commit[:7] if name == 'baseline' else 'now'}'s exchange on rank 0, "
                          f"{args.steps} exchanges (own time, descending):", "```", out.getvalue().strip(), "```"]
    text = "\n".join(lines)
    print(text, flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".md").write_text(text + "\n")
        config = {"P": P, "numel": args.numel, "density": args.density, "k": k, "steps": args.steps,
                  "warmup": args.warmup, "seed": args.seed, "baseline": commit,
                  "loadavg_before": load_before, "loadavg_after": load_after}
        args.out.with_suffix(".json").write_text(json.dumps({"config": config, "results": results}, indent=1))


if __name__ == "__main__":
    main()
