"""Where do two training trajectories part? Step by step, from the runs' metrics (log train.log_every_steps=1).

    .venv/bin/python bench/trajectory_parting.py REFERENCE_RUN OTHER_RUN [OTHER_RUN ...]

For each other run against the reference: the relative difference of the first logged step's gradient norm
(same parameters, same batch: what the arithmetic alone gives) and the first logged step at which the training
losses differ by more than 1e-5, 1e-4, 1e-3, 1e-2 and 1e-1 relative ("-": never within the steps both logged).
A run against a rerun of itself never parts; a rounding-level change (another kernel ISA) that parts as early
as another rank count says the trajectory is chaotic there, not that the rank count changes the computation.
A Markdown table on stdout.
"""
import argparse
import sys
from pathlib import Path

from sparse_asr.training.runlog import metrics_path, read_metrics

THRESHOLDS = (1e-5, 1e-4, 1e-3, 1e-2, 1e-1)


def train_rows(run_dir: Path) -> dict[int, dict]:
    if metrics_path(run_dir) is None:
        sys.exit(f"trajectory_parting: {run_dir} holds no metrics.jsonl (not a run directory?)")
    return {r["step"]: r for r in read_metrics(run_dir) if r["kind"] == "train"}


def relative(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), 1e-30)


def parting(reference: dict[int, dict], other: dict[int, dict]) -> tuple[float, list]:
    """(relative gradient-norm difference at the first common step, first step past each threshold or None)."""
    steps = sorted(reference.keys() & other.keys())
    if not steps:
        raise ValueError("the two runs logged no common step")
    first = steps[0]
    grad = relative(reference[first]["train/grad_norm"], other[first]["train/grad_norm"])
    parted = []
    for threshold in THRESHOLDS:
        parted.append(next((s for s in steps
                            if relative(reference[s]["train/loss"], other[s]["train/loss"]) > threshold), None))
    return grad, parted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reference", type=Path)
    parser.add_argument("others", type=Path, nargs="+")
    args = parser.parse_args()
    reference = train_rows(args.reference)
    print(f"Against `{args.reference.name}`: relative difference of the first step's gradient norm, then the first "
          "step whose training loss differs by more than each relative threshold.\n")
    print("| run | grad norm, first step | " + " | ".join(f"loss > {t:g}" for t in THRESHOLDS) + " |")
    print("|---|---|" + "---|" * len(THRESHOLDS))
    for run in args.others:
        try:
            grad, parted = parting(reference, train_rows(run))
        except ValueError as error:
            sys.exit(f"trajectory_parting: {run}: {error}")
        cells = " | ".join("-" if s is None else str(s) for s in parted)
        print(f"| {run.name} | {grad:.1e} | {cells} |")


if __name__ == "__main__":
    main()
