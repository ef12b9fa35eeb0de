"""Files a job touches in a shared place (sparse_asr/fileio.py, docs/files.md): links someone else could have
planted are never followed (their victims stay unchanged), a FIFO or device where a file belongs is refused
without waiting on it, and every text read has a size bound (a bomb is refused under a memory limit)."""
import json
import os
import signal
import subprocess
import sys
import tarfile
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from sparse_asr.comm import Communicator
from sparse_asr.data import an4
from sparse_asr.data.manifest import read_manifest
from sparse_asr.fileio import UnsafePathError, trusted_path
from sparse_asr.training.checkpoint import (CheckpointError, find_checkpoint, load_shared, locate_checkpoint,
                                            read_index, save_training_state)
from sparse_asr.training.config import ConfigError, load_config
from sparse_asr.training.rundir import RunDirLock, clear_previous_run, overwrite_problem, run_paths_problem
from sparse_asr.training.runlog import RunLogger
from tests.mpi_helpers import REPO
from tests.mpi.train_common import run_training, tiny_overrides
from tests.test_checkpoint import make_state

pytestmark = pytest.mark.unit


class RankZero:
    """What RunDirLock needs of a communicator, on one process."""

    rank, size = 0, 1

    def bcast_object(self, obj):
        return obj


def shared_dir(path: Path) -> Path:
    """A directory others can write (a group's runs/ or data directory)."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o777)
    return path


def victim(path: Path, text: str = "the victim's own content\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@contextmanager
def within(seconds: int):
    """Fail instead of hanging (a FIFO opened for reading waits for a writer forever)."""
    def hung(*_):
        raise TimeoutError(f"still waiting after {seconds} s")
    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# ------------------------------------------------------------------------------------------- links
def test_the_rule_follows_the_users_own_link_and_refuses_one_in_a_shared_directory(tmp_path):
    scratch = (tmp_path / "scratch").resolve()
    scratch.mkdir()
    private = tmp_path / "private"
    private.mkdir(mode=0o755)
    (private / "runs").symlink_to(scratch)  # a researcher's runs/ on scratch space: theirs to follow
    assert trusted_path(private / "runs" / "a") == scratch / "a"
    shared = shared_dir(tmp_path / "shared")
    (shared / "runs").symlink_to(scratch)
    with pytest.raises(UnsafePathError, match=r"shared/runs is a symbolic link in .*others can write; refusing"):
        trusted_path(shared / "runs" / "a")


def test_a_link_planted_at_metrics_jsonl_is_refused_and_its_victim_unchanged(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    target = victim(tmp_path / "elsewhere" / "victim.txt")
    (run_dir / "metrics.jsonl").symlink_to(target)
    with pytest.raises(UnsafePathError, match="metrics.jsonl"):
        RunLogger(run_dir, enabled=True)
    assert target.read_text() == "the victim's own content\n"
    (run_dir / "metrics.jsonl").unlink()
    (run_dir / "metrics.jsonl").symlink_to(tmp_path / "created-through-it")  # dangling: would be created
    with pytest.raises(UnsafePathError, match="metrics.jsonl"):
        RunLogger(run_dir, enabled=True)
    assert not (tmp_path / "created-through-it").exists()


def test_a_run_directory_linked_in_a_shared_runs_directory_is_refused_before_anything_is_written(tmp_path):
    runs = shared_dir(tmp_path / "runs")
    other = tmp_path / "other"
    victim(other / "config.yaml", "name: other\n")
    (runs / "s8").symlink_to(other)
    with pytest.raises(UnsafePathError, match=r"runs/s8 is a symbolic link in .*others can write"):
        RunDirLock(runs / "s8", RankZero()).acquire()
    assert sorted(p.name for p in other.iterdir()) == ["config.yaml"]  # no .lock written into the victim


def test_overwrite_deletes_only_a_run_its_own_files_prove_and_says_where(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir(mode=0o755)
    victim(runs / "other" / "config.yaml", "name: other\n")
    victim(runs / "other" / "metrics.jsonl", "{}\n")
    (runs / "mine").symlink_to(runs / "other")  # the user's own link, to another run
    assert "holds run 'other' by its config.yaml, not 'mine'; refusing" in overwrite_problem(runs / "mine", "mine")
    assert sorted(p.name for p in (runs / "other").iterdir()) == ["config.yaml", "metrics.jsonl"]
    (runs / "mine").unlink()
    victim(runs / "scratch" / "config.yaml", "name: mine\n")  # the run itself, on a linked directory
    (runs / "mine").symlink_to(runs / "scratch")
    assert overwrite_problem(runs / "mine", "mine") is None
    where, deleted = clear_previous_run(runs / "mine")
    assert where == (runs / "scratch").resolve() and [p.name for p in deleted] == ["config.yaml"]


def test_files_a_run_writes_are_checked_before_it_writes_any(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "provenance.jsonl").symlink_to(victim(tmp_path / "victim.txt"))
    assert "provenance.jsonl is a symbolic link" in run_paths_problem(run_dir)
    (run_dir / "provenance.jsonl").unlink()
    (run_dir / "checkpoints").symlink_to(tmp_path / "gone")  # dangling: would fail only at the first save
    assert "checkpoint directory" in run_paths_problem(run_dir) and "does not exist" in run_paths_problem(run_dir)


def test_a_dangling_checkpoints_link_refuses_the_run_before_it_reads_or_writes_anything(tmp_path):
    """It used to fail only at the first save, an epoch in; the manifests here do not even exist."""
    run_dir = tmp_path / "planted"
    run_dir.mkdir()
    (run_dir / "checkpoints").symlink_to(tmp_path / "gone")
    with pytest.raises(FileExistsError, match=r"checkpoint directory .*checkpoints exists and is not a directory"):
        run_training(tiny_overrides(tmp_path / "manifests", tmp_path, "planted"))
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoints"]  # no config, events or metrics
    assert not (tmp_path / "gone").exists()


def test_last_pointing_at_another_runs_checkpoint_is_never_continued(tmp_path):
    comm = Communicator()
    own = save_training_state(comm, tmp_path / "s8" / "checkpoints", make_state(4))
    theirs = save_training_state(comm, tmp_path / "s9" / "checkpoints", make_state(12))
    last = tmp_path / "s8" / "checkpoints" / "last"
    last.unlink()
    last.symlink_to(Path("..") / ".." / "s9" / "checkpoints" / theirs.name)
    found, note = locate_checkpoint(tmp_path / "s8")
    assert found == own.resolve() and "not at a step-N checkpoint of its own run" in note
    with pytest.raises(CheckpointError, match="not at a step-N checkpoint of its own run"):
        find_checkpoint(last)
    assert (theirs / "index.json").is_file()


def test_a_planted_step_link_is_replaced_by_the_save_and_its_victim_kept(tmp_path):
    comm = Communicator()
    checkpoints = tmp_path / "run" / "checkpoints"
    save_training_state(comm, checkpoints, make_state(2))
    other = victim(tmp_path / "other" / "keep.txt").parent
    (checkpoints / "step-00000004").symlink_to(other)
    saved = save_training_state(comm, checkpoints, make_state(4), keep=1)
    assert not saved.is_symlink() and (saved / "index.json").is_file()
    assert (other / "keep.txt").read_text() == "the victim's own content\n"


def make_archive(tmp_path: Path) -> Path:
    source = tmp_path / "src" / "an4"
    victim(source / "etc" / "readme.txt", "AN4\n")
    victim(source / "LICENSE", "CMU's notice\n")
    archive = tmp_path / "an4.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(source, arcname="an4")
    return archive


def test_links_at_the_licence_and_the_extraction_record_are_replaced_not_written_through(tmp_path, monkeypatch):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    record_victim, licence_victim = victim(tmp_path / "record-victim"), victim(tmp_path / "licence-victim")
    (data_dir / an4.MARKER).symlink_to(record_victim)
    (data_dir / "LICENSE.an4").symlink_to(licence_victim)
    root = an4.extract(make_archive(tmp_path), data_dir)
    monkeypatch.setattr(an4, "SHARED_LICENSE", tmp_path / "absent")
    an4.copy_license(root, data_dir)
    assert record_victim.read_text() == licence_victim.read_text() == "the victim's own content\n"
    assert (data_dir / "LICENSE.an4").read_text() == "CMU's notice\n" and not (data_dir / "LICENSE.an4").is_symlink()
    assert json.loads((data_dir / an4.MARKER).read_text())["archive"].endswith("an4.tar.gz")


def test_extraction_follows_the_umask_and_leaves_no_temporary_directory_after_a_kill(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / ".an4_extract.killed").mkdir()  # what a SIGKILL during extraction leaves
    old = os.umask(0o077)
    try:
        with an4._locked(data_dir):
            root = an4.extract(make_archive(tmp_path), data_dir)
    finally:
        os.umask(old)
    assert not list(data_dir.glob(".an4_extract.*"))
    modes = {p.name: p.stat().st_mode & 0o777 for p in root.rglob("*")}
    assert modes == {"etc": 0o700, "readme.txt": 0o600, "LICENSE": 0o600}, modes


# ------------------------------------------------------------------------------------------- FIFOs
def test_a_fifo_where_a_config_or_include_belongs_is_refused_without_waiting(tmp_path):
    os.mkfifo(tmp_path / "fifo.yaml")
    with within(10), pytest.raises(ConfigError, match="fifo.yaml is not a regular file .*FIFO"):
        load_config(tmp_path / "fifo.yaml")
    (tmp_path / "c.yaml").write_text("include: fifo.yaml\n")
    with within(10), pytest.raises(ConfigError, match=r"fifo.yaml is not a regular file .*included by .*c\.yaml"):
        load_config(tmp_path / "c.yaml")


def test_a_fifo_as_a_legacy_transcript_or_a_checkpoint_index_is_refused_without_waiting(tmp_path):
    audio = tmp_path / "a.wav"  # the transcript is read first
    os.mkfifo(tmp_path / "t.txt")
    (tmp_path / "legacy.csv").write_text(f"{audio},{tmp_path / 't.txt'}\n")
    problems = []
    with within(10):
        read_manifest(tmp_path / "legacy.csv", problems)
    assert "t.txt is not a regular file (it is a FIFO)" in problems[0]
    step = tmp_path / "run" / "checkpoints" / "step-00000001"
    step.mkdir(parents=True)
    os.mkfifo(step / "index.json")
    with within(10), pytest.raises(CheckpointError, match="index.json is not a regular file"):
        read_index(step)


# ------------------------------------------------------------------------------------------- size bounds
MEMORY_BOUND = 512 << 20  # bytes of address space a bomb's read may add to the process


def under_memory_bound(code: str) -> subprocess.CompletedProcess:
    """Run `code` in a fresh Python whose address space may grow by MEMORY_BOUND only past its imports."""
    prelude = ("import resource\n"
               "import sparse_asr.training.launch, sparse_asr.data.manifest\n"
               "vm = int(open('/proc/self/statm').read().split()[0]) * resource.getpagesize()\n"
               f"resource.setrlimit(resource.RLIMIT_AS, (vm + {MEMORY_BOUND}, resource.RLIM_INFINITY))\n")
    return subprocess.run([sys.executable, "-c", prelude + code], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})


def sparse_file(path: Path, size: int = 4 << 30) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)  # takes no disk space
    return path


def test_a_huge_legacy_transcript_is_refused_under_the_memory_bound(tmp_path):
    audio = tmp_path / "a.wav"  # the transcript is read first
    (tmp_path / "legacy.csv").write_text(f"{audio},{sparse_file(tmp_path / 't.txt')}\n")
    proc = under_memory_bound("from sparse_asr.data.manifest import read_manifest\n"
                              f"problems = []\nread_manifest({str(tmp_path / 'legacy.csv')!r}, problems)\n"
                              "print(problems[0])\n")
    assert proc.returncode == 0, proc.stderr
    assert "t.txt has 4294967296 bytes, more than the 1048576 a transcript may have" in proc.stdout


def test_a_huge_checkpoint_index_is_refused_under_the_memory_bound(tmp_path):
    step = tmp_path / "step-00000001"
    step.mkdir()
    sparse_file(step / "index.json")
    proc = under_memory_bound("from sparse_asr.training.checkpoint import read_index, CheckpointError\n"
                              f"try:\n    read_index({str(step)!r})\nexcept CheckpointError as e:\n    print(e)\n")
    assert proc.returncode == 0, proc.stderr
    assert "index.json has 4294967296 bytes, more than the" in proc.stdout


def test_a_yaml_billion_laughs_is_refused_under_the_memory_bound(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 10)]
    (tmp_path / "laughs.yaml").write_text("\n".join(lines) + "\n")
    proc = under_memory_bound("from sparse_asr.training.config import load_config, ConfigError\n"
                              f"try:\n    load_config({str(tmp_path / 'laughs.yaml')!r})\n"
                              "except ConfigError as e:\n    print(e)\n")
    assert proc.returncode == 0, proc.stderr
    assert "laughs.yaml: expands to more than 100000 values" in proc.stdout


def test_a_checkpoint_tensor_of_repeated_elements_is_refused_under_the_memory_bound(tmp_path):
    comm = Communicator()
    state = make_state(1)
    state.mine.rng["torch"] = torch.zeros(1, dtype=torch.uint8).expand(3 << 30)  # 1 byte stored, 3 GB in use
    directory = save_training_state(comm, tmp_path / "checkpoints", state)
    proc = under_memory_bound("from sparse_asr.comm import Communicator\n"
                              "from sparse_asr.training.checkpoint import load_training_state, CheckpointError\n"
                              f"try:\n    load_training_state(Communicator(), {str(directory)!r})\n"
                              "except CheckpointError as e:\n    print(e)\n")
    assert proc.returncode == 0, proc.stderr
    assert "tensor state.rng.torch has shape (3221225472,) over strides (0,)" in proc.stdout


def test_a_shared_file_still_loads(tmp_path):
    """The checks refuse only what a save never writes: a saved checkpoint loads as before."""
    directory = save_training_state(Communicator(), tmp_path / "checkpoints", make_state(3))
    _, shared = load_shared(directory)
    assert shared["progress"]["step"] == 3


def test_a_full_disk_at_the_lock_leaves_no_empty_run_directory(tmp_path, monkeypatch):
    import errno

    from sparse_asr.training import rundir

    def full(*_):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(rundir.os, "pwrite", full)
    with pytest.raises(OSError, match=r"cannot take the lock .*runs/new/\.lock: No space left on device"):
        RunDirLock(tmp_path / "runs" / "new", RankZero()).acquire()
    assert not (tmp_path / "runs").exists()
