"""Compare training runs: TensorBoard event files + config.yaml -> PNG curves and a results table.

    .venv/bin/python scripts/compare_runs.py runs/A runs/B [...] --out results/compare

A run directory without event files is read from its metrics.jsonl (or metrics.jsonl.xz or .gz: the runs kept in
docs/results/), which holds the same scalars.

Writes, under --out:
  curves_vs_step.png, curves_vs_wall_time.png, curves_vs_bytes.png
      dev WER (dev/wer) and train loss (train/loss) against the optimizer step, against wall time
      (event wall_time minus the run's first event) and against the cumulative bytes each rank received
      (comm/cum_bytes_recv at the nearest logged step);
  results.csv, results.md
      one row per run: algorithm, density (for dense and PowerSGD, which ignore the configured one: the
      last logged comm/density), P, steps, final/best dev WER, final dev CER, test WER and
      CER, bytes received per rank (in all and per step: the gradient exchange), synchronized
      BatchNorm's bytes per step (comm/syncbn_bytes_recv), mean compute / selection / communication
      / step time. With --target-wer W (or --target-run NAME: W = that run's best dev WER x (1 +
      --target-slack), "reaches dense's WER within 5%" by default) three more columns: target_dev_wer,
      and step_at_target and bytes_at_target, the step of the first dev evaluation at WER <= W and
      the bytes each rank had received by then (empty: never reached). Runs named <label>-s<seed> (bench/
      accuracy.sh --seeds) with --target-run <label>: each run's target is that of the <label> run at its seed.
  paired.csv, paired.md (with --paired-against LABEL, e.g. dense)
      every other label against LABEL at the seeds both ran, for test WER, best dev WER, the last
      epoch's training loss (epoch/loss), the test loss (how well the model fits held-out data) and
      the step at which dev WER first fell below 0.8 (leaving CTC's blank plateau; a run that never
      did is named in `unpaired`): the difference per seed, absolute and relative to LABEL's value, the
      means with 95% Student-t intervals (n-1 degrees of freedom; none for one seed), and a verdict from
      the relative interval ("not resolved" when it holds both -5% and +5%; the rule: sparse_asr/stats.py).
      A seed that only one side ran, or a value one side never logged, is named in `unpaired`. Runs pair
      by their config's `seed`; a run's label is its name without the suffix -s<seed>. --label-by KEY
      appends @<KEY's last part>=<value> to every label (and name): with distributed.world_size, Ok-Topk at
      P = 1, 2 and 4 are the labels oktopk@world_size=1, =2 and =4, each paired with dense@world_size=4 or
      with one another.
  paired_curves_vs_step.png (with --paired-against)
      one colour per label: the mean over its seeds of dev WER and train loss at every step all its seeds
      logged, the 95% interval of that mean as a band, each seed as a faint line; the loss on a log scale,
      each seed's running mean over a 25th of its logged steps, the geometric mean over seeds.
  spread.csv, spread.md (with --spread)
      per label over its seeds: how many runs never left CTC's blank plateau (dev WER < 0.8; which seeds), the
      median step at which the others left it, and test WER's mean, sample standard deviation, min and max
      (a run still on the plateau without a test WER, e.g. one still training, is undecided, not counted).
A tag a run never logged leaves its cells empty (and its curve out of the plot), never NaN errors. Runs logged
before the dev set's rename (val/*) are read as dev/* (sparse_asr/training/runlog.py).
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import yaml
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util

from sparse_asr.compression import COMPRESSORS
from sparse_asr.figures import save_png
from sparse_asr.stats import MARGIN_PCT, paired_interval, verdict
from sparse_asr.training.runlog import current_name, metrics_path, read_metrics

EVENT_GLOB = "events.out.tfevents.*"


@dataclass
class Curve:
    """One scalar tag of one run, sorted by step (one point per step)."""

    steps: np.ndarray
    wall_times: np.ndarray
    values: np.ndarray

    def last(self) -> float:
        return float(self.values[-1])


@dataclass
class Run:
    name: str
    path: Path
    config: dict
    curves: dict[str, Curve]

    def config_value(self, dotted: str):
        node = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node


# ---------------------------------------------------------------------------------------- reading
def read_event_dir(directory: Path) -> dict[str, list[tuple[float, int, float]]]:
    """(wall_time, step, value) points per tag, with TensorBoard's own reader. Scalars written the
    classic way (simple_value) and as scalar tensors (new-style summaries) are both read."""
    acc = event_accumulator.EventAccumulator(
        str(directory), size_guidance={event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0})
    acc.Reload()
    tags = acc.Tags()
    points = {tag: [(e.wall_time, e.step, e.value) for e in acc.Scalars(tag)] for tag in tags["scalars"]}
    for tag in tags["tensors"]:
        events = acc.Tensors(tag)
        arrays = [tensor_util.make_ndarray(e.tensor_proto) for e in events]
        if tag not in points and arrays and all(a.size == 1 for a in arrays):
            points[tag] = [(e.wall_time, e.step, float(a.reshape(()))) for e, a in zip(events, arrays)]
    return points


def load_run(run_dir: str | Path) -> Run:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise SystemExit(f"compare_runs: {run_dir} is not a directory")
    event_dirs = sorted({p.parent for p in run_dir.rglob(EVENT_GLOB)})
    merged: dict[str, list[tuple[float, int, float]]] = {}
    if event_dirs:
        for directory in event_dirs:
            for tag, points in read_event_dir(directory).items():
                merged.setdefault(current_name(tag), []).extend(points)
    elif metrics_path(run_dir):  # a run kept without its events (docs/results): the same scalars
        for row in read_metrics(run_dir):
            for tag, value in row.items():
                if tag not in ("kind", "step", "epoch", "time"):
                    merged.setdefault(tag, []).append((row["time"], row["step"], float(value)))
    else:
        raise SystemExit(f"compare_runs: no TensorBoard event files ({EVENT_GLOB}) or metrics.jsonl under {run_dir}")
    if not merged:
        raise SystemExit(f"compare_runs: the event files or metrics under {run_dir} hold no scalars")
    curves = {}
    for tag, points in merged.items():
        by_step = {}
        for wall_time, step, value in sorted(points):  # in time order: a re-logged step keeps its latest value
            by_step[step] = (wall_time, value)
        steps = np.array(sorted(by_step), dtype=np.int64)
        curves[tag] = Curve(steps, np.array([by_step[s][0] for s in steps]), np.array([by_step[s][1] for s in steps]))

    config = {}
    config_path = run_dir / "config.yaml"
    if config_path.is_file():
        with open(config_path) as f:
            config = yaml.safe_load(f) or {}
        if not isinstance(config, dict):
            raise SystemExit(f"compare_runs: {config_path} is not a mapping")
    else:
        print(f"compare_runs: warning: {config_path} missing; algorithm, density and P left empty", file=sys.stderr)
    return Run(run_dir.name, run_dir, config, curves)


# ---------------------------------------------------------------------------------------- table
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


# ---------------------------------------------------------------------------------------- paired seeds
# CTC's blank plateau: dev WER stays ~1 (mostly blanks) for a long and variable stretch, and when a run leaves
# it decides much of where a short CPU run ends (docs/results.md): the step of the first dev WER below this.
PLATEAU_EXIT_WER = 0.8
# dev evaluations averaged by the "mean dev WER of the last N" paired metric (one evaluation an epoch)
LAST_DEV_EVALS = 5


def plateau_exit_step(curve: Curve) -> float:
    """The step of the first dev evaluation with WER < PLATEAU_EXIT_WER (inf: never)."""
    below = np.flatnonzero(curve.values < PLATEAU_EXIT_WER)
    return float(curve.steps[below[0]]) if below.size else math.inf


# (column, what paired.md calls it, the tag, the value of a run's curve of that tag): lower is better for all.
# The test loss beside the training loss tells a worse fit of the training data from a worse model.
PAIRED_METRICS = [
    ("test_wer", "test WER", "test/wer", lambda curve: curve.last()),
    ("best_dev_wer", "best dev WER", "dev/wer", lambda curve: float(np.min(curve.values))),
    # the dev set has 267 words: the mean over the last epochs is a steadier read-out of where a run ended
    ("last5_dev_wer", f"mean dev WER of the last {LAST_DEV_EVALS}", "dev/wer",
     lambda curve: float(np.mean(curve.values[-LAST_DEV_EVALS:]))),
    ("last_epoch_loss", "last-epoch loss", "epoch/loss", lambda curve: curve.last()),
    ("test_loss", "test loss", "test/loss", lambda curve: curve.last()),
    ("plateau_exit_step", f"step of the first dev WER < {PLATEAU_EXIT_WER:g}", "dev/wer", plateau_exit_step),
]


def run_seed(run: Run) -> int | None:
    seed = run.config_value("seed")
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else None


def run_label(run: Run) -> str:
    """The run's name without '-s<seed>' where <seed> is its config's seed (bench/accuracy.sh --seeds
    names its runs <algorithm>-s<seed>); otherwise the name itself."""
    seed = run_seed(run)
    suffix = f"-s{seed}"
    if seed is not None and run.name.endswith(suffix) and len(run.name) > len(suffix):
        return run.name[: -len(suffix)]
    return run.name


def label_by(run: Run, key: str) -> None:
    """--label-by KEY: the run's name, and so its label, gets '@<KEY's last part>=<its value>' before the seed
    suffix (oktopk-s1 at distributed.world_size 2: oktopk@world_size=2-s1), so that runs of one algorithm from
    cells that differ in KEY are labels of their own: paired, tabled and plotted side by side."""
    value = run.config_value(key)
    if value is None or isinstance(value, (dict, list)):
        raise SystemExit(f"compare_runs: --label-by {key}: {run.path / 'config.yaml'} has no value at {key}")
    label = run_label(run)
    run.name = f"{label}@{key.rsplit('.', 1)[-1]}={value}{run.name[len(label):]}"


def runs_by_label_and_seed(runs: list[Run]) -> dict[str, dict[int, Run]]:
    """label -> seed -> run, in the order the runs were given; a run without a seed, or two runs of one
    label at one seed, is an error naming them (pairing must never guess)."""
    groups: dict[str, dict[int, Run]] = {}
    for run in runs:
        seed = run_seed(run)
        if seed is None:
            raise SystemExit(f"compare_runs: runs are paired by their config's seed, and {run.path / 'config.yaml'} "
                             f"has none (seed: {run.config_value('seed')!r})")
        label = run_label(run)
        other = groups.setdefault(label, {}).get(seed)
        if other is not None:
            raise SystemExit(f"compare_runs: {other.path} and {run.path} are both {label!r} at seed {seed}: "
                             f"cannot pair them (give one of them)")
        groups[label][seed] = run
    return groups


def paired_comparison(runs: list[Run], baseline: str) -> tuple[list[dict], list[int]]:
    """Every label but `baseline`, metric by metric, against `baseline` at the same seeds: the difference
    d_s = run - baseline and the relative one r_s = 100 d_s / baseline for each seed s both have, the mean
    of each with its 95% Student-t interval (sparse_asr.stats.paired_interval: n-1 degrees of freedom,
    none for one seed), and the verdict of the relative interval (sparse_asr.stats.verdict). A seed
    that only one side has, or where one side logged no value, is named in `unpaired`, never dropped
    silently. Returns (rows, every seed seen)."""
    groups = runs_by_label_and_seed(runs)
    if baseline not in groups:
        raise SystemExit(f"compare_runs: --paired-against {baseline!r} is not among the run labels {sorted(groups)} "
                         f"(a label is a run's name without -s<seed>)")
    all_seeds = sorted({seed for group in groups.values() for seed in group})
    base = groups[baseline]
    rows = []
    for label, group in groups.items():
        if label == baseline:
            continue
        for column, _, tag, read in PAIRED_METRICS:
            row = {"run": label, "baseline": baseline, "metric": column}
            diffs, rels, unpaired, zero_baseline = [], [], [], False
            for seed in sorted(set(group) | set(base)):
                if seed not in group or seed not in base:
                    unpaired.append(f"s{seed}: no {label if seed not in group else baseline} run")
                    continue
                missing = [r.name for r in (group[seed], base[seed]) if tag not in r.curves]
                if missing:
                    unpaired.append(f"s{seed}: {', '.join(missing)} logged no {tag}")
                    continue
                value, reference = read(group[seed].curves[tag]), read(base[seed].curves[tag])
                if not (math.isfinite(value) and math.isfinite(reference)):
                    unpaired.append(f"s{seed}: no finite {column} ({value} vs {reference})")
                    continue
                diff = value - reference
                rel = 100.0 * diff / reference if reference else None
                zero_baseline |= rel is None
                row.update({f"value_s{seed}": value, f"baseline_s{seed}": reference, f"diff_s{seed}": diff,
                            f"rel_pct_s{seed}": rel})
                diffs.append(diff)
                rels.append(rel)
            row["n"] = len(diffs)
            row["unpaired"] = "; ".join(unpaired)
            absolute = paired_interval(diffs) if diffs else None
            # a baseline of 0 has no relative difference: no relative interval, no verdict
            relative = paired_interval(rels) if rels and not zero_baseline else None
            row.update(mean_diff=absolute and absolute.mean, diff_low=absolute and absolute.low,
                       diff_high=absolute and absolute.high, mean_rel_pct=relative and relative.mean,
                       rel_low_pct=relative and relative.low, rel_high_pct=relative and relative.high)
            row["verdict"] = (verdict(relative) if relative else
                              "n/a (no pair)" if not diffs else "n/a (baseline 0)")
            rows.append(row)
    return rows, all_seeds


PAIRED_COLUMNS = ["run", "baseline", "metric", "n", "mean_diff", "diff_low", "diff_high", "mean_rel_pct", "rel_low_pct",
                  "rel_high_pct", "verdict", "unpaired"]


def paired_frame(rows: list[dict], seeds: list[int]) -> pd.DataFrame:
    """paired.csv: the fixed columns, then value, baseline, diff and rel_pct of each seed."""
    per_seed = [f"{what}_s{seed}" for seed in seeds for what in ("value", "baseline", "diff", "rel_pct")]
    return pd.DataFrame(rows, columns=PAIRED_COLUMNS + per_seed)


def paired_markdown(rows: list[dict], seeds: list[int], baseline: str) -> str:
    def signed(x) -> str:
        return "n/a" if x is None else f"{x:+.4g}"

    def pct(x) -> str:
        return "n/a" if x is None else f"{x:+.1f}%"

    def interval(mean, low, high, fmt) -> str:
        return "" if mean is None else fmt(mean) + ("" if low is None else f" [{fmt(low)}, {fmt(high)}]")

    titles = {column: title for column, title, _, _ in PAIRED_METRICS}
    m = f"{MARGIN_PCT:g}%"
    lines = [
        f"Paired by seed against {baseline}: for each seed both ran, difference = run - {baseline} and relative = "
        f"100 x difference / {baseline}'s value (lower is better for every metric); the mean of the n paired "
        f"differences with its 95% Student-t interval (n-1 degrees of freedom; n/a for one seed). Verdict, from "
        f"the interval of the relative difference: worse / better = it excludes 0 (\"by > {m}\": it also excludes "
        f"the {m} on that side; \"by < {m}\": it stays within {m}); not resolved = it holds both -{m} and +{m}; "
        f"within ±{m} = it holds 0 and lies inside ±{m}; not worse by {m} / not better by {m} = it holds 0 "
        f"and only one of ±{m}. Ends count as inside.",
        "",
        f"| run | metric | n | per seed: difference (relative) | mean run / {baseline} | mean difference [95% CI] "
        "| mean relative [95% CI] | verdict | unpaired |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        paired = [s for s in seeds if row.get(f"diff_s{s}") is not None]
        per_seed = "; ".join(f"s{s} {signed(row[f'diff_s{s}'])} ({pct(row[f'rel_pct_s{s}'])})" for s in paired)
        means = "" if not paired else " / ".join(
            f"{np.mean([row[f'{what}_s{s}'] for s in paired]):.4g}" for what in ("value", "baseline"))
        lines.append(" | ".join([
            f"| {row['run']}", titles[row["metric"]], str(row["n"]), per_seed, means,
            interval(row["mean_diff"], row["diff_low"], row["diff_high"], signed),
            interval(row["mean_rel_pct"], row["rel_low_pct"], row["rel_high_pct"], pct),
            row["verdict"], row["unpaired"]]) + " |")
    return "\n".join(lines) + "\n"


def spread_rows(runs: list[Run]) -> list[dict]:
    """--spread: per label over its seeds (each seed once), how many runs never left CTC's blank plateau (no dev
    WER < PLATEAU_EXIT_WER; which seeds) and the spread of test WER: mean, sample standard deviation (n-1), min and
    max over the runs that logged one; the median step at which the others left the plateau. A run still on the
    plateau that logged no test WER has not ended (or had no test set): it is undecided, not counted as stuck."""
    rows = []
    for label, group in runs_by_label_and_seed(runs).items():
        exits = {seed: plateau_exit_step(run.curves["dev/wer"])
                 for seed, run in group.items() if "dev/wer" in run.curves}
        never_left = [seed for seed, step in exits.items() if math.isinf(step)]
        stuck = [seed for seed in never_left if "test/wer" in group[seed].curves]
        undecided = [seed for seed in never_left if seed not in stuck]
        left = [step for step in exits.values() if math.isfinite(step)]
        test = [run.curves["test/wer"].last() for run in group.values() if "test/wer" in run.curves]
        rows.append({"label": label, "n": len(group), "seeds": " ".join(str(s) for s in sorted(group)),
                     "on_plateau": len(stuck), "on_plateau_seeds": " ".join(str(s) for s in sorted(stuck)),
                     "undecided_seeds": " ".join(str(s) for s in sorted(undecided)),
                     "median_exit_step": float(np.median(left)) if left else None, "n_test": len(test),
                     "test_wer_mean": float(np.mean(test)) if test else None,
                     "test_wer_sd": float(np.std(test, ddof=1)) if len(test) > 1 else None,
                     "test_wer_min": min(test, default=None), "test_wer_max": max(test, default=None)})
    return rows


def spread_markdown(rows: list[dict]) -> str:
    def num(x, digits=4) -> str:
        return "" if x is None else f"{x:.{digits}g}"

    lines = [f"Per label over its seeds: runs that never left CTC's blank plateau (no dev WER < {PLATEAU_EXIT_WER:g}), "
             "the median step at which the others left it, and test WER's mean, sample standard deviation (n-1), "
             "min and max. A run still on the plateau with no test WER (not ended) is undecided, not counted.", "",
             "| label | seeds | on the plateau (seeds) | median exit step | test WER mean | sd | min | max |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        stuck = f"{r['on_plateau']} of {r['n']}" + (f" ({r['on_plateau_seeds']})" if r["on_plateau"] else "")
        if r["undecided_seeds"]:
            stuck += f"; undecided: {r['undecided_seeds']}"
        lines.append(f"| {r['label']} | {r['seeds']} | {stuck} | {num(r['median_exit_step'])} | "
                     f"{num(r['test_wer_mean'])} | {num(r['test_wer_sd'])} | {num(r['test_wer_min'])} | "
                     f"{num(r['test_wer_max'])} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------- plots
def nearest_values(curve: Curve, steps: np.ndarray) -> np.ndarray:
    """curve's value at the logged step nearest to each of `steps` (ties go to the earlier step)."""
    right = np.clip(np.searchsorted(curve.steps, steps), 0, len(curve.steps) - 1)
    left = np.clip(right - 1, 0, len(curve.steps) - 1)
    take_left = np.abs(steps - curve.steps[left]) <= np.abs(curve.steps[right] - steps)
    return np.where(take_left, curve.values[left], curve.values[right])


