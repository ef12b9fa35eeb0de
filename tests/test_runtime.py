"""How a job ends when something goes wrong: one line per failing rank (a traceback only for what is not a
user's error), the audio check shared among ranks, and the watchdog that ends a job whose rank stopped."""
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from sparse_asr.data.manifest import read_manifest, write_manifest
from sparse_asr.training.runtime import Watchdog
from tests.mpi_helpers import REPO, run_mpi

ERROR_MODULE = ["-m", "tests.mpi.raise_error"]


def run_python(args, env=None, **kw):
    return subprocess.run([sys.executable, *args], cwd=REPO, env={**os.environ, **(env or {})}, capture_output=True,
                          text=True, timeout=120, **kw)


@pytest.mark.tooling
def test_a_user_error_is_one_line_without_traceback():
    proc = run_python(ERROR_MODULE + ["config"], {"SPARSE_ASR_TRACEBACK": ""})
    assert proc.returncode == 1
    assert proc.stderr == "ConfigError: cfg.yaml: train.epochs must be >= 1, got 0\n"  # one process: no "rank 0: "
    proc = run_python(ERROR_MODULE + ["missing"], {"SPARSE_ASR_TRACEBACK": ""})
    assert proc.stderr == "FileNotFoundError: checkpoint runs/x/last.pt does not exist\n"
    proc = run_python(ERROR_MODULE + ["refused"], {"SPARSE_ASR_TRACEBACK": ""})  # a refused path: no stack after it
    assert proc.stderr == "UnsafePathError: runs/x/metrics.jsonl is a symbolic link; refusing to follow it\n"


@pytest.mark.tooling
def test_a_bug_or_traceback_requested_prints_the_traceback():
    proc = run_python(ERROR_MODULE + ["bug"], {"SPARSE_ASR_TRACEBACK": ""})
    assert proc.returncode == 1
    assert proc.stderr.startswith("RuntimeError: something unexpected\nTraceback (most recent call last):")
    proc = run_python(ERROR_MODULE + ["config"], {"SPARSE_ASR_TRACEBACK": "1"})
    assert proc.stderr.startswith("ConfigError: cfg.yaml: train.epochs must be >= 1, got 0\nTraceback")


