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
            by_cell.setdefault(cell.name, {})[label] = (shortfall, wer, loss)
            lines.append(f"| {cell.name} | {label} | {len(shortfall)} | "
                         f"{interval_text(list(shortfall.values()), 4)} | "
                         f"{interval_text(list(step.values()), 4)} | {pct(*wer[:3])} ({wer[3]}) | "
                         f"{pct(*loss[:3])} ({loss[3]}) |")
    lines += ["", "Within a cell, each exchange against Ok-Topk: the screen's paired difference of shortfalls over "
              "trajectories, and the training's differences of mean gaps to dense (negative: the exchange closer "
              "to dense than Ok-Topk):",
              ""]
    for name, rows in by_cell.items():
        ok = rows.get("oktopk")
        if ok is None:
            continue
        for label, (shortfall, wer, loss) in rows.items():
            if label == "oktopk":
                continue
            seeds = sorted(set(ok[0]) & set(shortfall))
            screen = interval_text([shortfall[s] - ok[0][s] for s in seeds], 4)
            lines.append(f"- {name}, {label}: screen {screen}; training loss {loss[0] - ok[2][0]:+.1f} points, "
                         f"test WER {wer[0] - ok[1][0]:+.1f} points")
    across = {cell.name for cell in CELLS if cell.across}
    ok_cells = [(name, rows["oktopk"]) for name, rows in by_cell.items() if "oktopk" in rows and name in across]
    by_screen = [name for name, _ in sorted(ok_cells, key=lambda c: -sum(c[1][0].values()) / len(c[1][0]))]
    by_loss = [name for name, _ in sorted(ok_cells, key=lambda c: -c[1][2][0])]
    lines += ["", "Ok-Topk across cells, farthest from dense first:", "",
              f"- by the screen: {'; '.join(by_screen)}", f"- by the training loss: {'; '.join(by_loss)}"]
    return "\n".join(lines)
