"""Checkpoints: the training state of a run, one directory per checkpoint, each rank writing its own part
(DESIGN 8).

    checkpoints/step-00000120/
        rank0.pt, rank1.pt, ...  each rank's RankState, written by that rank
        shared.pt                config, model, optimizer, progress, extra (identical on every rank; rank 0)
        index.json               world size, step, config, and every file's size and SHA-256; rank 0 writes
                                 it LAST, so a directory without one is unfinished and is never read
    checkpoints/last -> step-00000120   relative symbolic links, replaced atomically (a rename)
    checkpoints/best -> step-00000096

No rank's state travels to another rank: a save gathers only (file, size, hash) strings, so its cost
per rank does not grow with P, and no message is larger than a few hundred bytes. Every file is
written atomically (temporary file, fsync, rename). `last` and `best` are links, not copies: marking
a checkpoint best copies nothing, and the link is swapped in one rename; the pruning after each save
(`train.keep_checkpoints` newest step directories, and the `train.keep_best_checkpoints` of lowest dev WER
for checkpoint averaging: training/averaging.py) never deletes what a link points at. Loading
checks every file it reads against the index (size and SHA-256) and refuses one that differs,
naming it; on resume all ranks agree that their files are sound before any rank goes on.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import pickle
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from sparse_asr.fileio import (INDEX_BYTES, UnsafePathError, atomic_write, atomic_write_text, fsync_dir, read_text,
                               trusted_path)

# 4: every file loads with weights_only=True (RNG states as tensors); 5: each part's state under one key (the
# meter's counters, the compressor's memory)
FORMAT_VERSION = 5
INDEX = "index.json"
OLD_INDEX = "manifest.json"  # formats 1-4 (refused by name)
SHARED = "shared.pt"


class CheckpointError(ValueError):
    """A checkpoint that is missing, unfinished, corrupted or does not fit this job (the message names the file)."""


@dataclass
class Progress:
    step: int = 0  # optimizer steps taken
    epoch: int = 0  # epochs completed
    batch_in_epoch: int = 0  # batches of the current epoch already consumed (the sampler's position)
    skipped_steps: int = 0  # non-finite steps skipped so far
    nonfinite_in_row: int = 0
    best_wer: float = math.inf  # best dev WER so far (checkpoints/best)


@dataclass
class RankState:
    """What differs between ranks."""

    compressor: dict  # the compressor's own state (its memory's under "memory")
    rng: dict
    buffers: dict  # BatchNorm running statistics (per rank until the epoch-end average)
    meter: dict  # the run's counters (telemetry.RunMeter.state_dict)


@dataclass
class TrainingState:
    config: dict
    model: dict
    optimizer: dict
    progress: Progress
    mine: RankState
    extra: dict = field(default_factory=dict)  # anything else a run records (the resolved warm-up, log rows)


@dataclass(frozen=True)
class Located:
    """A checkpoint a job continues from: its directory and its index as read once (resume.config_for_run);
    loading verifies every file against this index instead of reading it again."""

    directory: Path
    index: dict

    def __str__(self) -> str:
        return str(self.directory)


def rank_file(rank: int) -> str:
    return f"rank{rank}.pt"


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def step_of(directory: Path) -> int | None:
    """N of a step-N directory name, None for any other name."""
    prefix, _, digits = Path(directory).name.partition("-")
    return int(digits) if prefix == "step" and digits.isdigit() else None


# ---------------------------------------------------------------------------------------- saving
def save_training_state(comm, checkpoint_dir: str | Path, state: TrainingState, keep: int = 1,
                        best: bool = False, keep_best: int = 0) -> Path:
    """Collective: write `state` as checkpoint_dir/step-N/ (N = optimizer steps taken), point `last`
    (and `best` when asked) at it, and prune old step directories down to the newest `keep` and the `keep_best`
    of lowest dev WER (the run's metrics.jsonl beside checkpoint_dir).
    Returns the new directory. If any rank cannot write its file (a full disk), every rank raises
    an OSError naming the file, the unfinished directory is removed and `last` is left as it was."""
    checkpoint_dir = Path(checkpoint_dir)
    target = checkpoint_dir / step_dir_name(state.progress.step)
    if comm.rank == 0:
        if target.is_symlink():  # planted: the link goes, never what it points at
            target.unlink()
        elif target.exists():  # an unfinished save of a crashed run, or the same step saved again
            shutil.rmtree(target)
        target.mkdir(parents=True)
    comm.barrier()
    written, error = {}, None
    try:
        if comm.rank == 0:
            written[SHARED] = write_hashed(target / SHARED, {
                "format_version": FORMAT_VERSION, "world_size": comm.size, "config": state.config,
                "model": state.model, "optimizer": state.optimizer,
                "progress": dataclasses.asdict(state.progress), "extra": state.extra})
        written[rank_file(comm.rank)] = write_hashed(target / rank_file(comm.rank), {
            "format_version": FORMAT_VERSION, "rank": comm.rank, "world_size": comm.size,
            "state": dataclasses.asdict(state.mine)})
    except OSError as e:
        error = (e.errno, f"rank {comm.rank}: {e}")
    reports = comm.allgather_object((written, error))  # a few strings per rank
    errors = [e for _, e in reports if e is not None]
    if errors:
        if comm.rank == 0:
            shutil.rmtree(target, ignore_errors=True)
        raise OSError(errors[0][0], f"checkpoint {target} not written: " + "; ".join(m for _, m in errors))
    if comm.rank == 0:
        files = {name: entry for part, _ in reports for name, entry in part.items()}
        try:
            fsync_dir(target)  # the renames of every rank's file are durable before the index says so
            write_index(target, state, comm.size, files)
        except OSError:
            shutil.rmtree(target, ignore_errors=True)
            raise
        point_link(checkpoint_dir, "last", target.name)
        if best:
            point_link(checkpoint_dir, "best", target.name)
        prune(checkpoint_dir, keep, keep_best)
    comm.barrier()  # nobody goes on (or reads the checkpoint) before it is complete
    return target


class _HashingWriter:
    """Passes writes through to a file, hashing and counting the bytes on the way (no second read)."""

    def __init__(self, f):
        self.f, self.sha256, self.size = f, hashlib.sha256(), 0

    def write(self, data) -> int:
        view = memoryview(data)
        self.sha256.update(view)
        self.size += view.nbytes
        return self.f.write(view)

    def flush(self) -> None:
        self.f.flush()


def write_hashed(path: Path, obj: dict) -> dict:
    """torch.save `obj` to `path` atomically; returns {"bytes", "sha256"} of what was written."""
    hashing = {}

    def write(f):
        w = _HashingWriter(f)
        torch.save(obj, w)
        hashing.update(bytes=w.size, sha256=w.sha256.hexdigest())

    atomic_write(path, write)
    return hashing


def write_index(directory: Path, state: TrainingState, world_size: int, files: dict) -> None:
    """The checkpoint's index (index.json, written last): every file's size and SHA-256, step, config."""
    expected = {SHARED} | {rank_file(r) for r in range(world_size)}
    if set(files) != expected:
        raise OSError(f"checkpoint {directory}: files {sorted(files)} were written, expected {sorted(expected)}")
    p = state.progress
    index = {"format_version": FORMAT_VERSION, "world_size": world_size, "step": p.step, "epoch": p.epoch,
                "batch_in_epoch": p.batch_in_epoch, "config": state.config,
                "files": {name: files[name] for name in sorted(files)}}
    index["index_sha256"] = index_digest(index)
    atomic_write_text(directory / INDEX, json.dumps(index, indent=1) + "\n")
    fsync_dir(directory)


def point_link(checkpoint_dir: Path, name: str, target: str) -> None:
    """checkpoint_dir/name -> target (relative), replaced in one rename: readers see the old or the new link."""
    tmp = checkpoint_dir / f".{name}.tmp"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(target, tmp)
    os.replace(tmp, checkpoint_dir / name)
    fsync_dir(checkpoint_dir)


def resolve_link(path: Path) -> Path | None:
    return path.resolve() if path.is_symlink() and path.exists() else None


def complete_checkpoints(checkpoint_dir: Path) -> list[Path]:
    """The finished step directories (with an index), oldest first."""
    dirs = [d for d in step_dirs(checkpoint_dir) if (d / INDEX).is_file()]
    return sorted(dirs, key=step_of)


def step_dirs(checkpoint_dir: Path) -> list[Path]:
    """The step-N directories (a link named like one is not: a checkpoint is never read or pruned through one)."""
    return [d for d in Path(checkpoint_dir).glob("step-*")
            if d.is_dir() and not d.is_symlink() and step_of(d) is not None]


def check_link(link: Path) -> None:
    """`last` and `best` point at a step-N directory beside them, nothing else: a link to another run's checkpoint
    (planted, or copied with a run) would continue or prune that run. CheckpointError naming it."""
    if not link.is_symlink():
        return
    target = os.readlink(link)
    if "/" in target or step_of(Path(target)) is None:
        raise CheckpointError(f"{link} points at {target}, not at a step-N checkpoint of its own run; refusing "
                              f"to follow it")


def prune(checkpoint_dir: Path, keep: int, keep_best: int = 0) -> None:
    """Delete step directories that are unfinished, or older than the newest `keep` and not among the
    `keep_best` of lowest dev WER, unless `last` or `best` points at them."""
    complete = complete_checkpoints(checkpoint_dir)
    linked = {resolve_link(checkpoint_dir / name) for name in ("last", "best")}
    kept = {d.resolve() for d in complete[-keep:]} | linked
    if keep_best:
        from sparse_asr.training.averaging import dev_wers  # (it imports this module: imported here)

        try:
            scores = dev_wers(Path(checkpoint_dir).parent)
        except (OSError, ValueError):  # an unreadable log costs the extra checkpoints, never the run
            scores = {}
        ranked = sorted((d for d in complete if step_of(d) in scores), key=lambda d: (scores[step_of(d)], -step_of(d)))
        kept |= {d.resolve() for d in ranked[:keep_best]}
    for d in step_dirs(checkpoint_dir):
        if d.resolve() not in kept:
            shutil.rmtree(d)


def checkpoints_size(checkpoint_dir: Path) -> tuple[int, int]:
    """(finished checkpoints kept, their bytes on disk)."""
    complete = complete_checkpoints(checkpoint_dir)
    return len(complete), sum(f.stat().st_size for d in complete for f in d.iterdir() if f.is_file())


# ---------------------------------------------------------------------------------------- loading
def find_checkpoint(path: str | Path) -> Path:
    """The checkpoint directory `path` names: a checkpoint directory itself (checkpoints/last, best,
    step-N) or a run directory (its newest intact checkpoint, see locate_checkpoint). Links are resolved."""
    return locate_checkpoint(path)[0]


def locate_checkpoint(path: str | Path) -> tuple[Path, str | None]:
    """find_checkpoint's answer, and for a run directory whose checkpoints/last is missing, dangling or
    damaged (a crash between a save and the link, a user's cleanup), a note saying which older checkpoint
    is used instead: the newest whose index reads intact."""
    path = Path(path)
    if (path / INDEX).is_file() or (path / OLD_INDEX).is_file():
        if path.parent.name == "checkpoints":
            check_link(path)
        return trusted_path(path), None
    if (path / "checkpoints").is_dir():
        last = path / "checkpoints" / "last"
        try:
            check_link(last)
            read_index(last)
            return trusted_path(last), None
        except CheckpointError as e:
            problem = f"{last} does not exist" if not last.is_symlink() and not last.exists() else str(e)
        for candidate in reversed(complete_checkpoints(path / "checkpoints")):
            try:
                read_index(candidate)
            except CheckpointError:
                continue
            return trusted_path(candidate), f"{problem}: continuing from {candidate.name}, the newest intact checkpoint"
        raise CheckpointError(f"run directory {path} has no finished checkpoint ({problem}, and no step-N "
                              f"directory holds an intact index)")
    if path.is_file():
        raise CheckpointError(f"{path} is a file; checkpoints are directories (format {FORMAT_VERSION}): give "
                              f"the run directory or one of its checkpoints/ entries (last, best, step-N)")
    if path.is_dir():
        raise CheckpointError(f"{path} is neither a checkpoint ({INDEX} missing: an unfinished save, or not "
                              f"a checkpoint of this project) nor a run directory (no checkpoints/)")
    raise FileNotFoundError(f"checkpoint {path} does not exist")


def read_index(directory: str | Path) -> dict:
    """A checkpoint's index (index.json: files, sizes, SHA-256, step, config), checked for form."""
    path = Path(directory) / INDEX
    if not path.is_file() and (Path(directory) / OLD_INDEX).is_file():
        raise CheckpointError(f"{directory}: a checkpoint of format 4 or older (its index is {OLD_INDEX}); this code "
                              f"reads format {FORMAT_VERSION}: resume or evaluate it with the code that wrote it")
    try:  # a regular file of bounded size (a FIFO would hang the job, /dev/zero fill its memory)
        index = json.loads(read_text(path, INDEX_BYTES, "checkpoint index", follow=False))
    except FileNotFoundError:
        raise CheckpointError(f"{path} does not exist: the checkpoint is unfinished or not one of ours") from None
    except UnsafePathError as e:
        raise CheckpointError(str(e)) from None
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path} cannot be read: {e}") from None
    if not isinstance(index, dict) or index.get("format_version") != FORMAT_VERSION:
        version = index.get("format_version") if isinstance(index, dict) else None
        if isinstance(version, int) and 1 <= version < FORMAT_VERSION:
            why = "holds pickled objects that cannot be loaded safely" if version < 4 else \
                "keeps the ranks' states in another layout (format 5: each part's under one key)"
            raise CheckpointError(f"{path}: checkpoint format {version} is older than this code's {FORMAT_VERSION} "
                                  f"and {why}; resume or evaluate it with the code that wrote it")
        raise CheckpointError(f"{path} is not an index of this project's checkpoint format {FORMAT_VERSION}")
    missing = {"world_size", "step", "config", "files"} - set(index)
    if missing:
        raise CheckpointError(f"{path} lacks {', '.join(sorted(missing))}")
    if "index_sha256" not in index:  # every format-4 index carries one: a missing one was deleted
        raise CheckpointError(f"{path} lacks its own SHA-256 (index_sha256): edited or damaged")
    if index["index_sha256"] != index_digest(index):
        raise CheckpointError(f"{path} was edited or damaged: its content no longer matches its own SHA-256")
    if problem := index_form_problem(index):  # a hand-made index can carry a matching digest
        raise CheckpointError(f"{path}: {problem}")
    return index


def index_form_problem(index: dict) -> str | None:
    """What in an index has the wrong type (an int where a dict belongs, ...), or None: named here instead of a
    TypeError wherever the entry is first used."""
    def whole(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    if not whole(index["world_size"]) or index["world_size"] < 1:
        return f"world_size must be a positive integer, got {index['world_size']!r}"
    if not whole(index["step"]):
        return f"step must be an integer >= 0, got {index['step']!r}"
    if not isinstance(index["config"], dict):
        return f"config must be a mapping, got {type(index['config']).__name__}"
    if not isinstance(index["files"], dict):
        return f"files must be a mapping of file names, got {type(index['files']).__name__}"
    for name, entry in index["files"].items():
        if not (isinstance(entry, dict) and whole(entry.get("bytes")) and isinstance(entry.get("sha256"), str)):
            return f"files.{name} must hold bytes (an integer) and sha256 (a string), got {entry!r}"
    return None


def index_digest(index: dict) -> str:
    """SHA-256 of an index's content, its own digest left out (so an edited step or file list is caught)."""
    content = {k: v for k, v in index.items() if k != "index_sha256"}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def load_verified(directory: Path, index: dict, name: str) -> dict:
    """torch.load one file of a checkpoint after checking its size and SHA-256 against the index.
    Memory-mapped: a rank's shard is not held twice (the caller copies what it keeps)."""
    path = directory / name
    entry = index["files"].get(name)
    if entry is None:
        raise CheckpointError(f"{directory / INDEX} does not list {name}")
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {path} is missing")
    size = path.stat().st_size
    if size != entry["bytes"]:
        raise CheckpointError(f"checkpoint file {path} has {size} bytes, the index says {entry['bytes']} "
                              f"(truncated or replaced)")
    if file_sha256(path) != entry["sha256"]:
        raise CheckpointError(f"checkpoint file {path} is corrupted: its SHA-256 differs from the index's")
    return load_tensors_only(path)


def load_tensors_only(path: Path) -> dict:
    """torch.load with weights_only=True: tensors, numbers, strings and containers of them, nothing else.
    Checkpoints travel between researchers, and unpickling an arbitrary object can run any code (its
    __reduce__); the SHA-256 index does not help, since whoever writes the file writes the index too."""
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"checkpoint file {path} holds something other than tensors and plain values "
                              f"(refused, not loaded: unpickling it could run code): {first}") from None
    for name, tensor in tensors_in(loaded):
        if problem := layout_problem(tensor):
            raise CheckpointError(f"checkpoint file {path}: tensor {name} {problem}; refusing it")
    return loaded


def tensors_in(obj, prefix: str = ""):
    """(dotted name, tensor) of every tensor in nested dicts, lists and tuples."""
    if torch.is_tensor(obj):
        yield prefix or "(top level)", obj
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield from tensors_in(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from tensors_in(value, f"{prefix}[{i}]")


def layout_problem(tensor: torch.Tensor) -> str | None:
    """Why a tensor's layout is not one torch.save writes for a real state, or None: strides that reuse one
    element (stride 0 over a long dimension: a 15 KB file that expands to gigabytes once copied) or reach past
    the storage."""
    if tensor.numel() == 0:
        return None
    if any(stride <= 0 and size > 1 for size, stride in zip(tensor.shape, tensor.stride())):
        return f"has shape {tuple(tensor.shape)} over strides {tensor.stride()} (elements repeated, not stored)"
    last = tensor.storage_offset() + sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))
    if (last + 1) * tensor.element_size() > tensor.untyped_storage().nbytes():
        return "reaches past the data stored for it"
    return None


