"""The environment report and the final summary of bench/gpu_suite.sh.

    python bench/gpu_report.py env DIR [--require-cuda]   # -> DIR/env.json, DIR/nvidia-smi.txt, text on stdout
    python bench/gpu_report.py summary DIR                # -> markdown on stdout (gpu_suite.sh: DIR/summary.md)
    python bench/gpu_report.py rate DIR [--epochs 161]    # epochs per minute, before/after -> markdown on stdout

summary reads what the suite left in DIR: steps.tsv (status of every step), env.json, selection.md
(bench/selection.py's table), step_time_*.json (bench/step_time.py --json) and runs/*/ (config.yaml and
metrics.jsonl of the trainings) and rate.md (the study's epochs per minute). A missing or failed part is reported
as such; the rest still is.

rate reads metrics_rate_before.jsonl and metrics_rate_after.jsonl: a run's rate is (epoch ends - 1) / the time
between its first and last epoch end, so it counts everything an epoch costs in the loop (training, dev scoring,
checkpoints) and nothing of the start-up.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import yaml

from sparse_asr.training.runlog import read_metrics


# ---------------------------------------------------------------------------------------- env
def nvidia_smi(out_dir: Path) -> dict:
    """GPU name, driver and memory from nvidia-smi, and its full output in nvidia-smi.txt."""
    if shutil.which("nvidia-smi") is None:
        return {"nvidia_smi": "not found"}
    query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    try:
        (out_dir / "nvidia-smi.txt").write_text(subprocess.run(["nvidia-smi"], capture_output=True, text=True,
                                                               timeout=15).stdout)
        lines = subprocess.run(query, capture_output=True, text=True, timeout=15).stdout.strip().splitlines()
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"nvidia_smi": f"failed: {e}"}
    return {"nvidia_smi": [dict(zip(["name", "driver", "memory"], (x.strip() for x in line.split(","))))
                           for line in lines]}


def environment(out_dir: Path) -> dict:
    import torch

    from sparse_asr.comm.mpi import load_mpi

    MPI = load_mpi()
    env = {"host": socket.gethostname(), "cpus": os.cpu_count(), "load_average_1min": os.getloadavg()[0],
           "python": platform.python_version(), "torch": torch.__version__, "cuda_build": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
           "cuda_available": torch.cuda.is_available(), "gpus": [],
           "mpi": MPI.Get_library_version().splitlines()[0].strip(), "bundle": bundle_origin()}
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        env["gpus"].append({"name": p.name, "capability": f"{p.major}.{p.minor}",
                            "memory_gib": round(p.total_memory / 2**30, 1),
                            "bf16": torch.cuda.is_bf16_supported()})
    env.update(nvidia_smi(out_dir))
    return env


def bundle_origin() -> str:
    """Which code this is: the offline bundle's build line, else git describe."""
    note = Path("BUNDLE.md")
    if note.is_file():
        return " ".join(note.read_text().splitlines()[2:4])
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True,
                              timeout=10).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


# ---------------------------------------------------------------------------------------- summary
def read_steps(out_dir: Path) -> list[dict]:
    path = out_dir / "steps.tsv"
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def markdown_table(text: str) -> list[dict]:
    """The first markdown table in `text` as a list of {column: cell}."""
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith("|")]
    if len(lines) < 2:
        return []
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    return [dict(zip(cells[0], row)) for row in cells[2:]]


def step_time_rows(out_dir: Path) -> list[dict]:
    rows = []
    for path in sorted(out_dir.glob("step_time_*.json")):
        data = json.loads(path.read_text())
        rows += [{**row, "file": path.name} for row in data["rows"]]
    return rows