def x_values(run: Run, curve: Curve, axis: str) -> np.ndarray | None:
    """The x coordinates of `curve` on one axis (steps, seconds since the run's first event, or bytes)."""
    if axis == "step":
        return curve.steps
    if axis == "wall_time":
        start = min(float(c.wall_times[0]) for c in run.curves.values())
        return curve.wall_times - start
    if "comm/cum_bytes_recv" not in run.curves:
        return None
    return nearest_values(run.curves["comm/cum_bytes_recv"], curve.steps)


def readable_unit(axis: str, largest: float) -> tuple[float, str]:
    """(divisor, unit) so that the axis reads in a sensible unit."""
    if axis == "wall_time":
        units = [(1.0, "s"), (60.0, "min"), (3600.0, "h")]
        limits = [120.0, 120.0 * 60.0]
    elif axis == "bytes":
        units = [(1.0, "B"), (1e3, "KB"), (1e6, "MB"), (1e9, "GB"), (1e12, "TB")]
        limits = [1e3, 1e6, 1e9, 1e12]
    else:
        return 1.0, ""
    for (divisor, unit), limit in zip(units, limits):
        if largest < limit:
            return divisor, unit
    return units[-1]


AXES = {
    "step": ("optimizer step", "curves_vs_step.png"),
    "wall_time": ("wall time since the run's first event ({unit})", "curves_vs_wall_time.png"),
    "bytes": ("cumulative bytes received per rank ({unit}, mean over ranks)", "curves_vs_bytes.png"),
}
PANELS = [("dev/wer", "dev WER", "o-"), ("train/loss", "train loss (CTC)", "-")]


