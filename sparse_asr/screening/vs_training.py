"""The screen beside training: a screen's figures for the cells whose accuracy runs were trained and kept
(docs/results/<cell>/paired.csv), next to their paired training verdicts, and the cells ranked both ways
(what bench/screen_vs_training.py prints)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import pandas as pd

from sparse_asr.screening.intervals import interval_text


@dataclass(frozen=True)
class Cell:
    name: str
    global_batch: int
    P: int
    paired: str  # the cell's paired table, from the repository root
    runs: dict  # the screen's row label -> the paired table's run label
    across: bool = True  # False: another cell's settings trained again (more seeds); Ok-Topk's order lists it once


CELLS = [
    Cell("4 per rank (P = 4, global 16)", 16, 4, "docs/results/cell_p4_cpu/paired.csv",
         {"oktopk": "oktopk", "complete_values": "oktopk-complete_valuestrue"}),
    Cell("4 per rank (P = 4, global 16), verdict", 16, 4, "docs/results/verdict_p4x4/paired.csv",
         {"oktopk": "oktopk", "onebit": "onebit"}, across=False),
    Cell("8 per rank (P = 2, global 16)", 16, 2, "docs/results/cells_g16_cpu/paired.csv",
         {"oktopk": "oktopk@world_size=2"}),
    Cell("16 per rank (P = 1, global 16)", 16, 1, "docs/results/cell_p1_cpu/paired.csv", {"oktopk": "oktopk"}),
    Cell("16 per rank (P = 4, global 64, clipped)", 64, 4, "docs/results/cell_g64c_cpu/paired.csv",
         {"oktopk": "oktopk", "complete_values": "oktopk-complete_valuestrue"}),
]


class Gap(NamedTuple):
    """A run's paired relative difference from dense in %, its 95% interval and its verdict."""
    mean: float
    low: float
    high: float
    verdict: str

    def text(self) -> str:
        return f"{self.mean:+.1f}% [{self.low:+.1f}%, {self.high:+.1f}%] ({self.verdict})"


class Screened(NamedTuple):
    """One exchange of a cell: the screen's shortfall per seed beside its training gaps to dense."""
    shortfall: dict[int, float]
    test_wer: Gap
    loss: Gap


def trained(cell: Cell, run: str, metric: str, root: Path) -> Gap:
    """`run`'s gap to dense on `metric` in the cell's paired table (under the repository `root`)."""
    table = pd.read_csv(root / cell.paired)
    row = table[(table["run"] == run) & (table["metric"] == metric)].iloc[0]
    return Gap(float(row["mean_rel_pct"]), float(row["rel_low_pct"]), float(row["rel_high_pct"]), str(row["verdict"]))


def screened(trajectories: pd.DataFrame, cell: Cell, label: str, figure: str) -> dict[int, float]:
    """seed -> 1 - the figure (a cosine) for this exchange at the cell's global batch and P."""
    rows = trajectories[(trajectories["algorithm"] == label) & (trajectories["global_batch"] == cell.global_batch)
                        & (trajectories["P"] == cell.P)]
    return {int(r["seed"]): 1.0 - float(r[figure]) for _, r in rows.iterrows()}


def report(trajectories: pd.DataFrame, window: int, root: Path) -> str:
    """The screen's figures of the trained cells beside their paired training verdicts (the tables under `root`)."""
    figure = f"cos_disp_W{window}"
    lines = [f"| cell | exchange | trajectories | screen: 1 - cos(displacement over {window} steps) "
             "| screen: 1 - cos(step) | training: test WER vs dense | training: last-epoch loss vs dense |",
             "|---|---|---|---|---|---|---|"]
    by_cell = {}
    for cell in CELLS:
        for label, run in cell.runs.items():
            shortfall, step = (screened(trajectories, cell, label, figure),
                               screened(trajectories, cell, label, "cos_step"))
            if not shortfall:
                continue
            row = Screened(shortfall, trained(cell, run, "test_wer", root), trained(cell, run, "last_epoch_loss", root))
            by_cell.setdefault(cell.name, {})[label] = row
            lines.append(f"| {cell.name} | {label} | {len(shortfall)} | "
                         f"{interval_text(list(shortfall.values()), 4)} | "
                         f"{interval_text(list(step.values()), 4)} | {row.test_wer.text()} | {row.loss.text()} |")
    lines += ["", "Within a cell, each exchange against Ok-Topk: the screen's paired difference of shortfalls over "
              "trajectories, and the training's differences of mean gaps to dense (negative: the exchange closer "
              "to dense than Ok-Topk):",
              ""]
    for name, rows in by_cell.items():
        ok = rows.get("oktopk")
        if ok is None:
            continue
        for label, row in rows.items():
            if label == "oktopk":
                continue
            seeds = sorted(set(ok.shortfall) & set(row.shortfall))
            screen = interval_text([row.shortfall[s] - ok.shortfall[s] for s in seeds], 4)
            lines.append(f"- {name}, {label}: screen {screen}; training loss {row.loss.mean - ok.loss.mean:+.1f} "
                         f"points, test WER {row.test_wer.mean - ok.test_wer.mean:+.1f} points")
    across = {cell.name for cell in CELLS if cell.across}
    oktopk = {name: rows["oktopk"] for name, rows in by_cell.items() if "oktopk" in rows and name in across}
    by_screen = sorted(oktopk, key=lambda name: -sum(oktopk[name].shortfall.values()) / len(oktopk[name].shortfall))
    by_loss = sorted(oktopk, key=lambda name: -oktopk[name].loss.mean)
    lines += ["", "Ok-Topk across cells, farthest from dense first:", "",
              f"- by the screen: {'; '.join(by_screen)}", f"- by the training loss: {'; '.join(by_loss)}"]
    return "\n".join(lines)
