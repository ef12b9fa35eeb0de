"""bench/oktopk_vs_baseline.py under mpiexec -n 3, against this checkout's own commit: the same code on both sides
must move the same words and select the same count each step, which holds only if both get the same gradients."""
import re
import subprocess
from pathlib import Path

import pytest

from tests.mpi_helpers import check_mpi

pytestmark = pytest.mark.tooling  # runs the bench in a subprocess, as a user would

REPO = Path(__file__).resolve().parent.parent


def tree_is_head() -> bool:
    return subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "sparse_asr"], cwd=REPO).returncode == 0


@pytest.mark.mpi
@pytest.mark.skipif(not tree_is_head(), reason="sparse_asr/ differs from HEAD, the baseline this test exports")
def test_the_same_code_on_both_sides_gives_the_same_volumes():
    out = check_mpi(3, ["bench/oktopk_vs_baseline.py", "--baseline", "HEAD", "--numel", "30011", "--steps", "5",
                        "--warmup", "2"], timeout=120)
    assert "steps 2..6 timed" in out, out
    rows = re.findall(r"^\| (\w+) \| ([\d,]+) \[([\d,]+)\] \| (\S+) \| (\S+) \| (\S+) \| (\d+) \| (\d+) \| (\S+)x \|$",
                      out, re.M)
    assert [r[0] for r in rows] == [re.search(r"Ok-Topk at (\w+)", out)[1], "now"], out
    baseline, now = rows
    assert baseline[1:6] == now[1:6], out  # words [busiest], over the bound, global selected / k, messages
    assert 0.5 < float(now[4]) < 4, out  # the global selection is on the order of k
    assert all(0 < float(r[8]) < float("inf") for r in rows), out  # each step as a multiple of the floor
