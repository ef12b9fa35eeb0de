"""bench/oktopk_original.py at a tiny size under mpiexec -n 2: the original Ok-Topk (a checkout of
https://github.com/Shigangli/Ok-Topk named by OKTOPK_ORIGINAL, never part of this repository) and ours both run on
the same gradients, and the tables say so."""
import os
import re
from pathlib import Path

import pytest

from tests.mpi_helpers import check_mpi

pytestmark = pytest.mark.tooling  # runs the bench in a subprocess, as a user would

ORIGINAL = os.environ.get("OKTOPK_ORIGINAL", "")
PRESENT = bool(ORIGINAL) and any((Path(ORIGINAL) / sub / "allreducer.py").is_file() for sub in ("LSTM", "."))


@pytest.mark.mpi
@pytest.mark.skipif(not PRESENT,
                    reason="needs the original Ok-Topk: git clone https://github.com/Shigangli/Ok-Topk DIR and "
                           "OKTOPK_ORIGINAL=DIR")
def test_the_bench_times_both_on_the_same_gradients():
    n, steps = 20011, 4
    out = check_mpi(2, ["bench/oktopk_original.py", "--original", ORIGINAL, "--n", str(n), "--steps", str(steps),
                        "--warmup", "2"], timeout=120)
    assert "steps 2..5 timed" in out, out
    row = re.search(r"^\| 2 \| 20,011 \| (\S+) \| (\S+) \| (\S+) \| (\S+) \| (\S+)x \| (\S+)x \|$", out, re.M)
    assert row, out
    original_ms, ours_ms, ratio, floor_ms, original_floor, ours_floor = map(float, row.groups())
    assert original_ms > 0 and ours_ms > 0 and floor_ms > 0, out
    assert ratio == pytest.approx(original_ms / ours_ms, rel=0.1, abs=0.02), out
    for impl in ("original", "ours"):
        cells = re.search(rf"^\| {impl} \| ([\d,]+) \[([\d,]+)\] \| (\S+) \| (\S+) \| (\S+) \| (\w+) \|$", out, re.M)
        assert cells, out
        words, busiest = (int(c.replace(",", "")) for c in cells.groups()[:2])
        local, selected = float(cells[4]), float(cells[5])
        assert 0 < words <= busiest, out
        # both select on the order of k = density x n entries, and every rank applies the same update
        assert 0.5 < local < 4 and 0.5 < selected < 4 and cells[6] == "yes", out
