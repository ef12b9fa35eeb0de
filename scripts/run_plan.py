"""Run a committed accuracy plan's queue, seed by seed, and keep each finished run.

    python scripts/run_plan.py --tree PLAN_TREE -c configs/verdict_p8x2.yaml -n 8 -a "dense oktopk onebit" \
        --seeds 1-20 -o RUNS_DIR --keep-into docs/results/verdict_p8x2/runs [--dry-run]

PLAN_TREE is a worktree of the plan's commit with its own .venv and AN4 prepared inside it (the plan's code trains
the runs; see a plan's "Running it"). For each seed, the arms not yet kept run one at a time through the tree's
bench/accuracy.sh (which resumes an interrupted run from its last checkpoint), niced. A seed's arms all run on one
CPU type: the `cpu` and `cpu_dispatch` of its runs' provenance (torch's kernels round differently on each), so a
seed with a run, finished, interrupted or kept, from another CPU type is left for a machine of that type. A run
that ends without a test WER is resumed once; if it ends again without one it is recorded as a failure of its arm
(RUNS_DIR/failures.tsv, the plan's failure count) and the queue goes on. Each finished run then gets its last
model's dev and test log-probabilities and the test log-probabilities of the average of its last 2 checkpoints
(evaluate.py --emissions) and is kept (scripts/keep_runs.py) under --keep-into, ready to commit.

On Linux, mpiexec starts each rank in its own scheduler autogroup, which the scheduler shares the CPU with before it
looks at `nice`: the queue also sets its ranks' autogroup nice, so that it yields to work started elsewhere.
"""
import argparse
import json
import os
import subprocess
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path

from sparse_asr.analysis.keep import finished
from sparse_asr.comm.mpi import YIELD_VARIABLE, oversubscribed
from sparse_asr.fileio import RECORD_BYTES, check_directory, open_append, open_regular, read_text

EVALUATIONS = (  # (manifest split, extra evaluate.py arguments, emissions file): the plan's read-outs of a run
    ("dev", [], "emissions_dev.npz"),
    ("test", [], "emissions_test.npz"),
    ("test", ["--average", "2", "--average-by", "last"], "emissions_test_avg2_last.npz"),
)


def log(message: str) -> None:
    print(f"{datetime.now(timezone.utc):%Y-%m-%dT%H:%M:%SZ} {message}", flush=True)


def parse_seeds(text: str) -> list[int]:
    """'1-20', '2 3 5' or '1-3 7': the seeds in order, each once."""
    seeds = []
    for part in text.replace(",", " ").split():
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise ValueError(f"--seeds: '{part}' is not a seed or a range like 1-20")
        seeds += range(int(low), int(high or low) + 1)
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds '{text}': give each seed once")
    return seeds


def cpu_type(provenance: Path) -> str | None:
    """'cpu | cpu_dispatch' of a run's first provenance record, or None where it has none yet."""
    try:
        first = json.loads(read_text(provenance, RECORD_BYTES, "provenance").partition("\n")[0])
        return f"{first['cpu']} | {first['cpu_dispatch']}"
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise SystemExit(f"run_plan: error: {provenance}: not a provenance record ({error})") from None


def has_test_wer(run: Path) -> bool:
    """Whether the run has finished: its metrics.jsonl holds the test row (keep_runs.py's rule)."""
    metrics = run / "metrics.jsonl"
    if not os.path.lexists(metrics):  # a run that stopped before its first step
        return False
    with open_regular(metrics, "metrics", follow=False) as f:
        try:
            return finished(f.read(), metrics)
        except ValueError as error:
            raise SystemExit(f"run_plan: error: {error}") from None


def failures(path: Path) -> set[str]:
    """The runs recorded as failures (the first column of failures.tsv): the queue does not run them again."""
    try:
        return {line.split("\t")[0] for line in read_text(path, RECORD_BYTES, "failures").splitlines() if line}
    except FileNotFoundError:
        return set()


def this_cpu_type(tree: Path) -> str:
    """This machine's 'cpu | cpu_dispatch' as the plan's code writes them into provenance."""
    code = ("import torch; from sparse_asr.training.runtime import cpu_model; "
            "print(cpu_model() + ' | ' + torch.backends.cpu.get_cpu_capability())")
    proc = subprocess.run([str(tree / ".venv/bin/python"), "-c", code], env=tree_env(tree), capture_output=True,
                          text=True)
    if proc.returncode:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"run_plan: error: the tree's python cannot import its package ({last}): set it up with "
                         f"scripts/setup.sh in {tree}")
    return proc.stdout.strip()


