"""bench/checkpoint_io.py on 2 real MPI ranks with the tiny model: both kinds of checkpoint are
written, loaded and timed, and their sizes add up (the state is the same, only its layout differs)."""
import json

import pytest

from sparse_asr.models import build_model
from tests.mpi_helpers import check_mpi, run_mpi


@pytest.mark.mpi
def test_checkpoint_io_two_ranks(tmp_path):
    report_path = tmp_path / "checkpoint_io.json"
    stdout = check_mpi(2, ["bench/checkpoint_io.py", "--model", "lstman4_tiny", "--repeats", "2",
                           "--out", str(tmp_path / "io"), "--json", str(report_path)], timeout=180)
    assert "| save, s |" in stdout and "| 32 | " in stdout, stdout
    report = json.loads(report_path.read_text())
    n = sum(p.numel() for p in build_model("lstman4_tiny").parameters())
    b = report["bytes"]
    assert report["P"] == 2 and report["parameters"] == n
    assert 4 * n < b["shard"] < 4 * n + 100_000  # the float32 residual, plus thresholds, RNG, BatchNorm
    assert 8 * n < b["shared"] < 8 * n + 200_000  # model + SGD momentum
    assert 2 * b["shard"] + b["shared"] < b["sharded_total"] < 2 * b["shard"] + b["shared"] + 10_000  # + manifest
    assert abs(b["gathered"] - b["sharded_total"]) < 0.05 * b["gathered"]
    assert all(len(v) == 2 and min(v) > 0 for v in report["seconds"].values()), report["seconds"]


@pytest.mark.mpi
def test_checkpoint_io_writes_only_where_it_was_told(tmp_path):
    """No fixed path in a shared place: by default a private temporary directory, removed
    at the end; an --out that exists, or is a planted symlink, is refused without writing through it."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    check_mpi(2, ["bench/checkpoint_io.py", "--model", "lstman4_tiny", "--repeats", "1"], timeout=180,
              env={"TMPDIR": str(scratch)})
    assert list(scratch.glob("checkpoint_io-*")) == []  # (torch may leave its own cache folder there)
    victim = tmp_path / "victim"
    victim.mkdir()
    (tmp_path / "planted").symlink_to(victim)
    proc = run_mpi(2, ["bench/checkpoint_io.py", "--model", "lstman4_tiny", "--out", str(tmp_path / "planted")],
                   timeout=180)
    assert proc.returncode != 0 and f"--out {tmp_path / 'planted'} must be a new directory" in proc.stderr, proc.stderr
    assert list(victim.iterdir()) == []
