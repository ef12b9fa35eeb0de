"""A run directory holds one run. A new run refuses to start in a directory holding a previous run's
files (it would overwrite its checkpoints and config and append to its curves), unless it resumes that
run or is asked to replace it (train.py --overwrite). And one job at a time works in it: RunDirLock."""
from __future__ import annotations

import errno
import fcntl
import os
import shutil
import socket
import time
from pathlib import Path

import yaml

from sparse_asr.fileio import (RECORD_BYTES, UnsafePathError, check_directory, check_writable_file, open_no_follow,
                               read_text, trusted_path)

# what train.py writes, besides the event files
RUN_FILES = ("config.yaml", "metrics.jsonl", "checkpoints", "provenance.jsonl")
EVENT_FILES = "events.out.tfevents.*"


def previous_run(run_dir: str | Path) -> list[Path]:
    """The files and directories of a previous run in `run_dir` (none when it does not exist)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    return [run_dir / name for name in RUN_FILES if os.path.lexists(run_dir / name)] + sorted(run_dir.glob(EVENT_FILES))


def previous_run_message(run_dir: str | Path) -> str | None:
    """Why a new run may not start in `run_dir` (it holds a previous run, or is not a directory), or None."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        return f"run directory {run_dir} exists and is not a directory"
    found = previous_run(run_dir)
    if not found:
        return None
    names = ", ".join(p.name for p in found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
    return (f"run directory {run_dir} holds a previous run ({names}): choose another name=, continue that run "
            f"with --resume, or replace it with --overwrite")


def run_paths_problem(run_dir: str | Path) -> str | None:
    """Why a run may not write in `run_dir`, or None: checked before it writes anything (a refusal then leaves no
    half-started run). The directory is reached through trusted links only (fileio.trusted_path: a link in a
    directory others can write is refused), checkpoints/ is a directory if it exists (a dangling link would fail
    only at the first save, an epoch in), and no file the run writes is a link, FIFO or directory."""
    run_dir = Path(run_dir)
    try:
        check_directory(run_dir, "run directory")
        check_directory(run_dir / "checkpoints", "checkpoint directory")
        for name in ("config.yaml", "metrics.jsonl", "provenance.jsonl"):
            check_writable_file(run_dir / name)
    except UnsafePathError as e:
        return str(e)
    return None


def overwrite_problem(run_dir: str | Path, name: str) -> str | None:
    """Why --overwrite may not delete the previous run in `run_dir`, or None. Only what the run's own files prove
    is run `name` is deleted: its config.yaml (a regular file, not a link) must name it. A directory another run's
    files sit in (runs/NAME linked to runs/OTHER) is left alone."""
    if not previous_run(run_dir):
        return None
    config = Path(run_dir) / "config.yaml"
    try:
        saved = yaml.safe_load(read_text(config, RECORD_BYTES, "run config", follow=False))
        saved_name = saved.get("name") if isinstance(saved, dict) else None
    except FileNotFoundError:
        return (f"--overwrite: {run_dir} holds a run's files but no config.yaml saying which run they are; "
                f"refusing to delete them (delete them yourself if they are yours)")
    except (OSError, yaml.YAMLError) as e:
        return f"--overwrite: cannot tell which run {run_dir} holds ({e}); refusing to delete it"
    if saved_name != name:
        return (f"--overwrite: {run_dir} (which is {trusted_path(run_dir)}) holds run {saved_name!r} by its "
                f"config.yaml, not {name!r}; refusing to delete it")
    return None


def clear_previous_run(run_dir: str | Path) -> tuple[Path, list[Path]]:
    """Delete a previous run's files from `run_dir` (only those: anything else the user put there stays; a link
    among them is removed, never what it points at); returns the directory they were deleted from (links
    resolved) and what was deleted."""
    real = trusted_path(run_dir)
    found = previous_run(real)
    for path in found:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    return real, found


class RunDirLock:
    """Collective: an exclusive lock on a run directory, held by rank 0 for the job's life, so that a second
    job (a chained batch job submitted twice, `--resume auto` started beside a running job) is refused
    instead of training beside the first in the same directory (its checkpoints and metrics would
    interleave). An flock on RUN_DIR/.lock: the kernel releases it when the holder dies, however it dies,
    so a lock file a dead job left behind is recognised as stale and taken over. The file names the holder
    (host, PID, start time) for the refusal. On file systems without working flock across hosts (some NFS
    mounts) it only excludes jobs on the same host."""

    NAME = ".lock"

    def __init__(self, run_dir: str | Path, comm):
        self.path, self.comm, self.fd = Path(run_dir) / self.NAME, comm, None
        self.created_dirs: list[Path] = []  # deepest first: a refused start leaves no empty directories behind

    def acquire(self) -> None:
        """Take the lock (creating the run directory), or raise FileExistsError naming the holder (OSError
        naming the file if it cannot be taken) on every rank."""
        refusal = None
        if self.comm.rank == 0:
            try:
                refusal = self._take()
            except UnsafePathError as e:
                refusal = e
            except OSError as e:
                refusal = OSError(e.errno, f"cannot take the lock {self.path}: {e.strerror or e}")
            if refusal:  # (a full disk at the lock file) a refused start leaves no empty directories behind
                self._remove_created_dirs()
        refusal = self.comm.bcast_object(refusal)
        if isinstance(refusal, OSError):
            raise refusal
        if refusal:
            raise FileExistsError(refusal)

    def _take(self) -> str | None:
        """Rank 0: lock RUN_DIR/.lock and write the holder into it; the refusal message if another job holds it."""
        # the run directory through trusted links only: a runs/NAME link planted in a shared runs/ is refused
        self.path = trusted_path(self.path.parent) / self.NAME
        run_dir = self.path.parent
        if run_dir.exists() and not run_dir.is_dir():
            return f"run directory {run_dir} exists and is not a directory"
        missing = run_dir
        while not missing.exists():
            self.created_dirs.append(missing)
            missing = missing.parent
        while True:
            self.path.parent.mkdir(parents=True, exist_ok=True)  # again after a job that created it removed it
            fd = open_no_follow(self.path)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                    os.close(fd)
                    raise
                holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "an unknown job"
                os.close(fd)
                return (f"run directory {self.path.parent} is in use by {holder} (it holds {self.path}): "
                        f"one job at a time per run directory; wait for it to end, or choose another name=")
            # A job ending unlinks the file while it still holds the lock: if we locked that unlinked
            # inode (or one replaced since we opened it), the lock guards nothing; open the path again.
            try:
                current = os.stat(self.path, follow_symlinks=False)
            except FileNotFoundError:
                current = None
            mine = os.fstat(fd)
            if current is None or (current.st_dev, current.st_ino) != (mine.st_dev, mine.st_ino):
                os.close(fd)
                continue
            break
        try:
            os.ftruncate(fd, 0)
            holder = (f"the job on host {socket.gethostname()}, PID {os.getpid()}, started "
                      f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n").encode()
            if os.pwrite(fd, holder, 0) != len(holder):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError:  # a full disk: leave no empty lock file behind
            self.path.unlink(missing_ok=True)
            os.close(fd)
            raise
        self.fd = fd
        return None

    def release(self) -> None:
        if self.fd is not None:
            self.path.unlink(missing_ok=True)  # still holding the lock: a job that opened it now sees it is gone
            os.close(self.fd)  # (closing releases the flock)
            self.fd = None
            self._remove_created_dirs()

    def _remove_created_dirs(self) -> None:
        for directory in self.created_dirs:  # only where the job wrote nothing (rmdir removes only empty ones)
            try:
                directory.rmdir()
            except OSError:
                break
        self.created_dirs = []
