"""Does the selection screen predict training? For every cell this repository has trained with paired seeds, the
window screen's figure beside the cell's paired training verdicts.

    .venv/bin/python bench/screen_vs_training.py --screen A.csv [B.csv ...] [--window 50] [--out FILE.md]

Each A.csv holds the per-step figures of `bench/selection_quality.py --seeds ... --out A.md` run at the cells' global
batches and P (the config each cell trained with). Per cell and exchange: the screen's shortfall, 1 - cos(its
displacement over W steps, dense momentum SGD's), and its per-step shortfall 1 - cos(step, dense's step), each the
mean over trajectories with a 95% interval; beside them the training's paired relative differences against dense
(test WER, last-epoch training loss) from the cell's paired.csv. Then the two orders a predictive screen must get
right: the exchanges within a cell, and one exchange across cells, each by the screen and by the training loss
(the better-resolved training metric).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import selection_intervals as si  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


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


def trained(cell: Cell, run: str, metric: str) -> tuple[float, float, float, str]:
    """(mean, low, high) relative difference in % and the verdict of `run` against dense in the cell's paired table."""
    table = pd.read_csv(REPO / cell.paired)
    row = table[(table["run"] == run) & (table["metric"] == metric)].iloc[0]
    return float(row["mean_rel_pct"]), float(row["rel_low_pct"]), float(row["rel_high_pct"]), str(row["verdict"])


def screened(trajectories: pd.DataFrame, cell: Cell, label: str, figure: str) -> dict[int, float]:
    """seed -> 1 - the figure (a cosine) for this exchange at the cell's global batch and P."""
    rows = trajectories[(trajectories["algorithm"] == label) & (trajectories["global_batch"] == cell.global_batch)
                        & (trajectories["P"] == cell.P)]
    return {int(r["seed"]): 1.0 - float(r[figure]) for _, r in rows.iterrows()}


def pct(mean: float, low: float, high: float) -> str:
    return f"{mean:+.1f}% [{low:+.1f}%, {high:+.1f}%]"


def report(trajectories: pd.DataFrame, window: int) -> str:
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
            wer, loss = trained(cell, run, "test_wer"), trained(cell, run, "last_epoch_loss")
            by_cell.setdefault(cell.name, {})[label] = (shortfall, loss)
            lines.append(f"| {cell.name} | {label} | {len(shortfall)} | "
                         f"{si.interval_text(list(shortfall.values()), 4)} | "
                         f"{si.interval_text(list(step.values()), 4)} | {pct(*wer[:3])} ({wer[3]}) | "
                         f"{pct(*loss[:3])} ({loss[3]}) |")
    lines += ["", "Within a cell (complete_values against Ok-Topk): the screen's paired difference of shortfalls over "
              "trajectories, and the training's difference of mean loss gaps (negative: complete_values closer "
              "to dense):",
              ""]
    for name, rows in by_cell.items():
        if {"oktopk", "complete_values"} <= set(rows):
            ok, cv = rows["oktopk"], rows["complete_values"]
            seeds = sorted(set(ok[0]) & set(cv[0]))
            screen = si.interval_text([cv[0][s] - ok[0][s] for s in seeds], 4)
            lines.append(f"- {name}: screen {screen}; training loss {cv[1][0] - ok[1][0]:+.1f} points")
    ok_cells = [(name, rows["oktopk"]) for name, rows in by_cell.items() if "oktopk" in rows]
    by_screen = [name for name, (s, _) in sorted(ok_cells, key=lambda c: -sum(c[1][0].values()) / len(c[1][0]))]
    by_loss = [name for name, (_, loss) in sorted(ok_cells, key=lambda c: -c[1][1][0])]
    lines += ["", "Ok-Topk across cells, farthest from dense first:", "",
              f"- by the screen: {'; '.join(by_screen)}", f"- by the training loss: {'; '.join(by_loss)}"]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--screen", type=Path, nargs="+", required=True, help="per-step CSVs of selection_quality.py")
    parser.add_argument("--window", type=int, default=50, help="the displacement window, in steps (default 50)")
    parser.add_argument("--out", type=Path, help="also write the report to this .md")
    args = parser.parse_args(argv)
    steps = pd.concat([pd.read_csv(path) for path in args.screen], ignore_index=True)
    if f"cos_disp_W{args.window}" not in steps.columns:
        print(f"screen_vs_training: the screens hold no displacement over {args.window} steps", file=sys.stderr)
        return 2
    text = report(si.per_trajectory(steps, "oracle"), args.window)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
