"""What a cluster user's mistakes and a cluster's failures must produce: a clear message naming the cause
(file, line, key or machine), nothing lost, and an end (never a hang). Each case runs the real entry point
the way a user would, in a subprocess."""
import fcntl
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.mpi.train_common import SMOKE_CONFIG, read_metrics, tiny_overrides

pytestmark = pytest.mark.data  # every case runs the real entry points on the real corpus


def train_cli(args: list[str], env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "train.py", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def test_bf16_on_a_cpu_without_bfloat16_kernels_is_refused_before_the_run_starts(an4_manifests, tmp_path):
    """oneDNN capped at AVX2 (an AMD EPYC's instruction set): bf16 would die inside the LSTM's first forward
    with 'could not create a primitive descriptor'; instead train.py refuses it by name, writes nothing."""
    proc = train_cli(["--config", str(SMOKE_CONFIG), *tiny_overrides(an4_manifests, tmp_path, "bf16"),
                      "train.precision=bf16", "model.sync_batchnorm=true"], env={"ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert proc.returncode == 1, proc.stderr
    assert "ConfigError: train.precision=bf16: this CPU (" in proc.stderr, proc.stderr
    assert "has no oneDNN bfloat16 kernels" in proc.stderr and "use train.precision=fp32" in proc.stderr
    assert "Traceback" not in proc.stderr and "primitive descriptor" not in proc.stderr
    assert not (tmp_path / "bf16").exists()


def test_everything_a_run_writes_is_readable_by_the_group_as_the_umask_says(an4_manifests, tmp_path):
    """On a shared project allocation the group evaluates and compares runs: config.yaml, checkpoint files,
    their index, metrics.jsonl (rewritten by a resume), the events and prepared manifests get 0666 less the
    umask, not mkstemp's owner-only 0600."""
    import stat

    from sparse_asr.data.manifest import read_manifest, write_manifest
    from tests.mpi.train_common import run_training

    previous = os.umask(0o022)
    try:
        overrides = tiny_overrides(an4_manifests, tmp_path, "shared", train__epochs=1)
        run_training(overrides)
        run_training(overrides + ["train.epochs=2"], resume=str(tmp_path / "shared"))
        write_manifest(read_manifest(an4_manifests / "an4_dev.csv"), tmp_path / "dev.csv")
        os.umask(0o027)
        write_manifest(read_manifest(an4_manifests / "an4_dev.csv"), tmp_path / "dev_027.csv")
    finally:
        os.umask(previous)
    files = [p for p in (tmp_path / "shared").rglob("*") if p.is_file() and not p.is_symlink()]
    assert {p.name for p in files} >= {"config.yaml", "metrics.jsonl", "index.json", "shared.pt", "rank0.pt"}
    modes = {str(p.relative_to(tmp_path)): oct(stat.S_IMODE(p.stat().st_mode)) for p in files}
    assert set(modes.values()) == {"0o644"}, modes
    assert oct(stat.S_IMODE((tmp_path / "dev.csv").stat().st_mode)) == "0o644"
    assert oct(stat.S_IMODE((tmp_path / "dev_027.csv").stat().st_mode)) == "0o640"


def test_a_second_job_in_a_run_directory_is_refused_naming_the_holder(an4_manifests, tmp_path):
    """Two chained jobs started at once (`--resume auto name=dup` twice): the second is refused with the first's
    host and PID, and writes nothing; a lock left by a job that died (no process holds it) is taken over."""
    import socket

    from sparse_asr.comm import Communicator
    from sparse_asr.training.rundir import RunDirLock
    from tests.mpi.train_common import run_training, tree_digest

    overrides = tiny_overrides(an4_manifests, tmp_path, "dup", train__epochs=1)
    run_training(overrides)
    first = RunDirLock(tmp_path / "dup", Communicator())
    first.acquire()  # the running job
    before = tree_digest(tmp_path / "dup")
    try:
        with pytest.raises(FileExistsError, match=rf"run directory {tmp_path / 'dup'} is in use by the job on host "
                                                   rf"{socket.gethostname()}, PID {os.getpid()}, started "):
            run_training(overrides + ["train.epochs=2"], resume="auto")
        assert tree_digest(tmp_path / "dup") == before
    finally:
        first.release()
    (tmp_path / "dup" / ".lock").write_text("the job on host gone, PID 1, started long ago\n")  # it died
    run_training(overrides + ["train.epochs=2"], resume="auto")
    assert not (tmp_path / "dup" / ".lock").exists()
    assert [m["epoch"] for m in read_metrics(tmp_path / "dup") if m["kind"] == "epoch"] == [1, 2]


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs: a real full disk (ENOSPC). Needs root (CI and these machines run as root)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_a_full_disk_during_a_checkpoint_names_the_cause_and_the_file_and_leaves_no_step(an4_manifests,
                                                                                         small_disk):
    """torch.save's own error for a failed write is 'unexpected pos ...'; the job's is ENOSPC with the file."""
    proc = train_cli(["--config", str(SMOKE_CONFIG), *tiny_overrides(an4_manifests, small_disk, "full"),
                      "train.checkpoint_every_steps=2", "model.name=lstman4_small"])
    assert proc.returncode == 1, proc.stderr
    assert re.search(rf"^OSError: \[Errno 28\] checkpoint {small_disk}/full/checkpoints/step-\d+ not written: "
                     rf"rank 0: \[Errno 28\] could not write {small_disk}/full/checkpoints/step-\d+/\S+\.pt: "
                     r"No space left on device", proc.stderr, flags=re.MULTILINE), proc.stderr
    assert "unexpected pos" not in proc.stderr and "Traceback" not in proc.stderr
    assert not list((small_disk / "full" / "checkpoints").glob("step-*"))  # no unfinished step directory


def test_a_full_disk_during_logging_names_the_run_directory(tmp_path, small_disk):
    from sparse_asr.training.runlog import RunLogger

    log = RunLogger(small_disk / "run", enabled=True)
    (small_disk / "filler").write_bytes(b"\0" * (2 * 2**20 - 8192))  # what is left of the disk: nothing much
    with pytest.raises(OSError, match=rf"could not write metrics.jsonl or TensorBoard events in {small_disk}/run: "
                                      r"No space left on device"):
        for step in range(1000):
            log.scalars("train", step, 0, {"train/loss": 1.0, "comm/bytes_recv": 2.0})


def test_every_bad_manifest_row_is_named_at_once(an4_manifests, tmp_path):
    """Three bad transcripts, or missing files in a legacy list, bad durations: one error listing every line,
    not the first of them per attempt."""
    from sparse_asr.data.dataset import SpeechDataset
    from sparse_asr.data.manifest import ManifestError, read_manifest, write_manifest

    df = read_manifest(an4_manifests / "an4_dev.csv").head(6).copy()
    df.loc[1, "transcript"], df.loc[3, "transcript"], df.loc[4, "transcript"] = "HELLO 42", "", "NAÏVE"
    write_manifest(df, tmp_path / "bad.csv")
    with pytest.raises(ManifestError) as error:
        SpeechDataset(tmp_path / "bad.csv")
    message = str(error.value)
    assert message.startswith(f"3 of 6 rows of {tmp_path / 'bad.csv'} cannot be used:"), message  # read_manifest's
    assert all(f"bad.csv:{line} " in message for line in (3, 5, 6)), message  # header + 1-based rows

    legacy = tmp_path / "legacy.csv"
    txt = tmp_path / "t.txt"
    txt.write_text("YES")
    rows = [f"{a},{txt}" for a in df["audio"]]
    rows[0], rows[2], rows[5] = f"/gone/a.wav,{txt}", f"/gone/b.wav,{txt}", f"/gone/c.wav,{txt}"
    legacy.write_text("\n".join(rows) + "\n")
    with pytest.raises(ManifestError) as error:
        read_manifest(legacy)
    message = str(error.value)
    assert message.startswith(f"3 of 6 rows of {legacy} cannot be used:"), message
    assert all(f"legacy.csv:{line}: audio file /gone/{name}.wav does not exist" in message
               for line, name in ((1, "a"), (3, "b"), (6, "c"))), message

    ours = tmp_path / "ours.csv"
    lines = (an4_manifests / "an4_dev.csv").read_text().splitlines()[:5]
    lines[2] = lines[2].replace(lines[2].split(",")[1], "long", 1)
    lines[4] = lines[4].replace(lines[4].split(",")[1], "-1", 1)
    ours.write_text("\n".join(lines).replace("../datasets", str(an4_manifests.parent.parent / "datasets")) + "\n")
    with pytest.raises(ManifestError, match=r"2 of 4 rows of .*ours\.csv cannot be used:\n  .*ours\.csv:3: duration "
                                            r"'long' is not a number\n  .*ours\.csv:5: duration must be a positive"):
        read_manifest(ours)


def test_resume_falls_back_to_the_newest_intact_checkpoint_and_refuses_an_edited_index(an4_manifests, tmp_path):
    """`last` missing, dangling, or pointing at a step whose index is gone or was edited: a run directory resumes
    from the newest intact checkpoint and says so; naming the damaged checkpoint itself is refused by name."""
    import json
    import shutil

    from sparse_asr.training.checkpoint import CheckpointError, locate_checkpoint
    from tests.mpi.train_common import run_training

    overrides = tiny_overrides(an4_manifests, tmp_path, "fall", train__epochs=3, train__keep_checkpoints=5)
    run_training(overrides)
    checkpoints = tmp_path / "fall" / "checkpoints"
    steps = sorted(checkpoints.glob("step-*"))
    assert len(steps) == 3 and (checkpoints / "last").resolve() == steps[-1].resolve()

    (checkpoints / "last").unlink()  # missing
    found, note = locate_checkpoint(tmp_path / "fall")
    assert found == steps[-1].resolve() and note.startswith(f"{checkpoints / 'last'} does not exist: continuing "
                                                           f"from {steps[-1].name}"), note
    index = steps[-1] / "index.json"
    edited = json.loads(index.read_text())
    edited["step"] += 1  # 'step' 36 -> 37 by hand
    index.write_text(json.dumps(edited, indent=1))
    with pytest.raises(CheckpointError, match=r"was edited or damaged: its content no longer matches its own SHA-256"):
        run_training(overrides, resume=str(steps[-1]))
    (checkpoints / "last").symlink_to(steps[-1].name)  # last -> the edited one
    found, note = locate_checkpoint(tmp_path / "fall")
    assert found == steps[-2].resolve() and "was edited or damaged" in note and steps[-2].name in note
    shutil.rmtree(steps[-2])  # and the one before is gone altogether: a dangling link would be the same
    (checkpoints / "last").unlink()
    (checkpoints / "last").symlink_to(steps[-2].name)
    assert locate_checkpoint(tmp_path / "fall")[0] == steps[0].resolve()
    run_training(overrides + ["train.epochs=4"], resume=str(tmp_path / "fall"))  # continues from step-... epoch 1
    epochs = [m["epoch"] for m in read_metrics(tmp_path / "fall") if m["kind"] == "epoch"]
    assert epochs == [1, 2, 3, 4], epochs  # the rows after the checkpoint it continued from were replaced


def test_an_utterance_ctc_cannot_align_is_named_before_training(an4_manifests, tmp_path, capsys):
    """More labels than output frames: CTC's loss is infinite and zero_infinity makes it 0, so the utterance
    would silently teach nothing; the run says which ones before step 1."""
    from sparse_asr.data.manifest import read_manifest, write_manifest
    from tests.mpi.train_common import run_training

    df = read_manifest(an4_manifests / "an4_train.csv").sort_values("duration").head(16).copy()
    first = df.index[0]
    df.loc[first, "transcript"] = "A VERY LONG TRANSCRIPT THAT NO ONE SECOND OF AUDIO COULD EVER SAY ALOUD " * 2
    write_manifest(df, tmp_path / "train.csv")
    run_training(tiny_overrides(an4_manifests, tmp_path, "ctc", data__train_manifest=tmp_path / "train.csv",
                                train__epochs=1))
    err = capsys.readouterr().err
    assert re.search(r"WARNING: 1 training utterances have more labels than the model's output frames can align", err)
    assert re.search(rf"{tmp_path}/train.csv:2 \({df.loc[first, 'utt_id']}\): 143 labels need 143 frames, the "
                     r"model gives 36\n", err), err


def test_ctrl_c_during_start_up_ends_quietly():
    """SIGINT while torch and MPI are still importing: exit 130 at once, no traceback, no segmentation fault."""
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "train.py", "--config", str(SMOKE_CONFIG)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    time.sleep(0.5)  # the interpreter is up, the imports are not done (they take seconds)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (proc.returncode, err)
    assert "Traceback" not in err and "Segmentation" not in err, err


def test_a_truncated_an4_archive_is_named_with_what_to_do(tmp_path):
    """A copy cut short (an interrupted transfer): one line naming the archive, not a raw EOFError traceback."""
    from tests.conftest import AN4_ARCHIVE

    cut = tmp_path / "an4_sphere.tar.gz"
    with open(AN4_ARCHIVE, "rb") as f:
        cut.write_bytes(f.read(3 * 2**20))
    proc = subprocess.run([sys.executable, "-m", "sparse_asr.data.an4", "--source", str(cut), "--data-dir",
                           str(tmp_path / "data"), "--manifest-dir", str(tmp_path / "manifests")],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{cut} is truncated or damaged (" in proc.stderr and "download or copy it again" in proc.stderr, proc.stderr
    assert not (tmp_path / "data" / "an4").exists()


def test_evaluate_names_every_unusable_audio_file_by_manifest_line(an4_manifests, tmp_path):
    from sparse_asr.data.manifest import read_manifest, write_manifest
    from tests.mpi.train_common import run_training

    run_training(tiny_overrides(an4_manifests, tmp_path, "ev", train__epochs=1))
    df = read_manifest(an4_manifests / "an4_test.csv").head(5).copy()
    df.loc[1, "audio"], df.loc[3, "audio"] = str(tmp_path / "gone.sph"), str(tmp_path)
    write_manifest(df, tmp_path / "test.csv")
    proc = subprocess.run([sys.executable, "evaluate.py", str(tmp_path / "ev"), "--manifest",
                           str(tmp_path / "test.csv")], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "2 of 5 manifest rows have audio that cannot be used" in proc.stderr, proc.stderr
    assert f"{tmp_path}/test.csv:3: " in proc.stderr and f"{tmp_path}/test.csv:5: " in proc.stderr, proc.stderr


def test_planted_symlinks_are_never_written_through(tmp_path):
    """A symlink planted where the project creates its lock files (a shared run or data directory) is refused
    by name and its target left as it was."""
    from sparse_asr.comm import Communicator
    from sparse_asr.data.an4 import An4Error, _locked
    from sparse_asr.training.rundir import RunDirLock

    victim = tmp_path / "victim.txt"
    victim.write_text("someone's data\n")
    for directory, name in ((tmp_path / "run", ".lock"), (tmp_path / "data", ".an4.lock")):
        directory.mkdir()
        (directory / name).symlink_to(victim)
    with pytest.raises(OSError, match=rf"^{tmp_path / 'run' / '.lock'} is a symbolic link; refusing to follow it$"):
        RunDirLock(tmp_path / "run", Communicator()).acquire()
    with pytest.raises(An4Error, match=rf"{tmp_path / 'data' / '.an4.lock'} is a symbolic link; refusing"):
        with _locked(tmp_path / "data"):
            pass
    assert victim.read_text() == "someone's data\n"


def test_the_lock_a_job_releases_is_never_taken_by_two(tmp_path):
    """The ending job unlinks .lock while it holds it; a job that opened that file just before locks a
    dead inode: it must notice and lock the path anew, so that it and a third job cannot both hold it."""
    from sparse_asr.comm import Communicator
    from sparse_asr.training.rundir import RunDirLock

    first = RunDirLock(tmp_path / "run", Communicator())
    first.acquire()
    real_flock, opened = fcntl.flock, []

    def flock_after_release(fd, op):  # the second job has opened the old file; the first ends right then
        if not opened:
            opened.append(fd)
            first.release()
        return real_flock(fd, op)

    second = RunDirLock(tmp_path / "run", Communicator())
    try:
        fcntl.flock = flock_after_release
        second.acquire()
    finally:
        fcntl.flock = real_flock
    assert opened and (tmp_path / "run" / ".lock").exists()  # second locked the file that is there now
    with pytest.raises(FileExistsError, match="is in use by the job on host"):
        RunDirLock(tmp_path / "run", Communicator()).acquire()  # a third job is refused
    second.release()


def test_a_full_disk_at_the_lock_names_it_and_leaves_no_lock(small_disk):
    from sparse_asr.comm import Communicator
    from sparse_asr.training.rundir import RunDirLock

    (small_disk / "run").mkdir()
    filler = small_disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:  # fill the disk to the last block
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    with pytest.raises(OSError, match=rf"cannot take the lock {small_disk / 'run' / '.lock'}: No space left"):
        RunDirLock(small_disk / "run", Communicator()).acquire()
    assert not (small_disk / "run" / ".lock").exists()


def test_a_delayed_chained_job_continues_the_run_it_finds_under_the_lock(an4_manifests, tmp_path, monkeypatch):
    """Two `--resume auto name=X` jobs started together; the second is slow in start-up and takes the lock only
    after the first has finished. It must continue that run, not start afresh over it."""
    from sparse_asr.training.rundir import RunDirLock
    from tests.mpi.train_common import run_training

    overrides = tiny_overrides(an4_manifests, tmp_path, "chain", train__epochs=1)
    real_acquire, first_done = RunDirLock.acquire, []

    def slow_acquire(lock):  # job B has decided nothing yet when job A runs start to end
        if not first_done:
            first_done.append(True)
            monkeypatch.setattr(RunDirLock, "acquire", real_acquire)
            run_training(overrides, resume="auto")  # job A
        real_acquire(lock)

    monkeypatch.setattr(RunDirLock, "acquire", slow_acquire)
    run_training(overrides + ["train.epochs=2"], resume="auto")  # job B
    rows = read_metrics(tmp_path / "chain")
    assert [m["epoch"] for m in rows if m["kind"] == "epoch"] == [1, 2]  # B continued A's epoch 1
    # one history: A's rows up to its checkpoint, then B's (A's test row after its last checkpoint is dropped)
    assert [m["epoch"] for m in rows if m["kind"] == "test"] == [2]


def test_resume_auto_with_last_missing_or_dangling_continues_from_the_newest_intact(an4_manifests, tmp_path):
    """The chained-job path falls back like --resume RUN does."""
    from tests.mpi.train_common import run_training

    overrides = tiny_overrides(an4_manifests, tmp_path, "nolast", train__epochs=1)
    run_training(overrides, resume="auto")
    last = tmp_path / "nolast" / "checkpoints" / "last"
    target = os.readlink(last)
    last.unlink()
    run_training(overrides + ["train.epochs=2"], resume="auto")  # last missing
    last.unlink()
    last.symlink_to("step-99999999")  # dangling
    run_training(overrides + ["train.epochs=3"], resume="auto")
    epochs = [m["epoch"] for m in read_metrics(tmp_path / "nolast") if m["kind"] == "epoch"]
    assert epochs == [1, 2, 3] and target.startswith("step-"), epochs


def test_a_row_cut_by_a_crash_never_corrupts_the_metrics_on_resume(an4_manifests, tmp_path):
    """A node crash can cut metrics.jsonl inside the rows a checkpoint covers : the resume keeps
    the complete rows before the cut, says so, and every line of the file stays one JSON object."""
    import json

    from tests.mpi.train_common import run_training

    overrides = tiny_overrides(an4_manifests, tmp_path, "cut", train__epochs=1)
    run_training(overrides)
    path = tmp_path / "cut" / "metrics.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:5]) + lines[5][: len(lines[5]) // 2])  # cut in the middle of line 6
    proc = train_cli(["--resume", str(tmp_path / "cut"), "train.epochs=2"])
    assert proc.returncode == 0, proc.stderr
    assert "metrics.jsonl: kept the 5 complete rows the checkpoint covers" in proc.stdout
    assert "line 6 was cut or damaged" in proc.stdout
    rows = [json.loads(line) for line in path.read_text().splitlines()]  # every line parses
    assert path.read_bytes().splitlines(keepends=True)[:5] == lines[:5]
    assert [m["epoch"] for m in rows if m["kind"] == "epoch"] == [1, 2]  # epoch 1's row is among the first 5


@pytest.mark.mpi
def test_a_rank_stopped_before_mpi_is_up_ends_the_job(tmp_path):
    """Rank 1 stops itself (SIGSTOP) before MPI_Init, so rank 0 waits inside MPI_Init, where no Python thread
    runs: the job ends within distributed.timeout_s plus start-up, naming the wait."""
    import time

    from tests.mpi_helpers import MPIEXEC

    stop_self = "import os, signal; os.kill(os.getpid(), signal.SIGSTOP)"
    t0 = time.monotonic()
    proc = subprocess.run([MPIEXEC, "-n", "1", sys.executable, "train.py", "--config", str(SMOKE_CONFIG),
                           "distributed.timeout_s=6", f"out_dir={tmp_path}", "name=stall", ":",
                           "-n", "1", sys.executable, "-c", stop_self], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    took = time.monotonic() - t0
    assert proc.returncode != 0 and took < 6 + 40, (proc.returncode, took)
    assert "MPI start-up (MPI_Init: every rank joining the job) has not finished after 6 s" in proc.stderr + proc.stdout
    assert not (tmp_path / "stall").exists()


def test_every_start_records_its_code_and_machine(an4_manifests, tmp_path):
    """provenance.jsonl: one line per start or resume with the commit, CPU, dispatch, libraries, host and
    ranks; the log header says the same."""
    import json
    import socket

    import torch

    from sparse_asr.training.runtime import cpu_model

    overrides = tiny_overrides(an4_manifests, tmp_path, "prov", train__epochs=1)
    proc = train_cli(["--config", str(SMOKE_CONFIG), *overrides])
    assert proc.returncode == 0, proc.stderr
    proc = train_cli(["--resume", str(tmp_path / "prov"), "train.epochs=2"])
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in (tmp_path / "prov" / "provenance.jsonl").read_text().splitlines()]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    assert len(records) == 2
    for record in records:
        assert record["code"]["commit"] == head and isinstance(record["code"]["modified"], bool)
        assert (record["host"], record["ranks"], record["cpu"]) == (socket.gethostname(), 1, cpu_model())
        assert (record["torch"] == torch.__version__
                and record["cpu_dispatch"] == torch.backends.cpu.get_cpu_capability())
        assert record["mpi4py"] and record["python"]
    assert f"provenance: code {head[:12]}" in proc.stdout
    # the console gets the settings a reader checks first in one line; every setting is in the run's config.yaml
    config_lines = [line for line in proc.stdout.splitlines() if line.startswith("config: ")]
    assert config_lines == [f"config: model lstman4_tiny, dense, global batch 4, lr 0.0003, 2 epochs, seed 1 "
                            f"(every setting: {tmp_path / 'prov' / 'config.yaml'})"], proc.stdout
    assert "train_manifest" not in proc.stdout and "train_manifest" in (tmp_path / "prov" / "config.yaml").read_text()
    done = [line for line in proc.stdout.splitlines() if line.startswith("done: ")]
    assert len(done) == 1 and " test wer " in done[0] and done[0].endswith("  (greedy decoding)"), done  # named


def test_inputs_named_up_front(tmp_path):
    """Each refused with one line naming the value, file or option, before anything runs."""
    import json

    import numpy as np
    import soundfile

    from sparse_asr.comm import Communicator
    from sparse_asr.data.audio import AudioError, audio_frames
    from sparse_asr.training.checkpoint import INDEX, CheckpointError, read_index
    from sparse_asr.training.config import ConfigError, load_config
    from tests.test_checkpoint import make_state
    from sparse_asr.training.checkpoint import save_training_state

    short = tmp_path / "short.wav"  # 0.01 s: passed the header check, then died at the first batch
    soundfile.write(short, np.zeros(160, dtype=np.int16), 16000)
    with pytest.raises(AudioError, match=rf"{short}: 160 samples \(0.010 s\), shorter than one 20 ms analysis window"):
        audio_frames(short)
    for seed in (-1, 2**32):
        with pytest.raises(ConfigError, match=r"seed.*must be in \[0, 4294967295\]"):
            load_config(SMOKE_CONFIG, [f"seed={seed}"])
    assert load_config(SMOKE_CONFIG, [f"seed={2**32 - 1}"]).seed == 2**32 - 1
    proc = subprocess.run([sys.executable, "evaluate.py", str(tmp_path), "--manifest", "x.csv", "--batch-size", "0"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "argument --batch-size: invalid integer >= 1 value: '0'" in proc.stderr, proc.stderr
    directory = save_training_state(Communicator(), tmp_path / "checkpoints", make_state(3))
    index = json.loads((directory / INDEX).read_text())
    index["step"] = 1000  # edited, and its own digest deleted to pass
    del index["index_sha256"]
    (directory / INDEX).write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="lacks its own SHA-256"):
        read_index(directory)


def test_six_faults_of_six_kinds_in_one_error(an4_manifests, tmp_path):
    """A manifest with a wrong field count, a bad duration, a bad transcript, a repeated
    utterance, a missing file and a too-short file took four runs to surface; now one error names all six, and
    the run directory is not created. A header-only dev manifest is refused; a long utterance is named."""
    import numpy as np
    import soundfile

    from sparse_asr.data.manifest import read_manifest, write_manifest

    df = read_manifest(an4_manifests / "an4_train.csv").head(12).copy()
    short = tmp_path / "short.wav"
    soundfile.write(short, np.zeros(100, dtype=np.int16), 16000)
    df.loc[2, "transcript"] = "NO 7"
    df.loc[3, "utt_id"] = df.loc[1, "utt_id"]
    df.loc[4, "audio"] = str(tmp_path / "gone.wav")
    df.loc[5, "audio"], df.loc[5, "duration"] = str(short), 100 / 16000
    write_manifest(df, tmp_path / "train.csv")
    lines = (tmp_path / "train.csv").read_text().splitlines()
    lines[7] = lines[7].replace(",", ",,", 1)  # line 8: one field too many
    lines[8] = lines[8].split(",")[0] + ",abc," + ",".join(lines[8].split(",")[2:])  # line 9: duration 'abc'
    (tmp_path / "train.csv").write_text("\n".join(lines) + "\n")
    overrides = tiny_overrides(an4_manifests, tmp_path, "six", data__train_manifest=tmp_path / "train.csv",
                               data__max_train_utterances=0)
    proc = train_cli(["--config", str(SMOKE_CONFIG), *overrides])
    assert proc.returncode != 0 and "6 manifest rows cannot be used (4 as written, 2 by their audio)" in proc.stderr, \
        proc.stderr
    for line, what in ((4, "character '7'"), (5, "is also on line 3"), (6, "gone.wav: file does not exist"),
                       (7, "shorter than one 20 ms analysis window"), (8, "expected 5 fields"),
                       (9, "duration 'abc' is not a number")):
        assert f"train.csv:{line}" in proc.stderr and what in proc.stderr, (line, what, proc.stderr)
    assert not (tmp_path / "six").exists()

    (tmp_path / "dev.csv").write_text((an4_manifests / "an4_dev.csv").read_text().splitlines()[0] + "\n")
    proc = train_cli(["--config", str(SMOKE_CONFIG), *tiny_overrides(an4_manifests, tmp_path, "nodev",
                                                                     data__dev_manifest=tmp_path / "dev.csv")])
    assert proc.returncode != 0 and "dev.csv holds no utterances" in proc.stderr, proc.stderr