def training_runs(out_dir: Path) -> list[dict]:
    runs = []
    for run_dir in sorted((out_dir / "runs").glob("*/")):
        config = yaml.safe_load((run_dir / "config.yaml").read_text()) if (run_dir / "config.yaml").is_file() else {}
        metrics = read_metrics(run_dir) if (run_dir / "metrics.jsonl").is_file() else []
        last = {kind: next((m for m in reversed(metrics) if m["kind"] == kind), {})
                for kind in ("train", "epoch", "dev", "test")}
        epochs = [m for m in metrics if m["kind"] == "epoch"]
        dev_wer = {m["epoch"]: m["dev/wer"] for m in metrics if m["kind"] == "dev" and "dev/wer" in m}
        throughput = [m["train/samples_per_sec"] for m in metrics if "train/samples_per_sec" in m]
        runs.append({
            "name": run_dir.name, "algorithm": config.get("compression", {}).get("algorithm", "?"),
            "options": config.get("compression", {}).get("options") or {},
            "P": config.get("distributed", {}).get("world_size", "?"),
            "precision": config.get("train", {}).get("precision", "fp32"),
            "epochs": last["epoch"].get("epoch", 0), "steps": last["epoch"].get("step", 0),
            "train_seconds": sum(m["epoch/seconds"] for m in epochs),
            "wall_seconds": metrics[-1]["time"] - metrics[0]["time"] if len(metrics) > 1 else None,
            "samples_per_sec": sum(throughput) / len(throughput) if throughput else None,
            "loss": last["epoch"].get("epoch/loss"), "dev_wer": last["dev"].get("dev/wer"),
            "best_dev_wer": min(dev_wer.values()) if dev_wer else None, "dev_wer_by_epoch": dev_wer,
            "test_wer": last["test"].get("test/wer"), "test_cer": last["test"].get("test/cer")})
    return runs


def relative(value, reference):
    """value vs reference in percent (+ = worse for an error rate), None if either is missing."""
    return None if value is None or not reference else 100 * (value - reference) / reference


def accuracy_section(runs: list[dict]) -> tuple[list[str], list[str]]:
    """Lines comparing the trainings at the last epoch every one of them was dev-scored at (same epochs,
    the only fair comparison of runs that stop at different times), and the target rows: dense WER, Ok-Topk parity,
    bf16 parity."""
    scored = [r for r in runs if r["dev_wer_by_epoch"]]
    common = min(max(r["dev_wer_by_epoch"]) for r in scored) if scored else None
    at_common = {r["name"]: r["dev_wer_by_epoch"].get(common) for r in scored}
    dense = next((r for r in runs if r["algorithm"] == "dense" and r["P"] == 1 and r["precision"] == "fp32"), None)
    dense_dev = at_common.get(dense["name"]) if dense else None
    dense_test = dense["test_wer"] if dense else None
    lines = [f"Dev WER at epoch {fmt(common, 'd')}, the last epoch every run reached (same epochs); test WER "
             "after each run's own last epoch.", "",
             f"| run | epochs | dev WER at epoch {fmt(common, 'd')} | vs dense P = 1 fp32 | best dev WER | test WER "
             "| vs dense P = 1 fp32 |", "|---|---|---|---|---|---|---|"]
    for r in runs:
        dev = at_common.get(r["name"])
        lines.append(f"| {r['name']} | {r['epochs']} | {fmt(dev)} | {pct(relative(dev, dense_dev))} "
                     f"| {fmt(r['best_dev_wer'])} | {fmt(r['test_wer'])} "
                     f"| {pct(relative(r['test_wer'], dense_test))} |")
    rows = [f"| lstman4 dense, 1 process: test WER <= 0.15 | {fmt(dense_test)} "
            f"after {fmt(dense['epochs'] if dense else None, 'd')} epochs "
            f"| {verdict(None if dense_test is None else dense_test <= 0.15)} |"]
    for name, P, precision, algorithm, slack in (("Ok-Topk", 2, "fp32", "oktopk", 5),
                                                 ("Ok-Topk", 4, "fp32", "oktopk", 5),
                                                 ("bf16 dense", 1, "bf16", "dense", 2)):
        run = next((r for r in runs if (r["algorithm"], r["P"], r["precision"]) == (algorithm, P, precision)
                    and not r["options"]), None)  # the algorithm itself, not a variant with options
        gap = relative(at_common.get(run["name"]) if run else None, dense_dev)
        rows.append(f"| {name}, P = {P}: dev WER within {slack}% relative of dense fp32 at the same epoch "
                    f"| {pct(gap)} at epoch {fmt(common, 'd')} "
                    f"| {verdict(None if gap is None else gap <= slack)} |")
        # Test WER is scored once, after a run's last epoch: comparable only where both finished the same epochs.
        same_epochs = run is not None and dense is not None and run["epochs"] == dense["epochs"]
        test_gap = relative(run["test_wer"], dense_test) if same_epochs else None
        measured = (f"{pct(test_gap)} after {run['epochs']} epochs" if same_epochs else
                    "n/a (not the same epochs)" if run and dense else "n/a")
        rows.append(f"| {name}, P = {P}: test WER within {slack}% relative of dense fp32, both after the same "
                    f"epochs | {measured} | {verdict(None if test_gap is None else test_gap <= slack)} |")
    return lines, rows


