"""Checkpoints: atomic writes, clear errors, and exact resume (single process; the 2-rank sparse
case is in test_distributed_train.py)."""
import pytest
import torch

from sparse_asr.comm import Communicator
from tests.mpi.train_common import run_training, step_losses, tiny_overrides
from sparse_asr.training.checkpoint import (FORMAT_VERSION, atomic_save, load_checkpoint, load_training_state, rng_state,
                                            set_rng_state)
from sparse_asr.training.trainer import Trainer


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_atomic_save_keeps_the_old_file_when_writing_fails(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    atomic_save({"format_version": 1, "x": torch.arange(3)}, path)

    def broken_save(obj, f):
        f.write(b"half a checkpoint")
        raise OSError(28, "disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        atomic_save({"format_version": 1, "x": torch.arange(5)}, path)
    monkeypatch.undo()
    assert torch.equal(torch.load(path)["x"], torch.arange(3))
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]  # no temporary file left behind


def test_load_errors_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.pt does not exist"):
        load_checkpoint(tmp_path / "missing.pt")
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="garbage.pt cannot be read"):
        load_checkpoint(tmp_path / "garbage.pt")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "foreign.pt")
    with pytest.raises(ValueError, match="not a checkpoint of this project"):
        load_checkpoint(tmp_path / "foreign.pt")
    atomic_save({"format_version": FORMAT_VERSION, "world_size": 2, "ranks": [{}, {}]}, tmp_path / "two.pt")
    with pytest.raises(ValueError, match="written by 2 ranks but this job has 1"):
        load_training_state(Communicator(), tmp_path / "two.pt")


def test_rng_state_round_trip():
    import random

    import numpy as np

    state = rng_state()
    first = (random.random(), np.random.rand(), torch.rand(1).item())
    set_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == first


def assert_same_parameters(a_path, b_path):
    a, b = load_checkpoint(a_path), load_checkpoint(b_path)
    assert a["progress"]["step"] == b["progress"]["step"] and a["progress"]["epoch"] == b["progress"]["epoch"]
    assert a["model"].keys() == b["model"].keys()
    for key in a["model"]:
        torch.testing.assert_close(a["model"][key], b["model"][key], rtol=1e-6, atol=1e-7, msg=key)
    for sa, sb in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        torch.testing.assert_close(sa["momentum_buffer"], sb["momentum_buffer"], rtol=1e-6, atol=1e-7)


def assert_same_losses(a_dir, b_dir, steps):
    a, b = step_losses(a_dir), step_losses(b_dir)
    assert sorted(a) == sorted(b) == list(range(1, steps + 1)), (sorted(a), sorted(b))
    for step in a:
        assert a[step] == pytest.approx(b[step], rel=1e-6), (step, a[step], b[step])


# Feature masking (off by default) must not break exact resume: its masks depend on (seed, epoch, item).
AUGMENTATION = {"off": {}, "on": dict(data__freq_masks=2, data__time_masks=2)}


@pytest.mark.parametrize("augmentation", AUGMENTATION)
def test_two_epochs_equal_one_epoch_resume_one_epoch(an4_manifests, tmp_path, augmentation):
    # 16 utterances, batch 4: 4 steps per epoch. lr_anneal makes epoch 2 use another learning rate.
    settings = dict(train__epochs=2, optim__lr=1e-3, optim__lr_warmup_steps=3, train__eval_every_epochs=1,
                    **AUGMENTATION[augmentation])
    full = run_training(tiny_overrides(an4_manifests, tmp_path, "full", **settings))
    run_training(tiny_overrides(an4_manifests, tmp_path, "parts", **{**settings, "train__epochs": 1}))
    resumed = run_training(tiny_overrides(an4_manifests, tmp_path, "parts", **settings),
                           resume=str(tmp_path / "parts" / "checkpoints" / "last.pt"))
    assert_same_losses(tmp_path / "full", tmp_path / "parts", steps=8)
    assert_same_parameters(tmp_path / "full" / "checkpoints" / "last.pt", tmp_path / "parts" / "checkpoints" / "last.pt")
    assert resumed["dev"] == pytest.approx(full["dev"]) and resumed["test"] == pytest.approx(full["test"])


@pytest.mark.parametrize("augmentation", AUGMENTATION)
def test_resume_mid_epoch_after_a_crash(an4_manifests, tmp_path, monkeypatch, augmentation):
    """A checkpoint every 3 steps; the run dies at step 7 (epoch 2, third batch). Resuming from
    last.pt (written at step 6, mid-epoch: sampler position 2 of 4) continues the same curve."""
    settings = dict(train__epochs=2, optim__lr=1e-3, train__checkpoint_every_steps=3, **AUGMENTATION[augmentation])
    run_training(tiny_overrides(an4_manifests, tmp_path, "full", **settings))

    original = Trainer.train_step

    def dies_at_step_6(self, batch):
        if self.progress.step == 6:
            raise RuntimeError("simulated crash")
        return original(self, batch)

    monkeypatch.setattr(Trainer, "train_step", dies_at_step_6)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_training(tiny_overrides(an4_manifests, tmp_path, "crashed", **settings))
    monkeypatch.undo()
    last = tmp_path / "crashed" / "checkpoints" / "last.pt"
    assert load_checkpoint(last)["progress"] | {"best_wer": None} == {
        "step": 6, "epoch": 1, "batch_in_epoch": 2, "skipped_steps": 0, "nonfinite_in_row": 0, "best_wer": None}
    run_training(tiny_overrides(an4_manifests, tmp_path, "crashed", **settings), resume=str(last))
    assert_same_losses(tmp_path / "full", tmp_path / "crashed", steps=8)
    assert_same_parameters(tmp_path / "full" / "checkpoints" / "last.pt", last)
