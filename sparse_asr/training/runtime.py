"""Per-process set-up shared by train.py and evaluate.py: local rank, device, CPU threads, seeds, the
audio check before training, and the rules that an exception on any rank ends the whole job and that an
MPI call that never ends does too, with the watchdog (never a hang)."""
from __future__ import annotations

import errno
import os
import random
import socket
import subprocess
import sys
import threading
import time
import traceback

import numpy as np
import torch

from sparse_asr.comm.mpi import load_mpi
from sparse_asr.data.audio import AudioError
from sparse_asr.data.manifest import ManifestError, audio_problem
from sparse_asr.fileio import UnsafePathError
from sparse_asr.training.checkpoint import CheckpointError
from sparse_asr.training.config import MAX_TIMEOUT_S, ConfigError

LOCAL_RANK_VARIABLES = ("MPI_LOCALRANKID", "PMI_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "PALS_LOCAL_RANKID",
                        "SLURM_LOCALID")


def local_rank_and_size(comm) -> tuple[int, int]:
    """This rank's index among the ranks on its node, and how many ranks the node runs. The launcher's
    variable wins when set; otherwise ranks are grouped by host name (works with any MPI)."""
    hosts = comm.allgather_object(socket.gethostname())
    mine = hosts[comm.rank]
    local_size = hosts.count(mine)
    for name in LOCAL_RANK_VARIABLES:
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name]), local_size
    return hosts[: comm.rank].count(mine), local_size