def epoch_rate(metrics_file: Path) -> tuple[int, float | None]:
    """(epochs ended, epochs per minute between the first and the last epoch end; None with < 2 ends)."""
    if not metrics_file.is_file():
        return 0, None
    rows = [json.loads(line) for line in metrics_file.read_text().splitlines() if line]
    ends = [row["time"] for row in rows if row["kind"] == "epoch"]
    if len(ends) < 2 or ends[-1] <= ends[0]:
        return len(ends), None
    return len(ends), 60 * (len(ends) - 1) / (ends[-1] - ends[0])


def rate_report(out_dir: Path, epochs: int = 161, target_minutes: float = 4.0) -> str:
    """The throughput table: dense lstman4 alone on the GPU before and after the fast settings (gpu_suite.sh)."""
    rates = {side: epoch_rate(out_dir / f"metrics_rate_{side}.jsonl") for side in ("before", "after")}
    lines = ["| settings | epochs timed | epochs per minute | minutes for " + f"{epochs} epochs |", "|---|---|---|---|"]
    for side, (ended, rate) in rates.items():
        lines.append(f"| {side} | {ended} | {fmt(rate, '.1f')} | {fmt(epochs / rate if rate else None, '.1f')} |")
    before, after = rates["before"][1], rates["after"][1]
    speedup = after / before if before and after else None
    lines += ["", "| target | measured | |", "|---|---|---|",
              f"| epochs per minute x2 | {'n/a' if speedup is None else f'{speedup:.2f}x'} "
              f"| {verdict(None if speedup is None else speedup >= 2)} |",
              f"| {epochs} epochs of dense lstman4 alone in <= {target_minutes:g} minutes | "
              f"{fmt(epochs / after if after else None, '.1f')} min | "
              f"{verdict(None if not after else epochs / after <= target_minutes)} |"]
    return "\n".join(lines) + "\n"


def fmt(value, spec: str = ".3f") -> str:
    return "n/a" if value is None else format(value, spec)


def pct(value) -> str:
    return "n/a" if value is None else f"{value:+.1f}%"


def verdict(ok) -> str:
    """A target row's last cell: met, NOT met, or n/a when the figure is missing."""
    return "n/a" if ok is None else ("met" if ok else "NOT met")


def targets(selection: list[dict], step_rows: list[dict]) -> list[str]:
    """The GPU speed targets (README, "On a cluster"), against the measured figures (n/a if missing)."""
    def select_ms(name_part):
        found = [float(r["median ms"]) for r in selection if name_part in r.get("method", "")
                 and r.get("density") == "0.02"]
        return found[0] if found else None

    def step(P, precision, algorithm):
        return next((r for r in step_rows if r["P"] == P and r.get("precision", "fp32") == precision
                     and r["algorithm"] == algorithm), None)

    ours, topk, reuse = select_ms("(ours)"), select_ms("torch.topk"), select_ms("threshold reuse")
    oktopk2, bf16 = step(2, "fp32", "oktopk"), step(1, "bf16", "dense")
    share = oktopk2["comm_select_pct_of_compute"] if oktopk2 else None
    bf16_ms = bf16["t_step_mean"] * 1e3 if bf16 else None

    def shown(value, unit, spec=".2f"):
        return "n/a" if value is None else f"{value:{spec}}{unit}"

    return [
        "| target | measured | |", "|---|---|---|",
        f"| Ok-Topk's exact selection <= torch.topk's time (density 0.02) | {shown(ours, ' ms')} vs "
        f"{shown(topk, ' ms')} | {verdict(None if None in (ours, topk) else ours <= topk)} |",
        f"| threshold reuse <= 0.1 ms | {shown(reuse, ' ms')} | {verdict(None if reuse is None else reuse <= 0.1)} |",
        f"| Ok-Topk (selection + communication) <= 5% of compute, P = 2 | {shown(share, '%', '.1f')} "
        f"| {verdict(None if share is None else share <= 5)} |",
        f"| step <= 30 ms with bf16 (dense, P = 1) | {shown(bf16_ms, ' ms', '.1f')} "
        f"| {verdict(None if bf16_ms is None else bf16_ms <= 30)} |",
    ]