def plot(runs: list[Run], out_dir: Path) -> list[Path]:
    written = []
    for axis, (xlabel, filename) in AXES.items():
        series = {}  # (panel tag, run name) -> (x, y)
        for tag, _, _ in PANELS:
            for run in runs:
                if tag in run.curves:
                    x = x_values(run, run.curves[tag], axis)
                    if x is not None:
                        series[tag, run.name] = (x, run.curves[tag].values)
        largest = max((float(np.max(x)) for x, _ in series.values()), default=0.0)
        divisor, unit = readable_unit(axis, largest)
        # Dense receives 10-100x what the compressors do: on a linear axis their curves collapse into one.
        finals = [float(np.max(x)) for x, _ in series.values()]
        log_x = axis == "bytes" and bool(finals) and min(finals) > 0 and max(finals) > 5 * min(finals)
        fig, axes = plt.subplots(1, len(PANELS), figsize=(13, 4.8))
        for ax, (tag, title, style) in zip(axes, PANELS):
            drawn = [(name, xy) for (t, name), xy in series.items() if t == tag]
            for name, (x, y) in drawn:
                ax.plot(x / divisor, y, style, label=name, markersize=4, linewidth=1.2)
            ax.set_title(title)
            ax.set_xlabel(xlabel.format(unit=unit) + (", log scale" if log_x else ""))
            if log_x:
                ax.set_xscale("log")
            ax.grid(alpha=0.3)
            if drawn:
                ax.legend(fontsize=8)
            else:
                ax.text(0.5, 0.5, f"no run logged {tag}" + (" and comm/cum_bytes_recv" if axis == "bytes" else ""),
                        ha="center", va="center", transform=ax.transAxes)
        fig.tight_layout()
        path = out_dir / filename
        save_png(fig, path)
        plt.close(fig)
        written.append(path)
    return written