def pick_device(requested: str, local_rank: int) -> torch.device:
    """auto: one GPU per rank by local rank when CUDA is available (if a wrapper already narrowed
    CUDA_VISIBLE_DEVICES to one GPU, local_rank % 1 = 0 picks it), else the CPU."""
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("distributed.device is 'cuda' but CUDA is not available on this node")
    device = torch.device("cuda", local_rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def cpu_model() -> str:
    """The CPU's model name as the kernel reports it (benches and error messages name the machine)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "unknown CPU"


def precision_problem(precision: str, device: torch.device) -> str | None:
    """Why `precision` cannot run on `device`, or None. bf16 on a CPU needs oneDNN's bfloat16 kernels
    (AVX-512 BW/VL/DQ or newer): without them the LSTM forward fails deep inside oneDNN ("could not create
    a primitive descriptor"), so the run is refused before it starts instead."""
    if precision != "bf16":
        return None
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return f"train.precision=bf16: the GPU {torch.cuda.get_device_name(device)} has no bfloat16 support"
    if device.type == "cpu" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return (f"train.precision=bf16: this CPU ({cpu_model()}) has no oneDNN bfloat16 kernels (they need "
                f"AVX-512), which the LSTM needs under autocast; use train.precision=fp32 here, or a GPU")
    return None


def mpi_cuda_support() -> bool | None:
    """Whether the MPI library in this process reads GPU buffers (MPIX_Query_cuda_support: MPICH and Open MPI
    define it; the pip `mpich` wheel answers 0); None when it cannot tell (no MPI, an MPI without the call)."""
    try:
        MPI = load_mpi()
    except ImportError:
        return None
    if hasattr(MPI, "Query_cuda_support"):  # mpi4py >= 4.2
        return bool(MPI.Query_cuda_support())
    import ctypes
    import re

    try:  # the libmpi mpi4py loaded: its own symbol
        with open("/proc/self/maps") as f:
            libraries = sorted(set(re.findall(r"(/\S*libmpi\S*\.so\S*)", f.read())))
        for library in libraries:
            query = getattr(ctypes.CDLL(library), "MPIX_Query_cuda_support", None)
            if query is not None:
                return bool(query())
    except OSError:
        pass
    return None


def cuda_aware_problem(cuda_aware: bool) -> str | None:
    """Why distributed.cuda_aware_mpi=true cannot work here (the MPI library has no CUDA support: the first GPU
    buffer would crash inside MPI), or None."""
    if cuda_aware and mpi_cuda_support() is False:
        from sparse_asr.training.provenance import mpi_library

        return (f"distributed.cuda_aware_mpi=true, but this MPI library ({mpi_library()}) has no CUDA support "
                f"(MPIX_Query_cuda_support() is 0): use distributed.cuda_aware_mpi=false (GPU buffers staged "
                f"through host memory), or a CUDA-aware MPI build")
    return None


def set_threads(requested: int, local_size: int) -> int:
    """CPU threads per rank: the configured number; else OMP_NUM_THREADS if the user set it; else the
    cores this process may use divided among the ranks of the node (no oversubscription)."""
    if requested:
        torch.set_num_threads(requested)
    elif not os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // local_size))
    return torch.get_num_threads()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def check_manifest_audio(comm, manifests, sample_rate: int = 16000, problems: list[str] = ()) -> int:
    """Collective, before the first step: the audio of every row of `manifests` (DataFrames from
    read_manifest) checked from its header (manifest.audio_problem), rank r taking every P-th distinct
    row. Every rank raises if any row is bad: rank 0's message lists each bad manifest line and why,
    with the manifest `problems` found while reading (then a ManifestError, else an AudioError), the
    others' point to it. Returns the number of rows checked."""
    rows = sorted({(df.attrs["manifest"], int(line), audio, float(duration)) for df in manifests
                   for line, audio, duration in zip(df["line"], df["audio"], df["duration"])})
    mine = [(manifest, line, problem) for manifest, line, audio, duration in rows[comm.rank::comm.size]
            if (problem := audio_problem(audio, duration, sample_rate)) is not None]
    audio = sorted(p for part in comm.allgather_object(mine) for p in part)
    listed = [*problems, *(f"{manifest}:{line}: {problem}" for manifest, line, problem in audio)]
    if not listed:
        return len(rows)
    error = ManifestError if problems else AudioError
    what = (f"{len(listed)} manifest rows cannot be used ({len(problems)} as written, {len(audio)} by their "
            f"audio)" if problems else f"{len(audio)} of {len(rows)} manifest rows have audio that cannot be used")
    if comm.rank == 0:
        raise error(f"{what} (checked before training):\n" + "\n".join(f"  {p}" for p in listed))
    raise error(f"{what}: rank 0 lists them")


class StartupGuard:
    """Ends this process when MPI's start-up (MPI_Init, inside Communicator()) has not finished within
    timeout_s: a rank stopped or hung before MPI is up holds every other rank there, before the Watchdog
    exists. MPI_Init holds the GIL, so no Python thread of this process could act: a small watcher process
    does, killing this one (the launcher, hydra's mpiexec or srun, then ends the whole job). disarm() once
    MPI is up; from the first collective on, the Watchdog watches. end_job guards MPI_Finalize the same way."""

    WATCHER = ("import os, select, signal, sys\n"
               "parent, timeout, message = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]\n"
               "if not select.select([sys.stdin], [], [], timeout)[0]:  # neither 'up' nor the parent's end\n"
               "    print(message, file=sys.stderr, flush=True)\n"
               "    os.kill(parent, signal.SIGKILL)\n")

    def __init__(self, timeout_s: float, what: str = "MPI start-up (MPI_Init: every rank joining the job)"):
        self.watcher = None
        if 0 < timeout_s <= MAX_TIMEOUT_S:
            message = (f"PID {os.getpid()} on {socket.gethostname()}: {what} has not finished after {timeout_s:g} "
                       f"s (distributed.timeout_s): a rank is stopped, hung or dead; ending the job")
            self.watcher = subprocess.Popen([sys.executable, "-c", self.WATCHER, str(os.getpid()), str(timeout_s),
                                             message], stdin=subprocess.PIPE, close_fds=True)

    def disarm(self) -> None:
        if self.watcher is not None:
            self.watcher.stdin.close()  # EOF: the watcher exits
            self.watcher.wait()
            self.watcher = None


def end_job(comm, timeout_s: float) -> None:
    """Collective, a job's last MPI calls, guarded like its first: a barrier under the Watchdog (a rank stopped or
    gone after the work is done ends the job in timeout_s instead of holding the others at exit), then
    MPI_Finalize under a watcher process (StartupGuard: Finalize holds the GIL), for a rank lost between the
    barrier and Finalize. Without it a job whose results were printed could hang in MPI_Finalize forever."""
    if comm.size == 1 or not timeout_s:
        return
    watchdog = Watchdog(comm, timeout_s)
    try:
        run_or_abort(comm, comm.barrier)
    finally:
        watchdog.stop()
    MPI = load_mpi()
    guard = StartupGuard(timeout_s, "MPI_Finalize (every rank leaving the job)")
    if MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.Finalize()
    guard.disarm()


class Watchdog:
    """Ends the whole MPI job when one MPI call of `comm` has waited `timeout_s` seconds: a rank that is
    stopped (SIGSTOP), hung or dead would otherwise hold every other rank in a collective forever. A
    daemon thread reads the communicator's heartbeat (comm.in_flight) every timeout_s / 10 seconds (at
    most 1 s). Time this process itself spent stopped does not count (the thread's own sleep then
    overran), so a job suspended and resumed as a whole is not aborted."""

    def __init__(self, comm, timeout_s: float):
        self.comm, self.timeout_s = comm, timeout_s
        self.poll_s = min(1.0, timeout_s / 10)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.watch, name="watchdog", daemon=True)
        self.thread.start()

    def watch(self) -> None:
        waited, watched, tick = 0.0, None, time.monotonic()
        while not self.stopped.wait(self.poll_s):
            now = time.monotonic()
            elapsed, tick = min(now - tick, 2 * self.poll_s), now
            call = self.comm.in_flight
            if call is None or call != watched:
                waited, watched = 0.0, call
                continue
            waited += elapsed
            if waited >= self.timeout_s:
                print(f"rank {self.comm.rank}: watchdog: MPI {call[0]} has waited {waited:.0f} s "
                      f"(distributed.timeout_s={self.timeout_s:g}): another rank is stopped, hung or dead; "
                      f"aborting the job", file=sys.stderr, flush=True)
                time.sleep(1.0)  # let the launcher forward the message before MPI_Abort
                self.comm.abort(1)
                return

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join()


# Errors whose message says all a user needs (the file, line or key, and what is wrong): printed without
# a traceback unless SPARSE_ASR_TRACEBACK=1. Anything else is a bug or an environment problem: traceback.
USER_ERRORS = (ConfigError, ManifestError, AudioError, CheckpointError, FileNotFoundError, FileExistsError,
               UnsafePathError, KeyboardInterrupt)
# A disk or file system that refuses a write: the message names the file and the cause, no bug behind it.
STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EFBIG)