def summary(out_dir: Path) -> str:
    steps = read_steps(out_dir)
    env = json.loads((out_dir / "env.json").read_text()) if (out_dir / "env.json").is_file() else {}
    gpus = ", ".join(g["name"] for g in env.get("gpus", [])) or "no GPU"
    lines = [f"# GPU suite: {gpus}", "",
             f"{env.get('host', '?')}, {env.get('cpus', '?')} CPUs; torch {env.get('torch', '?')}, CUDA "
             f"{env.get('cuda_build', '?')}, cuDNN {env.get('cudnn', '?')}, {env.get('mpi', '?')}; code: "
             f"{env.get('bundle', '?')}", "",
             "| step | status | seconds | limit s |", "|---|---|---|---|"]
    lines += [f"| {s['step']} | {s['status']} | {s['seconds']} | {s['limit_s']} |" for s in steps]

    selection_text = (out_dir / "selection.md").read_text() if (out_dir / "selection.md").is_file() else ""
    selection = markdown_table(selection_text)
    lines += ["", "## Selection (bench/selection.py)", ""]
    lines += [line for line in selection_text.splitlines() if line.startswith("|")] or ["no result"]

    rows = step_time_rows(out_dir)
    lines += ["", "## Step time (bench/step_time.py), ms per step, mean over ranks", "",
              "| P | precision | algorithm | model | global batch | compute | selection | communication | other "
              "| total | (sel + comm) / compute |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    batch = {path.name: json.loads(path.read_text())["batch"]["global_batch"]
             for path in out_dir.glob("step_time_*.json")}
    for r in rows:
        lines.append(f"| {r['P']} | {r.get('precision', 'fp32')} | {r['algorithm']} | {r['model']} "
                     f"| {batch[r['file']]} | {r['t_compute_mean'] * 1e3:.1f} | {r['t_select_mean'] * 1e3:.1f} "
                     f"| {r['t_comm_mean'] * 1e3:.1f} | {r['t_other_mean'] * 1e3:.1f} | {r['t_step_mean'] * 1e3:.1f} "
                     f"| {r['comm_select_pct_of_compute']:.1f}% |")
    if not rows:
        lines.append("| no result | | | | | | | | | | |")

    runs = training_runs(out_dir)
    lines += ["", "## Concurrent trainings on AN4 (train.py; all on the same GPU)", "",
              "| run | algorithm | P | precision | epochs | steps | training s | wall s | samples/s | last epoch loss "
              "| dev WER | test WER | test CER |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        lines.append(f"| {r['name']} | {r['algorithm']} | {r['P']} | {r['precision']} | {r['epochs']} | {r['steps']} "
                     f"| {r['train_seconds']:.1f} | {fmt(r['wall_seconds'], '.1f')} "
                     f"| {fmt(r['samples_per_sec'], '.1f')} | {fmt(r['loss'])} | {fmt(r['dev_wer'])} "
                     f"| {fmt(r['test_wer'])} | {fmt(r['test_cer'])} |")
    if not runs:
        lines.append("| no result | | | | | | | | | | | | |")

    if (out_dir / "rate.md").is_file():
        lines += ["", "## Epochs per minute, dense lstman4 alone on the GPU (before / after the fast settings)", "",
                  *(out_dir / "rate.md").read_text().splitlines()]

    accuracy, accuracy_targets = accuracy_section(runs)
    lines += ["", "## Accuracy at the same epochs", ""] + accuracy
    lines += ["", "## Targets", ""] + targets(selection, rows) + accuracy_targets
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["env", "summary", "rate"])
    parser.add_argument("dir", type=Path, help="the suite's results folder")
    parser.add_argument("--require-cuda", action="store_true", help="env: fail (exit 1) if CUDA is not available")
    parser.add_argument("--epochs", type=int, default=161, help="rate: the schedule to project (the paper's 161)")
    args = parser.parse_args(argv)
    if args.what == "rate":
        print(rate_report(args.dir, args.epochs), end="")
        return 0
    if args.what == "summary":
        print(summary(args.dir), end="")
        return 0
    env = environment(args.dir)
    (args.dir / "env.json").write_text(json.dumps(env, indent=1) + "\n")
    print("\n".join(f"{k}: {v}" for k, v in env.items()))
    if args.require_cuda and not env["cuda_available"]:
        print("error: CUDA is not available (torch.cuda.is_available() is False)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