def running_mean(values: np.ndarray, window: int) -> np.ndarray:
    """Each point the mean of the `window` points ending at it (fewer at the start)."""
    sums = np.concatenate([[0.0], np.cumsum(values, dtype=float)])
    end = np.arange(1, len(values) + 1)
    start = np.maximum(0, end - window)
    return (sums[end] - sums[start]) / (end - start)


def seed_band(runs_by_seed: dict[int, Run], tag: str, window: int = 1, log: bool = False) -> dict | None:
    """Over the seeds of one label: the steps every seed logged `tag` at, each seed's values there (one row per
    seed; with window > 1 each seed's running mean over that many points), and per step the mean with its 95%
    Student-t interval (sparse_asr/stats.py; low/high None for one seed). log=True takes mean and interval of
    the logarithms (a geometric mean, a band that stays positive on a log axis). None when no step is shared."""
    curves = [run.curves[tag] for run in runs_by_seed.values() if tag in run.curves]
    if not curves:
        return None
    steps = curves[0].steps
    for curve in curves[1:]:
        steps = np.intersect1d(steps, curve.steps)
    if not steps.size:
        return None
    values = np.stack([running_mean(curve.values[np.searchsorted(curve.steps, steps)], window) for curve in curves])
    if log and np.any(values <= 0):
        raise SystemExit(f"compare_runs: {tag} has values <= 0: no log-scale band")
    scaled = np.log(values) if log else values
    intervals = [paired_interval([float(v) for v in column]) for column in scaled.T]
    back = np.exp if log else (lambda x: x)
    ends = [(None, None) if i.low is None else (float(back(i.low)), float(back(i.high))) for i in intervals]
    return {"steps": steps, "values": values, "mean": back(np.array([i.mean for i in intervals])),
            "low": [low for low, _ in ends], "high": [high for _, high in ends]}