def is_user_error(e: BaseException) -> bool:
    return isinstance(e, USER_ERRORS) or (isinstance(e, OSError) and e.errno in STORAGE_ERRNOS)


def run_or_abort(comm, fn, *args):
    """Run fn(*args); any exception on any rank prints `rank R: <type>: <message>` to stderr (with a
    traceback unless it is one of USER_ERRORS), then aborts the MPI job so the other ranks (possibly
    inside a collective) end too. A user error (a bad config, manifest, checkpoint) is usually the same on
    every rank: the other ranks wait before printing theirs, so rank 0's abort leaves one copy, not P."""
    try:
        return fn(*args)
    except BaseException as e:  # noqa: BLE001 -- including KeyboardInterrupt: the job must end
        if isinstance(e, SystemExit) and not e.code:
            raise
        user_error = is_user_error(e) and os.environ.get("SPARSE_ASR_TRACEBACK") != "1"
        if user_error and comm.rank != 0:
            time.sleep(3.0)  # rank 0, if it failed alike, has aborted the job by now
        # "rank R: " says which rank failed when there are several; one process needs no such prefix
        message = (f"rank {comm.rank}: " if comm.size > 1 else "") + type(e).__name__ + (f": {e}" if str(e) else "")
        if not user_error:
            message += "\n" + "".join(traceback.format_exception(e)).rstrip()
        os.write(2, (message + "\n").encode())  # one write: two ranks' lines never merge into one
        sys.stderr.flush()
        if comm.size > 1:
            time.sleep(1.0)  # let the launcher forward this message before MPI_Abort tears the job down
        comm.abort(1)
