"""bench/train_profile.py on real AN4 utterances, as a user runs it: a row per variant, each step the sum of its
phases, the cache filled only where asked, and the run estimate the formula its docstring gives."""
import json
import subprocess
import sys

import pytest

from tests.mpi_helpers import REPO


def test_the_profile_times_each_phase_and_estimates_the_run(an4_manifests, tmp_path):
    m = an4_manifests
    small = [f"data.train_manifest={m / 'an4_train.csv'}", f"data.dev_manifest={m / 'an4_dev.csv'}",
             f"data.test_manifest={m / 'an4_test.csv'}", "model.name=lstman4_tiny", "data.max_train_utterances=64",
             "data.max_eval_utterances=8", "train.global_batch_size=8", "train.epochs=3", "train.threads=1"]
    out = tmp_path / "profile.json"
    proc = subprocess.run([sys.executable, "bench/train_profile.py", "--steps", "2", "--json", str(out),
                           "--variant", "plain", *small, "--variant", "cached", *small, "data.cache_features=true"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    printed = [line.split(" | ")[0] for line in proc.stdout.splitlines() if line.startswith(("| plain", "| cached"))]
    assert printed == ["| plain", "| cached"], proc.stdout
    rows = {row["variant"]: row for row in json.loads(out.read_text())["rows"]}
    for name, r in rows.items():
        assert r["data"] > 0 and r["compute"] > 0 and r["rest"] >= 0 and r["dev_eval"] > 0, r
        assert r["step"] == pytest.approx(r["data"] + r["compute"] + r["rest"], rel=1e-12), name
        assert (r["fill"] > 0) == (name == "cached"), name
        # 3 epochs of 64 // 8 = 8 steps, a dev evaluation each, the test set once (8 utterances, as the dev set's)
        assert (r["epochs"], r["steps_per_epoch"], r["dev_utterances"], r["test_utterances"]) == (3, 8, 8, 8), r
        estimate = (3 * 8 * r["step"] + 3 * r["dev_eval"] + r["dev_eval"] + r["fill"]) / 60
        assert r["run_min"] == pytest.approx(estimate, rel=1e-9), (name, r["run_min"], estimate)
