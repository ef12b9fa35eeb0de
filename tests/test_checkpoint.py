"""Checkpoints (single process): the sharded directory format and its verification, a full disk, pruning
and the best link, which config a resume continues with, refused resumes that leave the run directory
untouched, and exact resume after a crash. The multi-rank cases are in test_distributed_train.py."""
import errno
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from sparse_asr.analysis.runs import load_run
from sparse_asr.comm import Communicator
from sparse_asr.compression import build_compressor
from sparse_asr.training.checkpoint import (INDEX, CheckpointError, Progress, RankState, TrainingState, index_digest,
                                            check_state_fits, find_checkpoint, load_shared, load_training_state,
                                            rng_state, save_training_state, set_rng_state)
from sparse_asr.training.config import ConfigError, load_config, to_dict
from sparse_asr.training.launch import check_fits, prepare_run, resolve_for_run, start_run
from sparse_asr.training.plan import read_request
from sparse_asr.training.resume import SAFE_TO_CHANGE, run_config
from sparse_asr.training.trainer import Trainer
from tests.mpi.train_common import (SMOKE_CONFIG, assert_one_row_per_kind_and_step, flip_byte, read_metrics,
                                   run_training, step_losses, tiny_overrides, tree_digest)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def make_state(step: int, config: dict | None = None, seed: int = 0) -> TrainingState:
    g = torch.Generator().manual_seed(seed + step)
    return TrainingState(
        config=config or to_dict(load_config(SMOKE_CONFIG)),
        model={"w": torch.randn(50, 20, generator=g), "bn.running_mean": torch.randn(20, generator=g)},
        optimizer={"state": {0: {"momentum_buffer": torch.randn(50, 20, generator=g)}}, "param_groups": []},
        progress=Progress(step=step, epoch=step // 4, batch_in_epoch=step % 4),
        mine=RankState(compressor={"memory": {"residual": torch.randn(1000, generator=g)}, "boundaries": [0, 1000]},
                       rng=rng_state(), buffers={"bn.running_mean": torch.randn(20, generator=g)},
                       meter={"cum_bytes_recv": 123.0 * step,
                              "epoch_window": {"sums": {"loss": 1.5}, "counts": {"loss": 1}, "steps": 1}}),
        extra={"warmup_steps": 2, "metrics_rows": 3 * step})


def assert_same(a, b, where="state"):
    if torch.is_tensor(a):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    else:
        assert a == b, where


# ------------------------------------------------------------------------------------------- the format
@pytest.mark.unit
def test_round_trip_and_manifest(tmp_path):
    comm = Communicator()
    state = make_state(6)
    directory = save_training_state(comm, tmp_path / "checkpoints", state)
    assert directory == tmp_path / "checkpoints" / "step-00000006"
    assert sorted(p.name for p in directory.iterdir()) == [INDEX, "rank0.pt", "shared.pt"]
    index = json.loads((directory / INDEX).read_text())
    assert (index["world_size"], index["step"], index["epoch"]) == (1, 6, 1)
    assert index["config"] == state.config
    for name, entry in index["files"].items():  # the hash computed while writing is the file's
        data = (directory / name).read_bytes()
        assert entry == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}, name
    assert os.readlink(tmp_path / "checkpoints" / "last") == "step-00000006"  # relative: the run can move

    loaded = load_training_state(comm, tmp_path)  # a run directory means its checkpoints/last
    assert_same(loaded.model, state.model)
    assert_same(loaded.optimizer, state.optimizer)
    assert loaded.progress == state.progress and loaded.extra == state.extra and loaded.config == state.config
    assert_same(loaded.mine.compressor, state.mine.compressor)
    assert_same(loaded.mine.buffers, state.mine.buffers)
    assert loaded.mine.meter == state.mine.meter and loaded.mine.meter["cum_bytes_recv"] == 738.0
    index2, shared = load_shared(directory)  # what evaluate.py reads: the shared file only
    assert index2 == index and torch.equal(shared["model"]["w"], state.model["w"])


