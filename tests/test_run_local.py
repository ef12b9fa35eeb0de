"""scripts/run_local.sh: the training command it runs (--dry-run), resuming included, and its argument errors."""
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.tooling

REPO = Path(__file__).resolve().parent.parent


def run_local(*args):
    return subprocess.run(["bash", str(REPO / "scripts" / "run_local.sh"), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("args, expected", [
    ([], "--config configs/an4_cpu.yaml"),
    (["-n", "2", "-c", "configs/smoke.yaml", "compression.algorithm=oktopk"],
     "-n 2 .venv/bin/python train.py --config configs/smoke.yaml compression.algorithm=oktopk"),
    # A run directory: the run's own config, only the overrides given; -c adds a config to check against.
    (["-n", "2", "--resume", "RUN", "train.epochs=40"], "-n 2 .venv/bin/python train.py --resume RUN train.epochs=40"),
    (["--resume=RUN", "-c", "configs/smoke.yaml"], "train.py --config configs/smoke.yaml --resume RUN"),
    (["--resume", "auto", "name=exp"], "train.py --config configs/an4_cpu.yaml --resume auto name=exp"),
])
def test_dry_run_prints_the_training_command(tmp_path, args, expected):
    run_dir = tmp_path / "runs" / "exp"
    run_dir.mkdir(parents=True)
    proc = run_local("--dry-run", *[str(run_dir) if a == "RUN" else a.replace("=RUN", f"={run_dir}") for a in args])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(".venv/bin/mpiexec -n ")
    assert expected.replace("RUN", str(run_dir)) in proc.stdout, proc.stdout


@pytest.mark.parametrize("args, message", [
    (["--resume"], "--resume needs a run directory, a checkpoint directory or 'auto'"),
    (["--resume", "runs/no-such-run"], "--resume: 'runs/no-such-run' does not exist"),
    (["-n", "0"], "-n must be a positive integer"),
    (["-c", "nope.yaml"], "config file 'nope.yaml' does not exist"),
    (["bad-override"], "'bad-override' is not a key.sub=value override"),
])
def test_bad_arguments_are_refused(args, message):
    proc = run_local("--dry-run", *args)
    assert proc.returncode == 2 and message in proc.stderr, (proc.returncode, proc.stderr)
