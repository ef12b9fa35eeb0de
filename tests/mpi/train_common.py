"""Helpers shared by the trainer tests (pytest files and the scripts run under mpiexec): tiny, fast
training runs of lstman4_tiny on a few real AN4 utterances, driven through the package's run_job (what
train.py runs)."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from sparse_asr.training.runlog import read_metrics  # noqa: F401 -- the trainer tests read runs through it

REPO = Path(__file__).resolve().parents[2]
SMOKE_CONFIG = REPO / "configs" / "smoke.yaml"


def tiny_overrides(manifests: Path, out_dir: Path, name: str, **settings) -> list[str]:
    """Overrides of configs/smoke.yaml for a test run; `settings` use '__' for '.' (train__epochs=3)."""
    manifests = Path(manifests)
    values = {
        "out_dir": out_dir, "name": name, "model.name": "lstman4_tiny",
        "data.train_manifest": manifests / "an4_train.csv", "data.dev_manifest": manifests / "an4_dev.csv",
        "data.test_manifest": manifests / "an4_test.csv",
        "data.max_train_utterances": 16, "data.max_eval_utterances": 8,
        "train.epochs": 2, "train.global_batch_size": 4, "train.eval_batch_size": 8,
        "train.log_every_steps": 1, "train.checksum_every": 1,
        "optim.lr_warmup_steps": 0, "compression.warmup_steps": 0,
    }
    values.update({k.replace("__", "."): v for k, v in settings.items()})
    return [f"{k}={v}" for k, v in values.items()]


def run_training(overrides: list[str], comm=None, resume: str = "", config: Path | None = SMOKE_CONFIG,
                 overwrite: bool = False) -> dict:
    """A whole training job in this process, as train.py runs it (no abort on error: the exception
    propagates); config=None with `resume`: the run's own config."""
    from sparse_asr.comm import Communicator
    from sparse_asr.training.launch import run_job
    from sparse_asr.training.plan import read_request

    return run_job(comm or Communicator(), read_request(config, overrides, resume, overwrite))


def train_and_keep(overrides: list[str], comm):
    """Like run_training, but returns the Trainer after fit() (to inspect its replicas)."""
    from sparse_asr.training.config import load_config
    from sparse_asr.training.launch import prepare_run, resolve_for_run, start_run

    trainer = start_run(prepare_run(resolve_for_run(load_config(SMOKE_CONFIG, overrides), comm), comm), comm)
    try:
        trainer.fit()
    finally:
        trainer.log.close()
    return trainer


def run_job_or_abort(overrides: list[str]) -> None:
    """Under mpiexec: the job as train.py's main runs it (any rank's exception aborts them all)."""
    from sparse_asr.comm import Communicator
    from sparse_asr.training.launch import run_job
    from sparse_asr.training.plan import read_request
    from sparse_asr.training.runtime import run_or_abort

    comm = Communicator()
    run_or_abort(comm, lambda: run_job(comm, read_request(SMOKE_CONFIG, overrides)))


def step_losses(run_dir: Path) -> dict[int, float]:
    """train/loss per optimizer step (with log_every_steps=1); a step logged twice keeps the later value."""
    return {m["step"]: m["train/loss"] for m in read_metrics(run_dir) if "train/loss" in m}


def epoch_losses(run_dir: Path) -> list[float]:
    return [m["epoch/loss"] for m in read_metrics(run_dir) if m["kind"] == "epoch"]


def assert_one_row_per_kind_and_step(run_dir: Path) -> None:
    rows = [(m["kind"], m["step"]) for m in read_metrics(run_dir)]
    assert len(rows) == len(set(rows)), f"rows logged twice: {sorted(r for r in rows if rows.count(r) > 1)}"


def tree_digest(root: Path) -> dict[str, str]:
    """Every file (SHA-256) and link (its target) under root: a byte-exact picture of a run directory."""
    out = {}
    for path in sorted(Path(root).rglob("*")):
        key = str(path.relative_to(root))
        if path.is_symlink():
            out[key] = "-> " + os.readlink(path)
        elif path.is_file():
            out[key] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            out[key] = "dir"
    return out


def flip_byte(path: Path) -> None:
    """Flip one bit in the middle of a file (silent corruption)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