def tree_env(tree: Path, ranks: int = 1) -> dict:
    """The plan tree's package first (not whatever the editable install points at), one torch thread per rank, and
    where the ranks outnumber the cores, waiting ranks that sleep instead of spin (sparse_asr/comm/mpi.py, set here
    too for plan trees older than it: only how a rank waits changes, bench/same_training.sh gives the same bits)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    if oversubscribed(ranks):
        env.setdefault(YIELD_VARIABLE, "1")
    return env


def nice_autogroups(root: int, stop: threading.Event, nice: int) -> None:
    """Every 15 s, set the autogroup nice of every process under `root` (Linux; nothing elsewhere)."""
    while not stop.wait(15):
        children = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        todo = list(children.get(root, []))
        while todo:
            pid = todo.pop()
            todo += children.get(pid, [])
            try:
                Path(f"/proc/{pid}/autogroup").write_text(str(nice))
            except OSError:
                pass


def run(command: list[str], tree: Path, env: dict, log_path: Path, nice: int, dry_run: bool) -> int:
    """`command` in the tree with `env`, niced, its output appended to log_path; its exit status."""
    if dry_run:
        print(" ".join(command))
        return 0
    with open_append(log_path) as out:
        proc = subprocess.Popen(["nice", "-n", str(nice), *command], cwd=tree, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
        stop = threading.Event()
        watcher = threading.Thread(target=nice_autogroups, args=(proc.pid, stop, nice), daemon=True)
        watcher.start()
        code = proc.wait()
        stop.set()
        return code


def main(argv=None) -> int:
    try:
        return run_queue(argv)
    except OSError as error:  # a refusal is one line, not a traceback
        raise SystemExit(f"run_plan: error: {error}") from None


def run_queue(argv) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--tree", type=Path, required=True, help="worktree of the plan's commit, set up")
    parser.add_argument("-c", "--config", required=True, help="the plan's config, relative to the tree")
    parser.add_argument("-n", "--ranks", type=int, required=True, help="MPI ranks of every run")
    parser.add_argument("-a", "--arms", required=True, help='the plan\'s arms, e.g. "dense oktopk onebit"')
    parser.add_argument("--seeds", required=True, help="the plan's seeds in order, e.g. 1-20")
    parser.add_argument("-o", "--out", type=Path, required=True, help="where the runs train (RUNS_DIR/runs/<run>)")
    parser.add_argument("--keep-into", type=Path, required=True, help="where finished runs are kept")
    parser.add_argument("--nice", type=int, default=19, help="nice (and autogroup nice) of the runs (default 19)")
    parser.add_argument("--dry-run", action="store_true", help="print what would run; run nothing")
    args = parser.parse_args(argv)
    try:
        seeds = parse_seeds(args.seeds)
    except ValueError as error:
        parser.error(str(error))
    tree = args.tree.resolve()
    if not (tree / "bench/accuracy.sh").is_file() or not (tree / ".venv/bin/python").is_file():
        parser.error(f"--tree {args.tree}: not a set-up checkout (bench/accuracy.sh and .venv/bin/python needed)")
    if not (tree / args.config).is_file():
        parser.error(f"--config {args.config}: no such file in {tree}")
    arms = args.arms.split()
    out, keep = args.out.resolve(), args.keep_into.resolve()
    if not args.dry_run:
        out.mkdir(parents=True, exist_ok=True)
        check_directory(out, "--out")
    here = this_cpu_type(tree)
    log(f"queue on {here}: seeds {args.seeds}, arms {' '.join(arms)}"
        + (f" (dry run: the commands, each in {tree} with PYTHONPATH={tree}, OMP_NUM_THREADS=1, nice -n {args.nice})"
           if args.dry_run else ""))
    python = str(tree / ".venv/bin/python")
    env = tree_env(tree, args.ranks)
    failed = failures(out / "failures.tsv")
    for seed in seeds:
        names = [f"{arm}-s{seed}" for arm in arms]
        todo = [(arm, name) for arm, name in zip(arms, names) if not (keep / name).is_dir() and name not in failed]
        if not todo:
            continue
        types = {cpu_type(d / name / "provenance.jsonl") for d in (keep, out / "runs") for name in names} - {None}
        if types - {here}:
            log(f"seed {seed} waits for {', '.join(sorted(types - {here}))} (its runs' CPU type)")
            continue
        for arm, name in todo:
            run_dir, log_path = out / "runs" / name, out / f"{name}.log"
            train = ["bash", "bench/accuracy.sh", "-c", args.config, "-n", str(args.ranks), "--seeds", str(seed),
                     "-a", arm, "-o", str(out)]
            log(f"seed {seed}: {arm}")
            for attempt in (1, 2):  # the plan's rule: resumed once
                run(train, tree, env, log_path, args.nice, args.dry_run)
                if args.dry_run or has_test_wer(run_dir):
                    break
                log(f"{name} ended without a test WER (log: {log_path})"
                    + ("; resuming it once" if attempt == 1 else ""))
            else:
                with open_append(out / "failures.tsv") as f:
                    f.write(f"{name}\t{here}\tno test WER after a resume\n".encode())
                continue
            for split, extra, emissions in EVALUATIONS:
                command = [python, "evaluate.py", str(run_dir), "--manifest", f"manifests/an4_{split}.csv",
                           "--worst", "0", *extra, "--emissions", str(run_dir / emissions)]
                if run(command, tree, env, log_path, args.nice, args.dry_run):
                    raise SystemExit(f"run_plan: error: evaluate.py failed on {run_dir} (log: {log_path})")
            keep_run = [python, "scripts/keep_runs.py", str(run_dir), "--into", str(keep)]
            if run(keep_run, tree, env, log_path, 0, args.dry_run):
                raise SystemExit(f"run_plan: error: keep_runs.py failed on {run_dir} (log: {log_path})")
            if not args.dry_run:
                log(f"kept {name} in {keep}")
    log("queue done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