def file_sha256(path: Path) -> str:
    sha256 = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            sha256.update(chunk)
    return sha256.hexdigest()


def load_shared(path: str | Path) -> tuple[dict, dict]:
    """(index, shared part: model, optimizer, progress, ...) of a checkpoint; what evaluate.py needs."""
    directory = find_checkpoint(path)
    index = read_index(directory)
    return index, load_verified(directory, index, SHARED)


def check_world_size(directory: Path, index: dict, world_size: int) -> None:
    if index["world_size"] != world_size:
        raise CheckpointError(f"checkpoint {directory} was written by {index['world_size']} ranks but this job "
                              f"has {world_size}: per-rank compressor state (residuals) cannot be redistributed; "
                              f"launch it with mpiexec -n {index['world_size']}")


def load_training_state(comm, path: str | Path | Located) -> TrainingState:
    """Collective: this rank's view of a checkpoint (the shared file and its own shard, both verified against
    the index: the one already read when `path` is a Located). Raises on every rank if any rank's files are
    missing or corrupted, so no rank goes on alone."""
    if isinstance(path, Located):
        directory, index = path.directory, path.index
    else:
        directory = find_checkpoint(path)
        index = read_index(directory)
    check_world_size(directory, index, comm.size)

    def load() -> TrainingState:
        shared = load_verified(directory, index, SHARED)
        mine = load_verified(directory, index, rank_file(comm.rank))
        if mine["rank"] != comm.rank or shared["config"] != index["config"]:
            raise CheckpointError(f"checkpoint {directory}: {rank_file(comm.rank)} or {SHARED} does not match "
                                  f"the index (rank {mine['rank']}, config)")
        try:  # entries of another form: named, not a TypeError
            return TrainingState(config=shared["config"], model=shared["model"], optimizer=shared["optimizer"],
                                 progress=Progress(**shared["progress"]), mine=RankState(**mine["state"]),
                                 extra=shared["extra"])
        except (TypeError, KeyError) as e:
            raise CheckpointError(f"checkpoint {directory}: its progress or state entries are not of this code's "
                                  f"form ({e})") from None

    return on_every_rank(comm, load)


