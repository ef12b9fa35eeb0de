"""The one way a job opens a file it touches (docs/files.md lists them all). Run directories, checkpoints and
data directories sit on shared file systems, where another user may plant a link or a FIFO, or hand over a
file of any size:

    atomic_write(path, write)      a whole file: temporary file beside it, fsync, rename (a link at its name is
                                   replaced, never followed)
    open_append(path)              a log kept open (metrics.jsonl, provenance.jsonl): O_NOFOLLOW, regular only
    open_no_follow(path)           a lock file
    read_bytes / read_text(path, limit)   a whole text file: regular files only (a FIFO or device is refused
                                   without waiting on it), at most `limit` bytes
    trusted_path(path)             the path with its links resolved, each one checked by link_problem: a link is
                                   followed only in a directory its owner alone can write (people do link runs/
                                   to scratch space), never one in a directory others can write
    check_writable_file, check_directory   the refusals a run needs before it writes anything
"""
from __future__ import annotations

import errno
import os
import stat
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
    trusted_path(path.parent).mkdir(parents=True, exist_ok=True)
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
            raise UnsafePathError(f"{path} is a symbolic link; refusing to follow it") from None
        raise


# ------------------------------------------------------------------------------ paths others could plant
# Size bounds of the text files a job reads whole (a link to /dev/zero or a huge file must not fill memory).
CONFIG_BYTES = 1 << 20  # a config file or one of its includes
MANIFEST_BYTES = 256 << 20  # a manifest (LibriSpeech's 960 h: about 40 MB)
TRANSCRIPT_BYTES = 1 << 20  # a legacy manifest's .txt, AN4's transcription and file lists
INDEX_BYTES = 16 << 20  # a checkpoint's index.json (its config included)
RECORD_BYTES = 1 << 20  # small records a job keeps beside its data (the extraction record, a run's config.yaml)


class UnsafePathError(OSError):
    """A path refused before it is used (a link someone else could have planted, a FIFO or device where a file
    belongs, a file over its size bound): the message names it and says all there is to say."""

    def __init__(self, message: str):
        super().__init__(errno.EPERM, message)

    def __str__(self) -> str:
        return self.strerror


def link_problem(link: Path, st: os.stat_result) -> str | None:
    """Why the symbolic link `link` (its lstat `st`) may not be followed, or None. The reasoning of the kernel's
    protected_symlinks rule, stricter: a link is followed when the directory holding it is writable by its owner
    alone and the link belongs to this user or to that owner (who could change the directory anyway); a link in
    a directory others can write (a shared runs/ or data directory) could have been planted by any of them."""
    parent = os.stat(link.parent)
    if parent.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{link} is a symbolic link in {link.parent}, a directory others can write; refusing to follow it"
    if st.st_uid not in (os.geteuid(), parent.st_uid):
        return f"{link} is a symbolic link owned by another user (uid {st.st_uid}); refusing to follow it"
    return None


def trusted_path(path: str | Path, follow_last: bool = True, _depth: int = 0) -> Path:
    """`path` made absolute with every symbolic link on the way resolved, each one checked by link_problem
    (UnsafePathError naming it). Parts that do not exist yet are kept as written. With follow_last=False a link
    as the last part is refused whoever owns it (a file a job writes is never reached through a link)."""
    if _depth > 40:
        raise UnsafePathError(f"{path}: too many levels of symbolic links")
    parts = Path(os.path.abspath(path)).parts
    current = Path(parts[0])
    for i, part in enumerate(parts[1:], start=1):
        candidate = current / part
        try:
            st = os.lstat(candidate)
        except (FileNotFoundError, NotADirectoryError):
            return current.joinpath(*parts[i:])
        if not stat.S_ISLNK(st.st_mode):
            current = candidate
            continue
        if not follow_last and i == len(parts) - 1:
            raise UnsafePathError(f"{candidate} is a symbolic link; refusing to follow it (a file a job writes "
                                  f"or reads in its run is never a link)")
        problem = link_problem(candidate, st)
        if problem:
            raise UnsafePathError(problem)
        current = trusted_path(current / os.readlink(candidate), True, _depth + 1)
    return current


def open_regular(path: str | Path, what: str = "file", follow: bool = True) -> BinaryIO:
    """`path` opened for reading: a regular file only, reached through trusted links only (trusted_path; with
    follow=False no link at its name at all). A FIFO, device or directory is refused without waiting on it
    (opened non-blocking, then fstat). UnsafePathError naming the path; FileNotFoundError when it is missing."""
    real = trusted_path(path, follow_last=follow)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise FileNotFoundError(f"{what} {path} does not exist") from None
        if e.errno == errno.ELOOP:  # replaced by a link since trusted_path looked
            raise UnsafePathError(f"{what} {path} became a symbolic link while being opened; refusing it") from None
        raise OSError(e.errno, f"cannot read {what} {path}: {e.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UnsafePathError(f"{what} {path} is not a regular file (it is a {file_kind(st.st_mode)}); "
                              f"refusing to read it")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_bytes(path: str | Path, limit: int, what: str = "file", follow: bool = True) -> bytes:
    """The content of the regular file `path` (open_regular), at most `limit` bytes: a larger one is refused
    (UnsafePathError naming it) before it is read, and again while reading (/proc files report size 0)."""
    with open_regular(path, what, follow) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise UnsafePathError(f"{what} {path} has {size} bytes, more than the {limit} a {what} may have")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise UnsafePathError(f"{what} {path} holds more than the {limit} bytes a {what} may have")
    return data


def read_text(path: str | Path, limit: int, what: str = "file", follow: bool = True) -> str:
    """read_bytes as UTF-8 text; a byte that is not UTF-8 is refused naming the file, line and byte."""
    data = read_bytes(path, limit, what, follow)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise UnsafePathError(f"{what} {path}:{line}: not UTF-8 text (byte {data[e.start]:#04x})") from None


def file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket"), (stat.S_ISLNK, "symbolic link")):
        if test(mode):
            return name
    return "special file"


def check_writable_file(path: str | Path, what: str = "file") -> None:
    """Refuse (UnsafePathError) a file a job is going to write when something other than a regular file sits at
    its name (a link, a FIFO, a directory): checked before the job writes anything, so a refusal leaves no
    half-started run. Its directory must be reachable through trusted links (trusted_path)."""
    path = Path(path)
    trusted_path(path.parent)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePathError(f"{what} {path} is a {file_kind(st.st_mode)}, not a regular file; refusing to write "
                              f"it (remove it, or choose another run name)")


def check_directory(path: str | Path, what: str = "directory") -> Path:
    """`path` resolved through trusted links (trusted_path); UnsafePathError when it exists and is not a
    directory (a dangling link, a file) so that a run is refused before it writes, not at its first save."""
    real = trusted_path(path)
    if os.path.lexists(path) and not real.is_dir():
        raise UnsafePathError(f"{what} {path} exists and is not a directory"
                              + (f" (a link to {real}, which does not exist)" if os.path.islink(path) else ""))
    return real


def open_append(path: str | Path) -> BinaryIO:
    """A log file opened for appending (created if missing): never through a link at its name, a regular file
    only (a FIFO there would block the job), its directory reached through trusted links."""
    path = Path(path)
    trusted_path(path.parent)
    fd = open_no_follow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UnsafePathError(f"{path} is a {file_kind(st.st_mode)}, not a regular file; refusing to write it")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "ab")
