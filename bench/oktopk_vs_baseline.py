"""Ok-Topk now vs Ok-Topk at an earlier commit, side by side in one job on the same gradient stream.

    OMP_NUM_THREADS=1 mpiexec -n P .venv/bin/python bench/oktopk_vs_baseline.py --baseline 1579905 \
        [--numel 27569568] [--density 0.02] [--steps 24] [--warmup 4] [--out bench/results/oktopk_vs_1579905_P2]

The baseline's `sparse_asr/` package is taken from the given commit with `git archive` (a commit with the
package layout) and imported as the package `sparse_asr_baseline` beside the installed `sparse_asr`: its own
imports of sparse_asr are renamed to it when it is extracted, so an ordinary import finds it. The streaming
floor, one `d += b` over n float32 (one pass over memory), is timed in the same steps. Every rank builds both
compressors with their default options and feeds them identical gradients (bench/comm_volume.py's
generator, the same step numbers); each step runs both, alternating which goes first, after a barrier,
so a busy machine slows both alike. Per step and compressor: wall time of `exchange` and of the whole
`step` (error feedback included), the slowest rank's, the step also as a multiple of the floor; words
received and messages sent per rank; the global count over k. Medians of the times and means of the rest
are taken over the steps after `--warmup` (steps 0 .. warmup-1 run, untimed, so both are past their cold
start). Machine load (os.getloadavg) is printed before and after. With --profile, rank 0 also runs each
compressor's timed exchanges under cProfile and prints the functions that took the most time (their own time).
"""
import argparse
import cProfile
import importlib
import io
import json
import os
import pstats
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

from comm_volume import GradientSource
from side_by_side import median_ms, run_side_by_side, slowest
from sparse_asr.comm import Communicator
from sparse_asr.compression.oktopk import OkTopk
from sparse_asr.training.launch import setup_process

REPO = Path(__file__).resolve().parent.parent
WORD = 4


BASELINE_PACKAGE = "sparse_asr_baseline"
IMPORTS = re.compile(r"^(\s*)(from|import)(\s+)sparse_asr\b", re.MULTILINE)


def export_baseline(commit: str, into: Path) -> str:
    """Extract sparse_asr/ of `commit` into into/sparse_asr_baseline/, its imports of sparse_asr renamed to that
    package; with `into` on sys.path, `import sparse_asr_baseline` is the commit's code. Returns the full hash."""
    full = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{commit}^{{commit}}"],
                          capture_output=True, text=True)
    if full.returncode != 0:
        raise SystemExit(f"oktopk_vs_baseline: --baseline {commit!r} is not a commit of {REPO}: {full.stderr.strip()}")
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", commit, "sparse_asr"],
                             capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"oktopk_vs_baseline: commit {commit} has no sparse_asr/ package (the flat layout of "
                         f"98e56a1 and earlier is not supported): {archive.stderr.decode().strip()}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    package = into / BASELINE_PACKAGE
    shutil.move(into / "sparse_asr", package)
    for source in package.rglob("*.py"):
        source.write_text(IMPORTS.sub(rf"\1\2\3{BASELINE_PACKAGE}", source.read_text()))
    return full.stdout.strip()


def import_baseline(root: Path, module: str):
    """sparse_asr_baseline.<module> from the tree export_baseline wrote under `root` (an ordinary import)."""
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return importlib.import_module(f"{BASELINE_PACKAGE}.{module}")


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
    tmp = tempfile.TemporaryDirectory(prefix="oktopk-baseline-")  # one per rank: no shared files
    commit = export_baseline(args.baseline, Path(tmp.name))
    old_comm_module = import_baseline(Path(tmp.name), "comm")
    old_compression = import_baseline(Path(tmp.name), "compression.oktopk")
    comm.barrier()

    source = GradientSource(args.numel, rank, args.seed)
    old_comm = old_comm_module.Communicator()
    new = OkTopk(comm, args.numel, args.density)
    old = old_compression.OkTopk(old_comm, args.numel, args.density)
    impls = {"baseline": (old, old_comm), "now": (new, comm)}
    exchange_s = {name: [] for name in impls}
    profiles = {name: cProfile.Profile() if args.profile and rank == 0 else None for name in impls}
    for name, (compressor, _) in impls.items():
        timed_exchange(compressor, exchange_s[name], profiles[name])

    def exchange_of(name):  # its row per step: (exchange s, step s, bytes recv, msgs, global/k)
        compressor, c = impls[name]

        def one_step(flat, timed):
            if profiles[name] is not None:
                profiles[name].active = timed
            with c.measure() as moved:
                t0 = time.perf_counter()
                stats = compressor.step(flat)
                seconds = time.perf_counter() - t0
            return (exchange_s[name][-1], seconds, moved.bytes_recv, moved.msgs_sent,
                    stats.selected_global / compressor.k)
        return one_step

    run = run_side_by_side(comm, source, args.numel, args.warmup, args.steps,
                           {name: exchange_of(name) for name in impls})

    k = new.k
    unit = 2 * k * (P - 1) / P  # words: k pairs reduced to their owners, the lower bound
    floor_ms = median_ms(slowest(comm, run.floor_s))
    results = {}
    for name in impls:
        mine = np.array(run.rows[name])  # steps x 5
        worst = slowest(comm, mine[:, :2])
        recv = comm.allgather_object(float(mine[:, 2].mean()))
        msgs = comm.allgather_object(float(mine[:, 3].mean()))
        results[name] = {
            "exchange_ms_median": median_ms(worst[:, 0]),
            "step_ms_median": median_ms(worst[:, 1]),
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
        f"alternating which goes first); times are medians of the slowest rank's; the floor, one `d += b` over n "
        f"timed in the same steps: {floor_ms:.1f} ms; load average (1, 5, 15 min) "
        f"{run.load_before[0]:.1f} {run.load_before[1]:.1f} {run.load_before[2]:.1f} before, "
        f"{run.load_after[0]:.1f} {run.load_after[1]:.1f} {run.load_after[2]:.1f} after, on {os.cpu_count()} cores",
        "",
        "| impl | words received/step, mean [busiest] | mean / 2k(P-1)/P | global selected / k | messages/step "
        "| median ms per exchange | median ms per step | step / floor |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        label = f"{commit[:7]}" if name == "baseline" else "now"
        lines.append(f"| {label} | {r['words_recv_mean']:,.0f} [{r['words_recv_busiest']:,.0f}] "
                     f"| {r['words_recv_mean'] / unit:.2f} | {r['global_over_k_mean']:.2f} | {r['messages_mean']:.1f} "
                     f"| {r['exchange_ms_median']:.0f} | {r['step_ms_median']:.0f} "
                     f"| {r['step_ms_median'] / floor_ms:.1f}x |")
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
                  "warmup": args.warmup, "seed": args.seed, "baseline": commit, "floor_ms_median": floor_ms,
                  "loadavg_before": run.load_before, "loadavg_after": run.load_after}
        args.out.with_suffix(".json").write_text(json.dumps({"config": config, "results": results}, indent=1))


if __name__ == "__main__":
    main()