@pytest.mark.mpi
def test_a_user_error_on_every_rank_is_printed_once_on_its_own_line():
    """Both ranks fail alike at once (a bad config): rank 0 prints its one line and ends the job; the other
    rank waits before printing, so its copy never appears, and no line is glued to another. No traceback."""
    proc = run_mpi(2, ERROR_MODULE + ["config"], timeout=120, env={"SPARSE_ASR_TRACEBACK": ""})
    assert proc.returncode != 0
    lines = re.findall(r"^rank (\d+): ConfigError: cfg\.yaml: train\.epochs must be >= 1, got 0$", proc.stderr,
                       flags=re.MULTILINE)
    assert lines == ["0"], proc.stderr
    assert len(re.findall(r"rank \d+: ", proc.stderr)) == 1, proc.stderr  # no other per-rank message
    assert "Traceback" not in proc.stderr


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [1, 2, 3])
def test_audio_check_is_shared_among_ranks_and_every_rank_raises(nprocs, tiny_manifest, tmp_path):
    df = read_manifest(tiny_manifest)
    df.loc[2, "audio"], df.loc[5, "audio"] = str(tmp_path / "gone.sph"), str(tmp_path)
    write_manifest(df, tmp_path / "train.csv")
    first = "2 of 16 manifest rows have audio that cannot be used (checked before training):"
    proc = run_mpi(nprocs, ["-m", "tests.mpi.audio_check", str(tmp_path / "train.csv"), str(tiny_manifest), first],
                   timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[:3] == [first, f"  {tmp_path / 'train.csv'}:4: {tmp_path / 'gone.sph'}: file does "
                                                   f"not exist", f"  {tmp_path / 'train.csv'}:7: {tmp_path}: not a "
                                                                 f"regular file"]
    assert f"P={nprocs}: shares" in proc.stdout


class FakeComm:
    """What the watchdog reads (rank, in_flight) and calls (abort), without MPI."""

    rank = 0

    def __init__(self):
        self.in_flight = None
        self.aborted = threading.Event()

    def abort(self, code):
        self.aborted.set()


@pytest.mark.unit
def test_watchdog_fires_when_one_call_waits_too_long(capsys):
    comm = FakeComm()
    comm.in_flight = ("Allreduce", 7)
    t0 = time.monotonic()
    watchdog = Watchdog(comm, timeout_s=0.5)
    assert comm.aborted.wait(10)
    assert 0.5 <= time.monotonic() - t0 < 5
    watchdog.stop()
    assert re.fullmatch(r"rank 0: watchdog: MPI Allreduce has waited \d+ s \(distributed\.timeout_s=0\.5\): another "
                        r"rank is stopped, hung or dead; aborting the job\n", capsys.readouterr().err)


@pytest.mark.unit
def test_watchdog_never_fires_on_a_slow_but_moving_run():
    """Many calls, each shorter than the timeout, and long stretches without any call (computing): the
    run as a whole takes several timeouts and the watchdog stays quiet."""
    comm = FakeComm()
    watchdog = Watchdog(comm, timeout_s=0.5)
    for call in range(8):
        comm.in_flight = ("Allreduce", call)
        time.sleep(0.3)
        comm.in_flight = None
        time.sleep(0.3 if call % 2 else 0.8)
    watchdog.stop()
    assert not comm.aborted.is_set()


@pytest.mark.unit
def test_watchdog_does_not_count_time_this_process_was_stopped():
    """A whole job suspended (SIGSTOP) and resumed (SIGCONT) must not be aborted for the time it was stopped."""
    script = ("import sys, time\n"
              "from tests.test_runtime import FakeComm\n"
              "from sparse_asr.training.runtime import Watchdog\n"
              "comm = FakeComm()\n"
              "comm.in_flight = ('Allreduce', 1)\n"
              "watchdog = Watchdog(comm, timeout_s=2.0)\n"
              "print('ready', flush=True)\n"
              "sys.stdin.readline()\n"
              "comm.in_flight = None\n"
              "time.sleep(0.5)\n"
              "print('aborted' if comm.aborted.is_set() else 'survived', flush=True)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGSTOP)
        time.sleep(4)  # twice the timeout
        proc.send_signal(signal.SIGCONT)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "survived\n"
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.mpi
@pytest.mark.parametrize("when", ["training", "startup"])
def test_a_stopped_rank_ends_the_job_with_the_watchdog(an4_manifests, tmp_path, when):
    """A rank stopped (SIGSTOP) at optimizer step 2, or before the job's first collective while it starts up."""
    proc = run_mpi(2, ["-m", "tests.mpi.train_stall", str(an4_manifests), str(tmp_path), "3",
                       *(["startup"] if when == "startup" else [])], timeout=120)
    ended = time.time()
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert re.search(r"rank 0: watchdog: MPI \w+ has waited \d+ s \(distributed\.timeout_s=3\): another rank is "
                     r"stopped, hung or dead; aborting the job", proc.stderr), proc.stderr
    assert "finished normally" not in proc.stdout
    stopped = float(re.search(r"STOPPING (\d+\.\d+)", proc.stderr).group(1))
    assert ended - stopped < 15, f"the job took {ended - stopped:.1f} s to end after the stop (timeout 3 s)"


def assert_ended_soon_after_the_stop(proc, message: str, timeout_s: float):
    ended = time.time()
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert re.search(message, proc.stderr), proc.stderr
    assert "finished normally" not in proc.stdout
    stopped = float(re.search(r"STOPPING (\d+\.\d+)", proc.stderr).group(1))
    assert ended - stopped < timeout_s + 12, f"the job took {ended - stopped:.1f} s to end after the stop"


@pytest.mark.mpi
def test_a_rank_stopped_after_the_run_is_done_ends_the_job_instead_of_hanging_at_exit(an4_manifests, tmp_path):
    """train.py under mpiexec: rank 1 stops after rank 0 printed done:; the job's last MPI calls (a final barrier,
    MPI_Finalize) are watched like its first, so it ends in timeout_s instead of waiting in MPI_Finalize."""
    from tests.mpi.train_common import SMOKE_CONFIG, tiny_overrides

    overrides = tiny_overrides(an4_manifests, tmp_path, "exit", train__epochs=1, distributed__timeout_s=3,
                               data__max_train_utterances=8, train__global_batch_size=8)
    proc = run_mpi(2, ["-m", "tests.mpi.stop_at_exit", "train-done", "--config", str(SMOKE_CONFIG), *overrides],
                   timeout=180)
    assert "done: " in proc.stdout, proc.stdout + proc.stderr
    assert_ended_soon_after_the_stop(proc, r"rank 0: watchdog: MPI Barrier has waited \d+ s \(distributed\.timeout_s"
                                           r"=3\)|MPI_Finalize \(every rank leaving the job\) has not finished", 3)


@pytest.fixture(scope="module")
def trained_run(an4_manifests, tmp_path_factory):
    """A 1-epoch run for evaluate.py to score, trained once for the tests below (their xdist group: one worker)."""
    from tests.mpi.train_common import run_training, tiny_overrides

    out = tmp_path_factory.mktemp("trained")
    run_training(tiny_overrides(an4_manifests, out, "run", train__epochs=1, data__max_train_utterances=8,
                                train__global_batch_size=8))
    return out / "run"


@pytest.mark.mpi
@pytest.mark.xdist_group("trained_run")
@pytest.mark.parametrize("when", ["startup", "scoring"])
def test_evaluate_under_mpiexec_ends_when_a_rank_stops(trained_run, an4_manifests, when):
    """evaluate.py has training's start-up guard (a rank stopped before MPI_Init) and watchdog (one stopped while
    the manifest is scored)."""
    proc = run_mpi(2, ["-m", "tests.mpi.stop_at_exit", f"evaluate-{when}", str(trained_run), "--manifest",
                       str(an4_manifests / "an4_dev.csv"), "--timeout-s", "3"], timeout=180)
    message = (r"MPI start-up \(MPI_Init: every rank joining the job\) has not finished after 3 s" if when == "startup"
               else r"rank 0: watchdog: MPI \w+ has waited \d+ s \(distributed\.timeout_s=3\)")
    assert_ended_soon_after_the_stop(proc, message, 3)


def doctored_checkpoint(run_dir, out, change):
    """A copy of the run's last checkpoint with one model tensor changed by `change` (saved properly: index and
    digests match, as a crafted checkpoint's would)."""
    from sparse_asr.comm import Communicator
    from sparse_asr.training.checkpoint import load_training_state, save_training_state

    comm = Communicator()
    state = load_training_state(comm, run_dir)
    name = next(k for k, v in state.model.items() if v.is_floating_point())
    state.model[name] = change(state.model[name].clone())
    return save_training_state(comm, out / "checkpoints", state), name


@pytest.mark.mpi
@pytest.mark.xdist_group("trained_run")
@pytest.mark.parametrize("change, says", [
    (lambda t: t.to(dtype=__import__("torch").int64), r"is torch\.int64, this run's is torch\.float32"),
    (lambda t: t[:1], r"has shape \(1, .*\), this run's has"),
    (lambda t: t.fill_(float("nan")), r"holds NaN or infinite values")])
def test_evaluate_refuses_a_checkpoint_that_does_not_fit_in_one_line_naming_the_tensor(trained_run, an4_manifests,
                                                                                       tmp_path, change, says):
    directory, name = doctored_checkpoint(trained_run, tmp_path, change)
    proc = run_python(["evaluate.py", str(directory), "--manifest", str(an4_manifests / "an4_dev.csv")],
                      {"SPARSE_ASR_TRACEBACK": ""})
    assert proc.returncode == 1
    assert re.fullmatch(rf"CheckpointError: cannot evaluate {directory}: the checkpoint's model state .*"
                        rf"{re.escape(name)} {says}.*\n", proc.stderr), proc.stderr


@pytest.mark.mpi
@pytest.mark.xdist_group("trained_run")
def test_evaluate_names_a_manifests_row_faults_and_audio_faults_together(trained_run, tiny_manifest, tmp_path):
    df = read_manifest(tiny_manifest)
    rows = [[a, str(d), t, u, s] for a, d, t, u, s in zip(df["audio"], df["duration"], df["transcript"], df["utt_id"],
                                                            df["speaker"])]
    rows[1][0] = str(tmp_path / "gone.wav")  # line 3: its audio is missing
    rows[2][1] = "long"  # line 4: a row fault
    (tmp_path / "m.csv").write_text("audio,duration,transcript,utt_id,speaker\n" + "".join(",".join(r) + "\n"
                                                                                         for r in rows))
    proc = run_python(["evaluate.py", str(trained_run), "--manifest", str(tmp_path / "m.csv")],
                      {"SPARSE_ASR_TRACEBACK": ""})
    assert proc.returncode == 1
    assert "m.csv:4: duration 'long' is not a number" in proc.stderr, proc.stderr
    assert f"m.csv:3: {tmp_path / 'gone.wav'}: file does not exist" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
