"""scripts/run_plan.py: a plan's queue, seed by seed, each seed's arms on one CPU type, each finished run
evaluated and kept. The orchestration runs against a stand-in plan tree whose accuracy.sh, evaluate.py and
keep_runs.py only record what they were asked (their own tests are elsewhere): what runs, in which order, what is
resumed, kept, recorded as a failure, and what waits for another CPU type."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sparse_asr.training.runtime import cpu_model
from tests.conftest import REPO

pytestmark = pytest.mark.tooling

HERE = {"cpu": cpu_model(), "cpu_dispatch": torch.backends.cpu.get_cpu_capability()}
ELSEWHERE = {"cpu": "Another CPU", "cpu_dispatch": "AVX512"}

ACCURACY_SH = """#!/bin/bash
# stand-in: records its arguments; trains arm A at seed S into OUT/runs/A-sS, with a test WER unless A is 'stalls'
while (($#)); do case "$1" in --seeds) seed=$2; shift 2 ;; -a) arm=$2; shift 2 ;; -o) out=$2; shift 2 ;;
    *) shift ;; esac; done
echo "train $arm-s$seed" >> "$out/calls.txt"
echo "${MPIR_CVAR_ENABLE_HEAVY_YIELD:-spin}" > "$out/waiting.txt"
mkdir -p "$out/runs/$arm-s$seed"
echo '{"kind": "epoch", "epoch": 1}' >> "$out/runs/$arm-s$seed/metrics.jsonl"
[[ $arm == stalls ]] || echo '{"kind": "test", "test/wer": 0.5}' >> "$out/runs/$arm-s$seed/metrics.jsonl"
"""
EVALUATE_PY = """import sys
from pathlib import Path
run = Path(sys.argv[1])
with open(run.parent.parent / "calls.txt", "a") as f:
    f.write("evaluate " + run.name + " " + " ".join(sys.argv[2:]).replace(str(run) + "/", "") + "\\n")
Path(sys.argv[sys.argv.index("--emissions") + 1]).write_bytes(b"npz")
"""
KEEP_RUNS_PY = """import shutil, sys
from pathlib import Path
run, into = Path(sys.argv[1]), Path(sys.argv[sys.argv.index("--into") + 1])
with open(run.parent.parent / "calls.txt", "a") as f:
    f.write("keep " + run.name + "\\n")
shutil.copytree(run, into / run.name)
"""


@pytest.fixture
def tree(tmp_path) -> Path:
    """A stand-in plan tree: the project's package and config, its python, recording scripts."""
    tree = tmp_path / "tree"
    for folder in ("bench", "scripts", "configs", ".venv/bin"):
        (tree / folder).mkdir(parents=True)
    (tree / "sparse_asr").symlink_to(REPO / "sparse_asr")
    (tree / ".venv/bin/python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # this venv's python
    (tree / ".venv/bin/python").chmod(0o755)
    (tree / "configs/plan.yaml").write_text("name: plan\n")
    (tree / "bench/accuracy.sh").write_text(ACCURACY_SH)
    (tree / "evaluate.py").write_text(EVALUATE_PY)
    (tree / "scripts/keep_runs.py").write_text(KEEP_RUNS_PY)
    return tree


def run_plan(tree: Path, out: Path, keep: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "scripts/run_plan.py", "--tree", str(tree), "-c", "configs/plan.yaml",
                           "-n", "2", "-o", str(out), "--keep-into", str(keep), "--nice", "0", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})


def plant(run: Path, cpu: dict) -> None:
    run.mkdir(parents=True)
    (run / "provenance.jsonl").write_text(json.dumps({"time": "t", **cpu}) + "\n")


def test_the_queue_runs_what_is_left_of_each_seed_on_its_cpu_type_keeps_it_and_records_failures(tree, tmp_path):
    out, keep = tmp_path / "out", tmp_path / "keep"
    plant(keep / "dense-s1", HERE)  # kept: not run again
    plant(out / "runs" / "stalls-s2", ELSEWHERE)  # seed 2 started on another CPU type: all of it waits
    proc = run_plan(tree, out, keep, "-a", "dense stalls", "--seeds", "1-3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "seed 2 waits for Another CPU | AVX512" in proc.stdout, proc.stdout
    evaluations = ["evaluate {run} --manifest manifests/an4_dev.csv --worst 0 --emissions emissions_dev.npz",
                   "evaluate {run} --manifest manifests/an4_test.csv --worst 0 --emissions emissions_test.npz",
                   "evaluate {run} --manifest manifests/an4_test.csv --worst 0 --average 2 --average-by last "
                   "--emissions emissions_test_avg2_last.npz"]
    assert (out / "calls.txt").read_text().splitlines() == [
        "train stalls-s1", "train stalls-s1",  # no test WER: resumed once, then a failure of its arm
        "train dense-s3", *(line.format(run="dense-s3") for line in evaluations), "keep dense-s3",
        "train stalls-s3", "train stalls-s3"]
    assert sorted(p.name for p in keep.iterdir()) == ["dense-s1", "dense-s3"]
    assert {p.name for p in (keep / "dense-s3").iterdir()} == {
        "metrics.jsonl", "emissions_dev.npz", "emissions_test.npz", "emissions_test_avg2_last.npz"}
    failures = [line.split("\t") for line in (out / "failures.tsv").read_text().splitlines()]
    assert [(f[0], f[2]) for f in failures] == [("stalls-s1", "no test WER after a resume"),
                                               ("stalls-s3", "no test WER after a resume")]
    assert "stalls-s1 ended without a test WER" in proc.stdout and "; resuming it once" in proc.stdout
    # again: nothing left but the failures (not run again) and seed 2, which still waits
    (out / "calls.txt").unlink()
    proc = run_plan(tree, out, keep, "-a", "dense stalls", "--seeds", "1-3")
    assert proc.returncode == 0 and not (out / "calls.txt").exists(), proc.stdout + proc.stderr
    assert "seed 2 waits for" in proc.stdout and "queue done" in proc.stdout
    # a dry run prints the commands and runs none
    proc = run_plan(tree, out, keep, "-a", "dense other", "--seeds", "3 4", "--dry-run")
    assert proc.returncode == 0 and not (out / "calls.txt").exists(), proc.stderr
    commands = [line for line in proc.stdout.splitlines() if not line[:4].isdigit()]
    assert [c.split()[:2] + c.split()[-2:] for c in commands if c.startswith("bash")] == [
        ["bash", "bench/accuracy.sh", "-o", str(out)]] * 3
    assert [c.split("--seeds ")[1].split(" -o")[0] for c in commands if c.startswith("bash")] == [
        "3 -a other", "4 -a dense", "4 -a other"]


@pytest.mark.parametrize("ranks, waiting", [(1, "spin"), (len(os.sched_getaffinity(0)) + 1, "1")])
def test_ranks_that_outnumber_the_cores_wait_by_sleeping(tree, tmp_path, monkeypatch, ranks, waiting):
    """A plan tree older than sparse_asr/comm/mpi.py gets MPICH's yield setting from the queue's environment."""
    monkeypatch.delenv("MPIR_CVAR_ENABLE_HEAVY_YIELD", raising=False)
    proc = run_plan(tree, tmp_path / "out", tmp_path / "keep", "-a", "dense", "--seeds", "1", "-n", str(ranks))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "out" / "waiting.txt").read_text().strip() == waiting


@pytest.mark.parametrize("args, message", [
    (["--seeds", "1 1"], "give each seed once"),
    (["--seeds", "1-x"], "'1-x' is not a seed or a range"),
    (["--seeds", "1", "-c", "configs/nope.yaml"], "--config configs/nope.yaml: no such file"),
])
def test_bad_arguments_are_refused_in_one_line(tree, tmp_path, args, message):
    proc = run_plan(tree, tmp_path / "out", tmp_path / "keep", "-a", "dense", *args)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_a_provenance_that_is_not_a_record_is_named(tree, tmp_path):
    (tmp_path / "keep" / "dense-s1").mkdir(parents=True)
    (tmp_path / "keep" / "dense-s1" / "provenance.jsonl").write_text("not json\n")
    proc = run_plan(tree, tmp_path / "out", tmp_path / "keep", "-a", "dense oktopk", "--seeds", "1")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{tmp_path / 'keep' / 'dense-s1' / 'provenance.jsonl'}: not a provenance record" in proc.stderr
