"""The screen beside training: a screen's figures for the cells whose accuracy runs were trained and kept
(docs/results/<cell>/paired.csv), next to their paired training verdicts, and the cells ranked both ways
(what bench/screen_vs_training.py prints)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from sparse_asr.screening.intervals import interval_text


@dataclass(frozen=True)
class Cell:
    name: str
    global_batch: int
    P: int
    paired: str  # the cell's paired table, from the repository root
    runs: dict  # the screen's row label -> the paired table's run label


CELLS = [
    Cell("4 per rank (P = 4, global 16)", 16, 4, "docs/results/cell_p4_cpu/paired.csv",
         {"oktopk": "oktopk", "complete_values": "oktopk-complete_valuestrue"}),
    Cell("8 per rank (P = 2, global 16)", 16, 2, "docs/results/cells_g16_cpu/paired.csv",
         {"oktopk": "oktopk@world_size=2"}),
    Cell("16 per rank (P = 1, global 16)", 16, 1, "docs/results/cell_p1_cpu/paired.csv", {"oktopk": "oktopk"}),
    Cell("16 per rank (P = 4, global 64, clipped)", 64, 4, "docs/results/cell_g64c_cpu/paired.csv",
         {"oktopk": "oktopk", "complete_values": "oktopk-complete_valuestrue"}),
]


def trained(cell: Cell, run: str, metric: str, root: Path) -> tuple[float, float, float, str]:
    """(mean, low, high) relative difference in % and the verdict of `run` against dense in the cell's paired table
    (under the repository `root`)."""
    table = pd.read_csv(root / cell.paired)
    row = table[(table["run"] == run) & (table["metric"] == metric)].iloc[0]
    return float(row["mean_rel_pct"]), float(row["rel_low_pct"]), float(row["rel_high_pct"]), str(row["verdict"])


def screened(trajectories: pd.DataFrame, cell: Cell, label: str, figure: str) -> dict[int, float]:
    """seed -> 1 - the figure (a cosine) for this exchange at the cell's global batch and P."""
    rows = trajectories[(trajectories["algorithm"] == label) & (trajectories["global_batch"] == cell.global_batch)
                        & (trajectories["P"] == cell.P)]
    return {int(r["seed"]): 1.0 - float(r[figure]) for _, r in rows.iterrows()}


def pct(mean: float, low: float, high: float) -> str:
    return f"{mean:+.1f}% [{low:+.1f}%, {high:+.1f}%]"


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
            wer, loss = trained(cell, run, "test_wer", root), trained(cell, run, "last_epoch_loss", root)
            by_cell.setdefault(cell.name, {})[label] = (shortfall, loss)
            lines.append(f"| {cell.name} | {label} | {len(shortfall)} | "
                         f"{interval_text(list(shortfall.values()), 4)} | "
                         f"{interval_text(list(step.values()), 4)} | {pct(*wer[:3])} ({wer[3]}) | "
                         f"{pct(*loss[:3])} ({loss[3]}) |")
    lines += ["", "Within a cell (complete_values against Ok-Topk): the screen's paired difference of shortfalls over "
              "trajectories, and the training's difference of mean loss gaps (negative: complete_values closer "
              "to dense):",
              ""]
    for name, rows in by_cell.items():
        if {"oktopk", "complete_values"} <= set(rows):
            ok, cv = rows["oktopk"], rows["complete_values"]
            seeds = sorted(set(ok[0]) & set(cv[0]))
            screen = interval_text([cv[0][s] - ok[0][s] for s in seeds], 4)
            lines.append(f"- {name}: screen {screen}; training loss {cv[1][0] - ok[1][0]:+.1f} points")
    ok_cells = [(name, rows["oktopk"]) for name, rows in by_cell.items() if "oktopk" in rows]
    by_screen = [name for name, (s, _) in sorted(ok_cells, key=lambda c: -sum(c[1][0].values()) / len(c[1][0]))]
    by_loss = [name for name, (_, loss) in sorted(ok_cells, key=lambda c: -c[1][1][0])]
    lines += ["", "Ok-Topk across cells, farthest from dense first:", "",
              f"- by the screen: {'; '.join(by_screen)}", f"- by the training loss: {'; '.join(by_loss)}"]
    return "\n".join(lines)
