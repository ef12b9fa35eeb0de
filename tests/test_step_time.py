"""bench/step_time.py on 2 real MPI ranks: the table has its rows, the times add up, and dense
allreduce receives exactly the ring volume."""
import json

import pytest

from sparse_asr.models import build_model
from tests.mpi_helpers import check_mpi


@pytest.mark.mpi
def test_step_time_two_ranks(an4_manifests, tmp_path):
    out = tmp_path / "step_time.json"
    stdout = check_mpi(2, ["bench/step_time.py", "--model", "lstman4_tiny", "--algorithms", "dense", "oktopk",
                           "--density", "0.02", "--global-batch", "4", "--steps", "2", "--warmup", "1",
                           "--manifest", str(an4_manifests / "an4_train.csv"), "--json", str(out)], timeout=120)
    for algorithm in ("dense", "oktopk"):
        assert f"| {algorithm} | 2 | lstman4_tiny | " in stdout, stdout
    assert "oktopk: of 2 measured steps" in stdout, stdout

    report = json.loads(out.read_text())
    rows = {r["algorithm"]: r for r in report["rows"]}
    assert list(rows) == ["dense", "oktopk"]
    n = sum(p.numel() for p in build_model("lstman4_tiny").parameters())
    P = 2
    assert report["batch"]["global_batch"] == 4 and len(report["batch"]["utterances"]) == 4
    assert report["batch"]["mean_seconds"] > 0
    for name, r in rows.items():
        assert r["P"] == P and r["parameters"] == n and r["steps"] == 2 and r["threads_per_rank"] == 1
        for key in ("t_compute", "t_comm", "t_step", "bytes_recv", "bytes_sent"):
            assert r[f"{key}_mean"] > 0 and r[f"{key}_max"] >= r[f"{key}_mean"], (name, key, r)
        # total is the whole train_step, timed outside it: its parts cannot exceed it (on every rank,
        # hence also for the means over ranks).
        parts = r["t_compute_mean"] + r["t_select_mean"] + r["t_comm_mean"]
        assert parts <= r["t_step_mean"], (name, parts, r["t_step_mean"])
        assert r["t_other_mean"] >= 0
        assert abs(r["comm_select_pct_of_compute"]
                   - 100 * (r["t_comm_mean"] + r["t_select_mean"]) / r["t_compute_mean"]) < 1e-9

    dense = rows["dense"]
    ring = 2 * n * (P - 1) // P * 4  # ring allreduce: 2n(P-1)/P float32 words per rank
    assert dense["bytes_recv_mean"] == dense["bytes_recv_max"] == ring
    assert dense["t_select_mean"] == 0.0
    oktopk = rows["oktopk"]
    assert oktopk["t_select_mean"] > 0
    assert 0 < oktopk["bytes_recv_max"] < ring
    # steps 1 and 2 after the discarded first one: both repartition (1, 2, 4, ... after a cold start)
    assert oktopk["recomputed"] == {"repartition": 2, "exact_local_threshold": 0, "exact_global_threshold": 0}
