"""The screen's figures of the trained cells beside their paired training verdicts (sparse_asr/screening/vs_training.py,
bench/screen_vs_training.py's table)."""
import subprocess
import sys

import pandas as pd
import pytest

from sparse_asr.screening.intervals import per_trajectory
from sparse_asr.screening.vs_training import report
from tests.mpi_helpers import REPO

pytestmark = pytest.mark.unit


def test_the_report_joins_each_cells_screen_with_its_paired_training_table(tmp_path):
    """Two trajectories at global 16: Ok-Topk's displacement cosines 0.90 and 0.92 at P = 4 (shortfall 0.09
    [-0.037, 0.217]), complete_values' 0.95 and 0.96 (paired difference -0.045), onebit's 0.88 and 0.92 (+0.01); at
    P = 2 Ok-Topk 0.97 twice. The training side is read from the cells' committed paired tables; the verdict's
    P = 4 x 4 cell shares the P = 4 screen and enters Ok-Topk's order across cells once."""
    rows = []
    for seed, (ok4, cv4, ob4) in zip((1, 2), ((0.90, 0.95, 0.88), (0.92, 0.96, 0.92))):
        for label, P, cos in (("oktopk", 4, ok4), ("complete_values", 4, cv4), ("onebit", 4, ob4),
                              ("oktopk", 2, 0.97)):
            for step in (10, 11):
                rows.append(dict(seed=seed, global_batch=16, step=step, algorithm=label, P=P, density=0.02,
                                 cos_update=0.5, cos_step=0.6, owed=1.0,
                                 cos_disp_W50=cos if step == 11 else float("nan"), norm_disp_W50=1.0))
    pd.DataFrame(rows).to_csv(tmp_path / "screen.csv", index=False)
    done = subprocess.run([sys.executable, "bench/screen_vs_training.py", "--screen", str(tmp_path / "screen.csv"),
                           "--out", str(tmp_path / "r.md")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "r.md").read_text()
    assert text == report(per_trajectory(pd.read_csv(tmp_path / "screen.csv"), "oracle"), 50, REPO) + "\n"
    assert "| 4 per rank (P = 4, global 16) | oktopk | 2 | 0.0900 [-0.0371, 0.2171] | 0.4000 [0.4000, 0.4000] |" in text
    assert "+15.4% [+0.3%, +30.6%] (worse)" in text  # docs/results/cell_p4_cpu/paired.csv's Ok-Topk test WER
    assert "| 8 per rank (P = 2, global 16) | oktopk | 2 | 0.0300 [0.0300, 0.0300] |" in text
    assert ("- 4 per rank (P = 4, global 16), complete_values: screen -0.0450 [-0.1085, 0.0185]; training loss "
            "-5.2 points, test WER -6.7 points") in text
    verdict = pd.read_csv(REPO / "docs" / "results" / "verdict_p4x4" / "paired.csv").set_index(["run", "metric"])
    gap = {run: verdict.loc[(run, "test_wer"), "mean_rel_pct"] for run in ("oktopk", "onebit")}
    assert ("| 4 per rank (P = 4, global 16), verdict | onebit | 2 | 0.1000 [-0.1541, 0.3541] "
            f"| 0.4000 [0.4000, 0.4000] | {gap['onebit']:+.1f}% [") in text
    assert ("- 4 per rank (P = 4, global 16), verdict, onebit: screen 0.0100 [-0.1171, 0.1371]; training loss "
            in text), text
    assert f"test WER {gap['onebit'] - gap['oktopk']:+.1f} points" in text
    assert "- by the screen: 4 per rank (P = 4, global 16); 8 per rank (P = 2, global 16)\n" in text
