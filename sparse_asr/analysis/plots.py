"""compare_runs' pictures: dev WER and train loss of every run against the optimizer step, the wall time and the
bytes each rank received; and the paired picture, the mean over seeds of each label with its 95% band."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from sparse_asr.analysis.paired import runs_by_label_and_seed, seed_band
from sparse_asr.analysis.runs import Curve, Run, nearest_values
from sparse_asr.figures import save_png


def x_values(run: Run, curve: Curve, axis: str) -> np.ndarray | None:
    """The x coordinates of `curve` on one axis (steps, seconds since the run's first event, or bytes)."""
    if axis == "step":
        return curve.steps
    if axis == "wall_time":
        start = min(float(c.wall_times[0]) for c in run.curves.values())
        return curve.wall_times - start
    if "comm/cum_bytes_recv" not in run.curves:
        return None
    received = nearest_values(run.curves["comm/cum_bytes_recv"], curve.steps)
    # A one-process run exchanges nothing: every point would sit at x = 0, so it has no place on this axis.
    return received if np.any(received > 0) else None


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
                why = " and received bytes (one-process runs exchange nothing)" if axis == "bytes" else ""
                ax.text(0.5, 0.5, f"no run logged {tag}{why}", ha="center", va="center", transform=ax.transAxes)
        fig.tight_layout()
        path = out_dir / filename
        save_png(fig, path)
        plt.close(fig)
        written.append(path)
    return written



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
        if ax.get_legend_handles_labels()[0]:  # a metric no run logged has no curve to name
            ax.legend(fontsize=8)
    axes[0].set_ylabel("mean over seeds, 95% interval of the mean shaded")
    fig.tight_layout()
    path = out_dir / "paired_curves_vs_step.png"
    save_png(fig, path)
    plt.close(fig)
    return path

