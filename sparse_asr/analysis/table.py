"""compare_runs' results table: one row per run (what it ran, where it ended, what it moved and how long its
steps took), and the step and bytes at which a run first reached a target dev WER."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from sparse_asr.analysis.runs import Run, nearest_values, run_label, run_seed
from sparse_asr.compression import COMPRESSORS


def first_reaching(run: Run, target_wer: float) -> tuple[int | None, float | None]:
    """(step, cumulative bytes received per rank) at the first dev evaluation with WER <= target_wer."""
    c = run.curves
    if "dev/wer" not in c:
        return None, None
    reached = np.flatnonzero(c["dev/wer"].values <= target_wer)
    if not reached.size:
        return None, None
    step = int(c["dev/wer"].steps[reached[0]])
    if "comm/cum_bytes_recv" not in c:
        return step, None
    return step, float(nearest_values(c["comm/cum_bytes_recv"], np.array([step]))[0])


def summarize(run: Run, target_wer: float | None = None) -> dict:
    c = run.curves

    def last(tag):
        return c[tag].last() if tag in c else None

    def mean(tag):
        return float(np.mean(c[tag].values)) if tag in c else None

    def mean_ms(tag):
        return mean(tag) * 1000.0 if tag in c else None

    algorithm = run.config_value("compression.algorithm")
    density = run.config_value("compression.density")
    if algorithm in COMPRESSORS and not COMPRESSORS[algorithm].uses_density:
        # dense and PowerSGD ignore the configured density: the density they sent at the end (PowerSGD's:
        # the entries of its factors / n), dense's 1 when it was not logged
        density = last("comm/density") if "comm/density" in c else (1.0 if algorithm == "dense" else None)
    if "train/loss" in c:
        steps = int(c["train/loss"].steps[-1])
    else:
        steps = int(max(curve.steps[-1] for curve in c.values()))
    bytes_total = last("comm/cum_bytes_recv")
    bytes_at = int(c["comm/cum_bytes_recv"].steps[-1]) if bytes_total is not None else 0
    row = {
        "run": run.name,
        "model": run.config_value("model.name"),
        "algorithm": algorithm,
        "density": density,
        "P": run.config_value("distributed.world_size"),
        "steps": steps,
        "final_dev_wer": last("dev/wer"),
        "best_dev_wer": float(np.min(c["dev/wer"].values)) if "dev/wer" in c else None,
        "final_dev_cer": last("dev/cer"),
        "test_wer": last("test/wer"),
        "test_cer": last("test/cer"),
        "bytes_recv_total": bytes_total,
        "bytes_recv_per_step": bytes_total / bytes_at if bytes_at else None,
        "syncbn_bytes_per_step": mean("comm/syncbn_bytes_recv"),
        "compute_ms": mean_ms("time/compute"),
        "selection_ms": mean_ms("time/selection"),
        "communication_ms": mean_ms("time/communication"),
        "step_ms": mean_ms("time/step"),
    }
    if target_wer is not None:
        step, nbytes = first_reaching(run, target_wer)
        row.update(target_dev_wer=target_wer, step_at_target=step, bytes_at_target=nbytes)
    return row


def markdown_table(frame: pd.DataFrame) -> str:
    """A GitHub Markdown table (empty cells for missing values)."""

    def cell(value) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return ""
        if isinstance(value, float):
            return f"{value:.4g}"
        return str(value)

    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    for row in frame.itertuples(index=False):
        lines.append("| " + " | ".join(cell(v) for v in row) + " |")
    return "\n".join(lines) + "\n"


def run_targets(runs: list[Run], target_run: str, slack: float) -> list[float | None]:
    """Each run's target dev WER for --target-run: the best dev WER x (1 + slack) of the run of that name,
    or, when no run has that name but runs are labelled so (<label>-s<seed>), of the one at the run's own
    seed (None for a run whose seed it lacks)."""
    by_name = {run.name: run for run in runs}
    if target_run in by_name:
        references = {run.name: by_name[target_run] for run in runs}
    else:
        per_seed = {run_seed(run): run for run in runs if run_label(run) == target_run}
        if not per_seed:
            raise SystemExit(f"compare_runs: --target-run {target_run!r} is not among the runs {sorted(by_name)} "
                             f"nor their labels (names without -s<seed>)")
        references = {run.name: per_seed.get(run_seed(run)) for run in runs}
    targets = []
    for run in runs:
        reference = references[run.name]
        if reference is not None and "dev/wer" not in reference.curves:
            raise SystemExit(f"compare_runs: --target-run {reference.name!r} logged no dev WER (dev/wer)")
        targets.append(None if reference is None else
                       float(np.min(reference.curves["dev/wer"].values)) * (1 + slack))
    return targets
