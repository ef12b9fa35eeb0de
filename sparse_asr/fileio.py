"""The one way this project writes a file that others may read: atomically; and the one way it opens a file in
a shared place that it keeps open (a lock, an appended log): never through a planted symlink."""
from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable


def atomic_write(path: str | Path, write: Callable[[BinaryIO], None]) -> None:
    """Call `write(f)` on a temporary file beside `path`, fsync it, then rename it over `path`: readers
    see the old file or the complete new one, never half a file. On any failure (a full disk, a kill
    signal turned into an exception) the temporary file is removed, the old file is kept, and the error
    names the path. The file gets the permissions any new file gets (0666 less the umask), so a shared
    project allocation's group can read runs, checkpoints and manifests."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~current_umask())  # mkstemp's 0600 would hide the file from the group
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except Exception as e:  # noqa: BLE001 -- torch.save turns a failed write into a RuntimeError
        cause = os_error_in(e)
        if cause is None:
            raise
        raise OSError(cause.errno, f"could not write {path}: {cause.strerror or cause}") from e
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def os_error_in(error: BaseException) -> OSError | None:
    """The OSError behind `error` (itself, or what it was raised from or during), e.g. the ENOSPC under
    torch.save's 'unexpected pos' RuntimeError; None if there is none."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OSError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def current_umask() -> int:
    """The process's umask (reading it means setting it: set it straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def fsync_dir(path: str | Path) -> None:
    """Make the renames and new names inside directory `path` durable (a crash after this keeps them)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_no_follow(path: str | Path, flags: int = os.O_RDWR | os.O_CREAT) -> int:
    """os.open(path, flags) that refuses a symlink at `path` (another user may have planted one to make us
    write through it) and never truncates what is there; returns the descriptor (closed on exec). Raises
    OSError naming the path."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OSError(e.errno, f"{path} is a symbolic link; refusing to follow it") from None
        raise