def plot_paired(runs: list[Run], out_dir: Path) -> Path:
    """paired_curves_vs_step.png: one colour per label (algorithm), its mean over seeds as a line with the 95%
    interval of that mean as a band (seed_band), every seed faint beneath. Dev WER (the band cut at 0, which no
    WER goes below); train loss on a log scale, each seed's running mean over a 25th of its logged steps (the
    per-batch loss swings with the utterances' lengths) and the geometric mean over seeds."""
    groups = runs_by_label_and_seed(runs)
    colours = plt.get_cmap("tab10" if len(groups) <= 10 else "tab20").colors
    logged = max((len(run.curves["train/loss"].steps) for run in runs if "train/loss" in run.curves), default=1)
    window = max(1, logged // 25)
    panels = [("dev/wer", "dev WER", 1, False),
              ("train/loss", f"train loss (CTC), running mean over {window} logged steps, log scale", window, True)]
    fig, axes = plt.subplots(1, len(panels), figsize=(13, 4.8))
    for ax, (tag, title, smooth, log_y) in zip(axes, panels):
        for colour, (label, by_seed) in zip(colours, groups.items()):
            band = seed_band(by_seed, tag, window=smooth, log=log_y)
            if band is None:
                continue
            steps, n = band["steps"], band["values"].shape[0]
            for row in band["values"]:
                ax.plot(steps, row, color=colour, alpha=0.18, linewidth=0.8)
            ax.plot(steps, band["mean"], color=colour, linewidth=2,
                    label=f"{label} ({'geometric ' if log_y else ''}mean of {n} seed{'s' if n > 1 else ''})")
            if n > 1:
                low = np.array(band["low"]) if log_y else np.maximum(np.array(band["low"]), 0.0)
                ax.fill_between(steps, low, band["high"], color=colour, alpha=0.25, linewidth=0)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("optimizer step")
        if log_y:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("mean over seeds, 95% interval of the mean shaded")
    fig.tight_layout()
    path = out_dir / "paired_curves_vs_step.png"
    save_png(fig, path)
    plt.close(fig)
    return path


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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", help="run directories (runs/<name>) holding event files and config.yaml")
    parser.add_argument("--out", required=True, help="directory for the plots and results.{csv,md}")
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--target-wer", type=float, help="dev WER whose first reaching step and bytes are tabled")
    target.add_argument("--target-run", help="the target is this run's best dev WER x (1 + --target-slack); a label "
                                             "(runs <label>-s<seed>): the one of each run's seed")
    parser.add_argument("--target-slack", type=float, default=0.05, help="relative slack of --target-run")
    parser.add_argument("--paired-against", metavar="LABEL",
                        help="also write paired.{csv,md}: every other label against LABEL, seed by seed")
    parser.add_argument("--label-by", metavar="KEY",
                        help="a config key (e.g. distributed.world_size) whose value each run's label carries "
                             "(oktopk@world_size=2): runs of one algorithm from different cells side by side")
    parser.add_argument("--spread", action="store_true",
                        help="also write spread.{csv,md}: per label, the runs left on CTC's plateau and test WER's "
                             "spread")
    args = parser.parse_args(argv)

    runs = [load_run(d) for d in args.run_dirs]
    if args.label_by is not None:
        for run in runs:
            label_by(run, args.label_by)
    names = [run.name for run in runs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SystemExit(f"compare_runs: runs with the same name would share a legend entry: {duplicates} (runs of "
                         f"different cells: --label-by the config key that tells them apart)")
    targets = [args.target_wer] * len(runs)
    if args.target_run is not None:
        targets = run_targets(runs, args.target_run, args.target_slack)
    paired = paired_comparison(runs, args.paired_against) if args.paired_against is not None else None
    spread = spread_rows(runs) if args.spread else None
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    table = pd.DataFrame([summarize(run, target_wer) for run, target_wer in zip(runs, targets)])
    table.to_csv(out_dir / "results.csv", index=False)
    markdown = markdown_table(table)
    (out_dir / "results.md").write_text(markdown)
    written = [out_dir / "results.csv", out_dir / "results.md"]
    if paired is not None:
        rows, seeds = paired
        paired_frame(rows, seeds).to_csv(out_dir / "paired.csv", index=False)
        paired_md = paired_markdown(rows, seeds, args.paired_against)
        (out_dir / "paired.md").write_text(paired_md)
        written += [out_dir / "paired.csv", out_dir / "paired.md"]
        markdown += "\n" + paired_md
        for row in rows:
            if row["unpaired"]:
                print(f"compare_runs: warning: {row['run']} {row['metric']}: unpaired: {row['unpaired']}",
                      file=sys.stderr)
    if spread is not None:
        pd.DataFrame(spread).to_csv(out_dir / "spread.csv", index=False)
        spread_md = spread_markdown(spread)
        (out_dir / "spread.md").write_text(spread_md)
        written += [out_dir / "spread.csv", out_dir / "spread.md"]
        markdown += "\n" + spread_md
    plots = plot(runs, out_dir)
    if paired is not None:
        plots.append(plot_paired(runs, out_dir))
    print(markdown)
    print("wrote", ", ".join(str(p) for p in [*written, *plots]))
    return 0

if __name__ == "__main__":
    sys.exit(main())
