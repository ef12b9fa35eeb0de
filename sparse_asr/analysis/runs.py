"""A run directory read for comparison: its scalars, one curve per tag, and its config.

The scalars come from the TensorBoard event files, or, for a run kept without them (docs/results: config,
provenance and metrics.jsonl.xz, keep.py), from metrics.jsonl, which holds the same scalars. Tags logged before
the dev set's rename (val/*) read as dev/* (training/runlog.py)."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util

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


def nearest_values(curve: Curve, steps: np.ndarray) -> np.ndarray:
    """curve's value at the logged step nearest to each of `steps` (ties go to the earlier step)."""
    right = np.clip(np.searchsorted(curve.steps, steps), 0, len(curve.steps) - 1)
    left = np.clip(right - 1, 0, len(curve.steps) - 1)
    take_left = np.abs(steps - curve.steps[left]) <= np.abs(curve.steps[right] - steps)
    return np.where(take_left, curve.values[left], curve.values[right])


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