def on_every_rank(comm, action):
    """Run `action()` on every rank; if it raised anywhere, raise on every rank (this rank's own error,
    else the first failing rank's message), so that no rank goes on to write while another refused."""
    try:
        result, error = action(), None
    except Exception as e:  # noqa: BLE001 -- re-raised below, on this rank and on all others
        result, error = None, e
    failures = [(r, m) for r, m in enumerate(comm.allgather_object(None if error is None else str(error))) if m]
    if error is not None:
        raise error
    if failures:
        r, message = failures[0]
        raise CheckpointError(f"rank {r} refused the checkpoint: {message}")
    return result


def check_state_fits(what: str, expected: dict, got: dict, prefix: str = "") -> None:
    """A clear error when a checkpoint's `got` state does not have the keys and tensor shapes of this run's
    `expected` one (e.g. a dense checkpoint resumed with a sparse compressor: no residual)."""
    missing, unexpected = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
    if missing or unexpected:
        raise CheckpointError(f"the checkpoint's {what} state does not fit this run: "
                              + "; ".join(f"{label} {', '.join(prefix + str(k) for k in keys)}"
                                          for label, keys in (("missing", missing), ("unexpected", unexpected))
                                          if keys))
    for key, value in expected.items():
        if isinstance(value, dict) and isinstance(got[key], dict):
            check_state_fits(what, value, got[key], f"{prefix}{key}.")
        elif torch.is_tensor(value) and (not torch.is_tensor(got[key]) or got[key].shape != value.shape):
            shape = tuple(got[key].shape) if torch.is_tensor(got[key]) else type(got[key]).__name__
            raise CheckpointError(f"the checkpoint's {what} state does not fit this run: {prefix}{key} has shape "
                                  f"{shape}, this run's has {tuple(value.shape)}")
        elif torch.is_tensor(value) and got[key].dtype != value.dtype:  # load_state_dict would cast it silently
            raise CheckpointError(f"the checkpoint's {what} state does not fit this run: {prefix}{key} is "
                                  f"{got[key].dtype}, this run's is {value.dtype}")
        elif torch.is_tensor(value) and got[key].is_floating_point() and not bool(torch.isfinite(got[key]).all()):
            raise CheckpointError(f"the checkpoint's {what} state cannot be used: {prefix}{key} holds NaN or "
                                  f"infinite values")


# ---------------------------------------------------------------------------------------- RNG
# Every generator's state as tensors and plain values, so that a checkpoint loads with weights_only=True.
def rng_state() -> dict:
    version, mt_state, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"python": {"version": version, "state": torch.tensor(mt_state, dtype=torch.int64), "gauss": gauss},
             "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                       "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    py, npy = state["python"], state["numpy"]
    random.setstate((py["version"], tuple(py["state"].tolist()), py["gauss"]))
    np.random.set_state((npy["name"], npy["keys"].numpy().astype(np.uint32), npy["pos"], npy["has_gauss"],
                         npy["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
