"""Does the selection screen predict training? For every cell this repository has trained with paired seeds, the
window screen's figure beside the cell's paired training verdicts.

    .venv/bin/python bench/screen_vs_training.py --screen A.csv [B.csv ...] [--window 50] [--out FILE.md]

Each A.csv holds the per-step figures of `bench/selection_quality.py --seeds ... --out A.md` run at the cells' global
batches and P (the config each cell trained with), or the per-trajectory means it keeps beside them (A_trajectories.csv,
what docs/results/verdict_p4x4/screen/ holds). Per cell and exchange: the screen's shortfall, 1 - cos(its
displacement over W steps, dense momentum SGD's), and its per-step shortfall 1 - cos(step, dense's step), each the
mean over trajectories with a 95% interval; beside them the training's paired relative differences against dense
(test WER, last-epoch training loss) from the cell's paired.csv. Then the two orders a predictive screen must get
right: the exchanges within a cell, and one exchange across cells, each by the screen and by the training loss
(the better-resolved training metric).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from sparse_asr.screening import ORACLE
from sparse_asr.screening.intervals import per_trajectory
from sparse_asr.screening.vs_training import report

REPO = Path(__file__).resolve().parent.parent  # the cells' paired tables are under docs/results/


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
    text = report(per_trajectory(steps, ORACLE), args.window, REPO)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
