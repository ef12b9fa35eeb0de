"""bench/trajectory_parting.py: the first step past each relative loss difference, against a hand-made case."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.trajectory_parting import THRESHOLDS, parting

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parent.parent


def rows(losses, grad_norm=100.0):
    return {step: {"kind": "train", "step": step, "train/loss": loss, "train/grad_norm": grad_norm}
            for step, loss in enumerate(losses, start=1)}


def test_first_step_past_each_threshold():
    reference = rows([100.0, 100.0, 100.0, 100.0, 100.0])
    # relative differences 0, 5e-5, 5e-3, 0.5 (back to 0 at step 5: the first crossing counts)
    other = rows([100.0, 100.005, 100.5, 150.0, 100.0], grad_norm=100.01)
    grad, parted = parting(reference, other)
    assert grad == pytest.approx(1e-4)
    assert dict(zip(THRESHOLDS, parted)) == {1e-5: 2, 1e-4: 3, 1e-3: 3, 1e-2: 4, 1e-1: 4}


def test_a_rerun_never_parts_and_only_common_steps_count():
    reference = rows([120.0, 90.0, 80.0])
    other = rows([120.0, 90.0, 80.0, 999.0])  # step 4: the reference has none
    assert parting(reference, other) == (0.0, [None] * len(THRESHOLDS))
    with pytest.raises(ValueError, match="no common step"):
        parting(reference, {9: rows([1.0])[1] | {"step": 9}})


def test_command_line_table(tmp_path):
    for name, losses in (("a", [100.0, 100.0]), ("b", [100.0, 101.0])):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text(
            "".join(json.dumps(row) + "\n" for row in rows(losses).values()))
    proc = subprocess.run([sys.executable, "bench/trajectory_parting.py", str(tmp_path / "a"), str(tmp_path / "b")],
                          cwd=REPO, capture_output=True, text=True, check=True)
    assert "| b | 0.0e+00 | 2 | 2 | 2 | - | - |" in proc.stdout
    missing = subprocess.run([sys.executable, "bench/trajectory_parting.py", str(tmp_path / "a"), str(tmp_path)],
                             cwd=REPO, capture_output=True, text=True)
    assert missing.returncode != 0 and "holds no metrics.jsonl" in missing.stderr