@pytest.mark.unit
def test_rng_state_round_trip():
    import random

    import numpy as np

    state = rng_state()
    first = (random.random(), np.random.rand(), torch.rand(1).item())
    set_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == first


class RunsCode:
    """What a malicious checkpoint holds: unpickling it runs a shell command."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch '{self.marker}'",)


def rewrite_with_index(directory: Path, name: str, obj) -> None:
    """Replace one file of a checkpoint and re-sign the index, as whoever writes a shared file can."""
    torch.save(obj, directory / name)
    index = json.loads((directory / INDEX).read_text())
    data = (directory / name).read_bytes()
    index["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    index["index_sha256"] = index_digest(index)
    (directory / INDEX).write_text(json.dumps(index))


@pytest.mark.parametrize("name", ["shared.pt", "rank0.pt"])
@pytest.mark.unit
def test_a_checkpoint_that_would_run_code_is_refused_unopened(tmp_path, name):
    comm = Communicator()
    directory = save_training_state(comm, tmp_path / "checkpoints", make_state(2))
    for path in directory.glob("*.pt"):  # everything this code writes loads with weights_only=True
        torch.load(path, weights_only=True)
    marker = tmp_path / "ran"
    payload = torch.load(directory / name, weights_only=True)
    payload["extra" if name == "shared.pt" else "state"] = RunsCode(marker)
    rewrite_with_index(directory, name, payload)
    with pytest.raises(CheckpointError, match=f"checkpoint file {directory / name} holds something other than "
                                              f"tensors and plain values .refused, not loaded"):
        load_training_state(comm, directory)
    if name == "shared.pt":
        with pytest.raises(CheckpointError, match="holds something other than tensors"):
            load_shared(directory)  # evaluate.py's reader
    assert not marker.exists(), "the checkpoint's code ran"


@pytest.mark.unit
def test_an_older_format_is_refused_with_its_version(tmp_path):
    directory = save_training_state(Communicator(), tmp_path / "checkpoints", make_state(1))
    for version, why in ((3, "holds pickled"), (4, "keeps the ranks' states in another layout")):
        index = {**json.loads((directory / INDEX).read_text()), "format_version": version}
        index["index_sha256"] = index_digest(index)
        (directory / INDEX).write_text(json.dumps(index))
        with pytest.raises(CheckpointError, match=f"checkpoint format {version} is older than this code's 5 and {why}"):
            load_shared(directory)
    (directory / INDEX).rename(directory / "manifest.json")  # formats 1-4 named their index so
    with pytest.raises(CheckpointError, match="a checkpoint of format 4 or older .its index is manifest.json."):
        load_shared(directory)


@pytest.mark.parametrize("name", ["shared.pt", "rank0.pt"])
@pytest.mark.unit
def test_a_damaged_file_is_refused_naming_it(tmp_path, name):
    comm = Communicator()
    directory = save_training_state(comm, tmp_path / "checkpoints", make_state(3))
    path = directory / name
    original = path.read_bytes()
    flip_byte(path)  # one bit of one byte
    with pytest.raises(CheckpointError, match=f"checkpoint file {path} is corrupted"):
        load_training_state(comm, directory)
    path.write_bytes(original[:-10])
    with pytest.raises(CheckpointError, match=f"{path} has {len(original) - 10} bytes, the index says {len(original)}"):
        load_training_state(comm, directory)
    path.unlink()
    with pytest.raises(CheckpointError, match=f"checkpoint file {path} is missing"):
        load_training_state(comm, directory)
    if name == "shared.pt":  # evaluate.py's reader checks too
        with pytest.raises(CheckpointError, match=f"checkpoint file {path} is missing"):
            load_shared(directory)


@pytest.mark.unit
def test_load_errors_are_clear(tmp_path):
    comm = Communicator()
    with pytest.raises(FileNotFoundError, match="missing does not exist"):
        load_training_state(comm, tmp_path / "missing")
    (tmp_path / "last.pt").write_bytes(b"an old single-file checkpoint")
    with pytest.raises(CheckpointError, match="last.pt is a file; checkpoints are directories"):
        find_checkpoint(tmp_path / "last.pt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="empty is neither a checkpoint .index.json missing"):
        find_checkpoint(tmp_path / "empty")
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    with pytest.raises(CheckpointError, match="run directory .*run has no finished checkpoint"):
        find_checkpoint(tmp_path / "run")
    directory = save_training_state(comm, tmp_path / "two", make_state(1))
    index = {**json.loads((directory / INDEX).read_text()), "world_size": 2}
    index["index_sha256"] = index_digest(index)  # as 2 ranks would have written it
    (directory / INDEX).write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="written by 2 ranks but this job has 1"):
        load_training_state(comm, directory)
    (directory / INDEX).write_text("{ half an index")
    with pytest.raises(CheckpointError, match="index.json cannot be read"):
        load_training_state(comm, directory)
    (directory / INDEX).unlink()  # a save that died before its index
    with pytest.raises(CheckpointError, match="index.json missing: an unfinished save"):
        load_training_state(comm, directory)


@pytest.mark.unit
def test_a_full_disk_names_the_file_and_leaves_no_temporary_files(tmp_path, monkeypatch):
    comm = Communicator()
    checkpoints = tmp_path / "checkpoints"
    save_training_state(comm, checkpoints, make_state(4))
    before = tree_digest(checkpoints)
    real_save = torch.save

    def disk_full_midway(obj, f):
        if "state" in obj:  # the rank shard: half of it reaches the disk, then the disk is full
            f.write(b"x" * 1000)
            raise OSError(errno.ENOSPC, "No space left on device")
        real_save(obj, f)

    monkeypatch.setattr(torch, "save", disk_full_midway)
    with pytest.raises(OSError, match=r"could not write .*step-00000008/rank0.pt: No space left on device") as info:
        save_training_state(comm, checkpoints, make_state(8))
    assert info.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert tree_digest(checkpoints) == before  # no step-8 directory, no temporary file, last unchanged
    assert load_training_state(comm, tmp_path).progress.step == 4


@pytest.mark.unit
def test_pruning_keeps_the_newest_and_what_best_points_at(tmp_path):
    comm = Communicator()
    checkpoints = tmp_path / "checkpoints"
    for step in range(1, 6):
        save_training_state(comm, checkpoints, make_state(step), keep=2, best=step == 2)
    assert sorted(p.name for p in checkpoints.iterdir()) == ["best", "last", "step-00000002", "step-00000004",
                                                             "step-00000005"]
    assert os.readlink(checkpoints / "best") == "step-00000002" and os.readlink(checkpoints / "last") == "step-00000005"
    assert (checkpoints / "best").is_symlink()  # marking best copies nothing
    assert load_training_state(comm, checkpoints / "best").progress.step == 2
    (checkpoints / "step-00000007").mkdir()  # a save that died before its index
    (checkpoints / "step-00000007" / "rank0.pt").write_bytes(b"partial")
    save_training_state(comm, checkpoints, make_state(6), keep=2, best=True)
    assert sorted(p.name for p in checkpoints.iterdir()) == ["best", "last", "step-00000005", "step-00000006"]


@pytest.mark.unit
def test_a_compressor_state_that_does_not_fit_is_named():
    comm = Communicator()
    oktopk = build_compressor("oktopk", comm, 1000, 0.01, warmup=2).state_dict()
    topka = build_compressor("topka", comm, 1000, 0.01).state_dict()
    dense = build_compressor("dense", comm, 1000).state_dict()
    with pytest.raises(CheckpointError, match="compressor state does not fit this run: missing inner, warmup_taken"):
        check_state_fits("compressor", oktopk, dense)
    with pytest.raises(CheckpointError, match=r"missing inner\.boundaries, inner\.global_drift, .*inner\.sparse_steps"):
        check_state_fits("compressor", oktopk, {"warmup_taken": 2, "inner": topka})
    with pytest.raises(CheckpointError, match=r"memory\.residual has shape \(999,\), this run's has \(1000,\)"):
        check_state_fits("compressor", topka, {"memory": {"residual": torch.zeros(999)}})
    check_state_fits("compressor", oktopk, build_compressor("oktopk", comm, 1000, 0.01, warmup=2).state_dict())


# ------------------------------------------------------------------------------------------- which config
def config_for_run(config, overrides, resume, world_size):
    """What a start decides under its lock: the request read, then the config and checkpoint it continues."""
    return run_config(read_request(config, overrides, resume), world_size)


@pytest.fixture
def saved_run(tmp_path):
    """runs/exp with one checkpoint of configs/smoke.yaml (+ train.epochs=3), as a real run leaves it."""
    cfg = resolve_for_run(load_config(SMOKE_CONFIG, [f"out_dir={tmp_path / 'runs'}", "name=exp", "train.epochs=3"]),
                          Communicator())
    save_training_state(Communicator(), cfg.run_dir / "checkpoints", make_state(4, to_dict(cfg)))
    return cfg.run_dir


@pytest.mark.unit
def test_resume_by_run_directory_uses_the_saved_config_where_the_run_now_lives(saved_run):
    moved = saved_run.parent / "exp-copy"
    shutil.copytree(saved_run, moved, symlinks=True)
    cfg, checkpoint, _ = config_for_run(None, ["train.epochs=5", "train.log_every_steps=7"], str(moved), 1)
    assert str(checkpoint) == str((moved / "checkpoints" / "step-00000004").resolve())
    assert checkpoint.index["step"] == 4  # the index read once, for loading to verify the files against
    assert cfg.run_dir.resolve() == moved.resolve()  # where the checkpoint is, not the name stored in it
    assert (cfg.train.epochs, cfg.train.log_every_steps, cfg.train.resume) == (5, 7, str(moved))
    saved = json.loads((moved / "checkpoints" / "last" / INDEX).read_text())["config"]
    assert cfg.model.name == saved["model"]["name"] and cfg.seed == saved["seed"]
    assert config_for_run(None, [f"train.resume={moved}"], "", 1)[1] == checkpoint  # as a config key too
    # The same through a --config file: keys that differ from the saved config must be safe ones.
    cfg2, _, _ = config_for_run(str(SMOKE_CONFIG), ["train.epochs=5"], str(moved / "checkpoints" / "last"), 1)
    assert cfg2.train.epochs == 5 and cfg2.run_dir.resolve() == moved.resolve()


@pytest.mark.unit
def test_resume_a_checkpoint_written_before_a_key_existed(saved_run):
    """A key added to the code later (here compression.dense_1d, removed from the saved config as an older
    version would have written it) counts as its default: same run, resumable; set to another value, refused."""
    index_path = saved_run / "checkpoints" / "last" / INDEX
    index = json.loads(index_path.read_text())
    del index["config"]["compression"]["dense_1d"]
    index["config"]["compression"].update(algorithm="oktopk", options={"local_threshold_interval": 16})
    index["index_sha256"] = index_digest(index)  # as that version would have signed it
    index_path.write_text(json.dumps(index))
    for config in (None, str(SMOKE_CONFIG)):
        overrides = ["train.epochs=5"] + (["compression.algorithm=oktopk",  # as saved, with nested options
                                           "compression.options.local_threshold_interval=16"] if config else [])
        cfg, checkpoint, _ = config_for_run(config, overrides, str(saved_run), 1)
        assert checkpoint and cfg.compression.dense_1d is False and cfg.train.epochs == 5
        assert cfg.compression.options == {"local_threshold_interval": 16}
    with pytest.raises(ConfigError, match="compression.dense_1d False -> True"):
        config_for_run(None, ["compression.dense_1d=true"], str(saved_run), 1)


@pytest.mark.parametrize("overrides, message", [
    (["model.name=lstman4_small"], "model.name 'lstman4_tiny' -> 'lstman4_small'"),
    (["compression.algorithm=oktopk"], "compression.algorithm 'dense' -> 'oktopk'"),
    (["optim.lr=0.5", "train.epochs=9"], "optim.lr 0.0003 -> 0.5"),
    (["name=other"], "continues where its checkpoint lives"),
])
@pytest.mark.unit
def test_resume_refuses_unsafe_changes(saved_run, overrides, message):
    with pytest.raises(ConfigError, match=message) as info:
        config_for_run(None, overrides, str(saved_run), 1)
    if "->" in message:
        assert "train.epochs" not in str(info.value).split(". Only")[0]  # safe changes are not listed as refused
        assert "Only these keys may change when resuming: " + ", ".join(SAFE_TO_CHANGE) in str(info.value)


@pytest.mark.unit
def test_resume_auto_and_other_refusals(saved_run, tmp_path):
    out = f"out_dir={saved_run.parent}"
    cfg, checkpoint, _ = config_for_run(str(SMOKE_CONFIG), [out, "name=exp", "train.epochs=3"], "auto", 1)
    assert checkpoint and cfg.train.epochs == 3  # exp has a checkpoint: continue it
    cfg, checkpoint, _ = config_for_run(str(SMOKE_CONFIG), [out, "name=fresh", "train.resume=auto"], "", 1)
    assert checkpoint is None and cfg.name == "fresh"  # nothing to continue: start it
    with pytest.raises(ConfigError, match="needs --config and an explicit run name"):
        config_for_run(str(SMOKE_CONFIG), [out], "auto", 1)
    with pytest.raises(ConfigError, match="--config is required to start a run"):
        config_for_run(None, [], "", 1)
    with pytest.raises(CheckpointError, match="written by 1 ranks but this job has 2.*mpiexec -n 1"):
        config_for_run(None, [], str(saved_run), 2)
    save_training_state(Communicator(), saved_run / "checkpoints", make_state(8, to_dict(load_config(SMOKE_CONFIG))),
                        keep=2)
    with pytest.raises(CheckpointError, match="step-00000004 is not the newest .* step-00000008 first"):
        config_for_run(None, [], str(saved_run / "checkpoints" / "step-00000004"), 1)


# ------------------------------------------------------------------------------------------- real runs
@pytest.fixture
def one_epoch_run(an4_manifests, tmp_path):
    run_training(tiny_overrides(an4_manifests, tmp_path, "done", train__epochs=1))
    return tmp_path / "done"


def test_a_refused_resume_leaves_the_run_directory_byte_identical(an4_manifests, tmp_path, one_epoch_run):
    before = tree_digest(one_epoch_run)
    assert "checkpoints/last" in before and "metrics.jsonl" in before and "config.yaml" in before
    attempts = [  # (overrides, what the error says)
        (["model.name=lstman4_small"], "model.name 'lstman4_tiny' -> 'lstman4_small'"),
        (["compression.algorithm=oktopk"], "compression.algorithm 'dense' -> 'oktopk'"),
        (["compression.algorithm=topka", "train.epochs=2"], "compression.algorithm 'dense' -> 'topka'"),
    ]
    for overrides, message in attempts:
        with pytest.raises(ConfigError, match=message):
            run_training(overrides, resume=str(one_epoch_run), config=None)
        assert tree_digest(one_epoch_run) == before, overrides
    shard = one_epoch_run / "checkpoints" / "last" / "rank0.pt"
    flip_byte(shard)
    before = tree_digest(one_epoch_run)
    with pytest.raises(CheckpointError, match="rank0.pt is corrupted"):
        run_training(["train.epochs=2"], resume=str(one_epoch_run), config=None)
    assert tree_digest(one_epoch_run) == before


def test_a_checkpoint_that_does_not_fit_the_trainer_is_refused(an4_manifests, tmp_path):
    """A dense run's state offered to an Ok-Topk run (as if the config check were bypassed): a clear
    error naming the missing compressor keys, not a bare KeyError."""
    comm = Communicator()

    def trainer(name, algorithm, resume="", **settings):
        overrides = tiny_overrides(an4_manifests, tmp_path, name, compression__algorithm=algorithm, **settings)
        return start_run(prepare_run(resolve_for_run(load_config(SMOKE_CONFIG, overrides), comm), comm, resume), comm)

    dense, oktopk = trainer("dense", "dense"), trainer("ok", "oktopk")
    with pytest.raises(CheckpointError, match="compressor state does not fit this run: missing boundaries, "
                                              "global_drift, global_ideal, global_threshold, local_drift, "
                                              "local_ideal, local_threshold, memory, sparse_steps"):
        check_fits(dense.training_state(), oktopk.model, oktopk.compressor, "dense")
    # warmup_steps 'auto' (5% of the run's steps) is fixed when a run starts: 1 epoch of 4 steps = none.
    # Resumed with 40 epochs it stays none, and the state fits (160 steps would make it 8).
    short = trainer("short", "oktopk", compression__warmup_steps="auto", train__epochs=1)
    fresh = trainer("fresh", "oktopk", compression__warmup_steps="auto", train__epochs=40)
    short.save()
    longer = trainer("longer", "oktopk", resume=str(tmp_path / "short"), compression__warmup_steps="auto",
                     train__epochs=40)
    assert (short.compressor.warmup_steps, fresh.compressor.warmup_steps) == (0, 8)
    assert longer.compressor.warmup_steps == 0
    assert longer.compressor.state_dict().keys() == short.compressor.state_dict().keys()
    for t in (dense, oktopk, short, fresh, longer):
        t.log.close()


def assert_same_parameters(a_dir, b_dir):
    comm = Communicator()
    a, b = load_training_state(comm, a_dir), load_training_state(comm, b_dir)
    assert (a.progress.step, a.progress.epoch) == (b.progress.step, b.progress.epoch)
    assert a.model.keys() == b.model.keys()
    for key in a.model:
        torch.testing.assert_close(a.model[key], b.model[key], rtol=1e-6, atol=1e-7, msg=key)
    for sa, sb in zip(a.optimizer["state"].values(), b.optimizer["state"].values()):
        torch.testing.assert_close(sa["momentum_buffer"], sb["momentum_buffer"], rtol=1e-6, atol=1e-7)


def assert_same_losses(a_dir, b_dir, steps):
    a, b = step_losses(a_dir), step_losses(b_dir)
    assert sorted(a) == sorted(b) == list(range(1, steps + 1)), (sorted(a), sorted(b))
    for step in a:
        assert a[step] == pytest.approx(b[step], rel=1e-6), (step, a[step], b[step])


def assert_tensorboard_matches_metrics(run_dir, steps, val_steps):
    """TensorBoard as scripts/compare_runs.py reads it (EventAccumulator, which honours the purge marker a
    resumed run writes): every step once with metrics.jsonl's value, and every epoch's validation point."""
    curves = load_run(run_dir).curves
    losses = step_losses(run_dir)
    assert curves["train/loss"].steps.tolist() == list(range(1, steps + 1))
    assert curves["train/loss"].values.tolist() == pytest.approx([losses[s] for s in range(1, steps + 1)], rel=1e-6)
    assert curves["dev/wer"].steps.tolist() == val_steps
    val = {m["step"]: m["dev/wer"] for m in read_metrics(run_dir) if m["kind"] == "dev"}
    assert curves["dev/wer"].values.tolist() == pytest.approx([val[s] for s in val_steps], rel=1e-6)


# Feature masking (off by default) must not break exact resume: its masks depend on (seed, epoch, item).
AUGMENTATION = {"off": {}, "on": dict(data__freq_masks=2, data__time_masks=2)}


@pytest.mark.parametrize("augmentation", AUGMENTATION)
def test_two_epochs_equal_one_epoch_resume_one_epoch(an4_manifests, tmp_path, augmentation):
    # 16 utterances, batch 4: 4 steps per epoch. lr_anneal makes epoch 2 use another learning rate.
    settings = dict(train__epochs=2, optim__lr=1e-3, optim__lr_warmup_steps=3, train__eval_every_epochs=1,
                    **AUGMENTATION[augmentation])
    full = run_training(tiny_overrides(an4_manifests, tmp_path, "full", **settings))
    run_training(tiny_overrides(an4_manifests, tmp_path, "parts", **{**settings, "train__epochs": 1}))
    # The run's own config, one safe change: the number of epochs.
    resumed = run_training(["train.epochs=2"], resume=str(tmp_path / "parts"), config=None)
    assert_same_losses(tmp_path / "full", tmp_path / "parts", steps=8)
    assert_same_parameters(tmp_path / "full", tmp_path / "parts")
    assert resumed["dev"] == pytest.approx(full["dev"]) and resumed["test"] == pytest.approx(full["test"])
    assert_one_row_per_kind_and_step(tmp_path / "parts")
    assert_tensorboard_matches_metrics(tmp_path / "parts", steps=8, val_steps=[4, 8])


@pytest.mark.parametrize("augmentation", AUGMENTATION)
def test_resume_mid_epoch_after_a_crash(an4_manifests, tmp_path, monkeypatch, augmentation):
    """A checkpoint every 3 steps; the run dies after step 7 (epoch 2, third batch; logged, not checkpointed).
    Resuming (mid-epoch, sampler position 2 of 4) continues the same curve, and step 7's first rows are
    gone from metrics.jsonl and hidden from TensorBoard readers."""
    settings = dict(train__epochs=2, optim__lr=1e-3, train__checkpoint_every_steps=3, **AUGMENTATION[augmentation])
    run_training(tiny_overrides(an4_manifests, tmp_path, "full", **settings))

    original = Trainer.train_step

    def dies_after_step_7(self, batch):
        if self.progress.step == 7:
            raise RuntimeError("simulated crash")
        return original(self, batch)

    monkeypatch.setattr(Trainer, "train_step", dies_after_step_7)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_training(tiny_overrides(an4_manifests, tmp_path, "crashed", **settings))
    monkeypatch.undo()
    crashed = tmp_path / "crashed"
    assert max(step_losses(crashed)) == 7  # logged after the last checkpoint
    last = load_training_state(Communicator(), crashed)
    assert last.progress == Progress(step=6, epoch=1, batch_in_epoch=2, best_wer=last.progress.best_wer)
    assert sorted(p.name for p in (crashed / "checkpoints").iterdir()) == ["best", "last", "step-00000004",
                                                                           "step-00000006"]
    run_training(tiny_overrides(an4_manifests, tmp_path, "crashed", **settings), resume=str(crashed))
    assert_same_losses(tmp_path / "full", crashed, steps=8)
    assert_same_parameters(tmp_path / "full", crashed)
    assert_one_row_per_kind_and_step(crashed)
    assert_tensorboard_matches_metrics(crashed, steps=8, val_steps=[4, 8])


def test_resume_auto_for_chained_jobs(an4_manifests, tmp_path):
    """The same command for every job of a chain: `--resume auto --overwrite name=NAME`. The first job died
    before its first checkpoint (leftovers, no checkpoint): the next starts afresh, replacing them; once a
    checkpoint exists the next one continues it (and --overwrite deletes nothing)."""
    run_dir = tmp_path / "chain"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("name: chain\n")  # a run writes it first: its files say which run
    (run_dir / "metrics.jsonl").write_text('{"kind": "train", "step": 1, "epoch": 0, "time": 0}\n')

    def job(epochs):
        overrides = tiny_overrides(an4_manifests, tmp_path, "chain", train__epochs=epochs)
        return run_training(overrides, resume="auto", overwrite=True)

    job(1)
    assert sorted(step_losses(run_dir)) == [1, 2, 3, 4] and len(read_metrics(run_dir)) == 4 + 3  # + epoch, val, test
    job(2)
    assert sorted(step_losses(run_dir)) == list(range(1, 9))
    assert load_training_state(Communicator(), run_dir).progress.epoch == 2
