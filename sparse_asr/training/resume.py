"""Continuing a run: which checkpoint, which run directory, which config (DESIGN 8). run_config decides it
once per start, under the run directory's lock, from the request train.py parsed once (training/plan.py).

    train.py --resume runs/NAME                        the run's newest checkpoint (runs/NAME/checkpoints/last)
    train.py --resume runs/NAME/checkpoints/step-N     any of its checkpoints
    train.py --config C name=NAME --resume auto        continue runs/NAME if it has a checkpoint, else start it

A resumed run continues in the directory its checkpoint lives in (wherever the run was moved to), with
the config stored in the checkpoint. Overrides (and a --config file) may change only the keys in
SAFE_TO_CHANGE; anything else is refused, naming the keys. Only drop_metrics_after writes, and
train.py calls it once the checkpoint has been checked on every rank.
"""
from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path

from sparse_asr.fileio import atomic_write, read_bytes
from sparse_asr.training.checkpoint import (INDEX, CheckpointError, Located, check_world_size, complete_checkpoints,
                                            locate_checkpoint, read_index, step_of)
from sparse_asr.training.config import (Config, ConfigError, build_config, flatten, resolve_world_size,
                                        resume_safe_keys, to_dict)

if typing.TYPE_CHECKING:
    from sparse_asr.training.plan import RunRequest

# Keys that change how a run is watched or how long it goes on, not what it computes step by step: the
# settings marked resume_safe in config.py.
SAFE_TO_CHANGE = resume_safe_keys()
# Keys that describe where and how the run was started, not its training: never compared.
LOCATION_KEYS = ("name", "out_dir", "train.resume", "distributed.world_size")
METRICS_BYTES = 1 << 30  # a run's metrics.jsonl (a long run logs a few MB)


def run_config(request: RunRequest, world_size: int) -> tuple[Config, Located | None, list[str]]:
    """The config this job runs, resolved for `world_size` ranks (resolve_world_size), the checkpoint it continues
    from (its directory and the index read here, which loading verifies the files against: read once; None = a
    fresh start) and notes for the log (an older checkpoint used because the newest is damaged; the config keys
    changed since the checkpoint). Called once per start, under the run directory's lock: the checkpoint is what
    the directory holds now. The request's config is not parsed again; a checkpoint's saved config is built once
    (and once more with the overrides when the request has no config of its own)."""
    requested, resume = request.config, request.resume
    if not resume:
        return resolve_world_size(requested, world_size), None, []
    asked = resume
    if resume == "auto":
        # Any finished checkpoint counts, not only `last`: a crash between a save and its link, or a user's
        # cleanup, leaves `last` missing or dangling, and the run continues from its newest intact one.
        if not complete_checkpoints(requested.run_dir / "checkpoints"):
            fresh = dataclasses.replace(requested, train=dataclasses.replace(requested.train, resume=asked))
            return resolve_world_size(fresh, world_size), None, []
        resume = str(requested.run_dir)
    directory, fallback = locate_checkpoint(resume)
    index = read_index(directory)
    check_world_size(directory, index, world_size)
    run_dir = run_dir_of(directory)
    newer = newer_checkpoints(directory, index["step"])
    if newer:
        raise CheckpointError(f"checkpoint {directory} is not the newest of {run_dir}: continuing from it would mix "
                              f"two histories in metrics.jsonl and TensorBoard; move or delete the newer "
                              f"{', '.join(d.name for d in newer)} first")
    source = str(directory / INDEX)
    saved = build_config(index["config"], source=source)  # what the run computed (a key it lacks: its default)
    if requested is None:
        requested = build_config(index["config"], request.overrides, source=source) if request.overrides else saved
    check_location(requested, request.given, run_dir)
    resolved = resolve_world_size(requested, world_size)
    old, new = flatten(to_dict(saved)), flatten(to_dict(resolved))
    changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k) and k not in LOCATION_KEYS)
    unsafe = [k for k in changed if k not in SAFE_TO_CHANGE]
    if unsafe:
        raise ConfigError(f"cannot resume {run_dir} with another configuration: "
                          + "; ".join(f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in unsafe)
                          + f". Only these keys may change when resuming: {', '.join(SAFE_TO_CHANGE)}"
                          + " (start a new run to change anything else)")
    # Every key but the location ones now equals the saved config's or is a safe change: the run continues with
    # it where its checkpoint lives.
    cfg = dataclasses.replace(resolved, name=run_dir.name, out_dir=str(run_dir.parent),
                              train=dataclasses.replace(resolved.train, resume=asked))
    notes = ([fallback] if fallback else []) + ([f"config keys changed since the checkpoint: {', '.join(changed)}"]
                                                 if changed else [])
    return cfg, Located(directory, index), notes


def run_dir_of(directory: Path) -> Path:
    """RUN_DIR of a checkpoint directory RUN_DIR/checkpoints/step-N."""
    if directory.parent.name != "checkpoints":
        raise CheckpointError(f"checkpoint {directory} is not inside a run's checkpoints/ directory, so the run "
                              f"to continue is unknown (evaluate.py can still read it)")
    return directory.parent.parent


def check_location(requested: Config, given: dict, run_dir: Path) -> None:
    """A name or out_dir given on the command line (`given`: the parsed overrides) must agree with where the
    run is."""
    if ("name" in given and requested.name != run_dir.name) or \
            ("out_dir" in given and Path(requested.out_dir).resolve() != run_dir.parent.resolve()):
        raise ConfigError(f"a resumed run continues where its checkpoint lives ({run_dir}); name={requested.name} "
                          f"out_dir={requested.out_dir} points elsewhere (copy the run directory to move it)")


def newer_checkpoints(directory: Path, step: int) -> list[Path]:
    """The run's intact checkpoints newer than `directory`, of optimizer step `step` (resuming from it
    would abandon them; a damaged one is not worth keeping)."""
    return [d for d in complete_checkpoints(directory.parent) if step_of(d) > step and intact_index(d)]


def intact_index(directory: Path) -> bool:
    try:
        read_index(directory)
        return True
    except CheckpointError:
        return False


def drop_metrics_after(run_dir: Path, rows: int) -> str | None:
    """Keep the first `rows` lines of run_dir/metrics.jsonl (the ones written before the checkpoint; a
    crashed run may have written more), rewritten atomically, and of those only the complete ones: a
    line cut by a crash (no newline, not JSON) or damaged goes, the complete rows around it stay, so the
    resumed run never appends to half a row. Returns what was dropped, for the log, or None."""
    path = Path(run_dir) / "metrics.jsonl"
    try:  # never through a link planted at its name
        lines = read_bytes(path, METRICS_BYTES, "metrics file", follow=False).splitlines(keepends=True)
    except FileNotFoundError:
        lines = []
    covered = lines[:rows]
    damaged = [number for number, line in enumerate(covered, start=1)
               if not line.endswith(b"\n") or not complete_row(line)]
    if not damaged and len(covered) == len(lines):
        return None
    kept = [line for number, line in enumerate(covered, start=1) if number not in damaged]
    atomic_write(path, lambda f: f.writelines(kept))
    said = (f"; line {damaged[0]} was cut or damaged" if len(damaged) == 1 else
            f"; lines {', '.join(map(str, damaged))} were cut or damaged" if damaged else "")
    return (f"metrics.jsonl: kept the {len(kept)} complete rows the checkpoint covers, dropped "
            f"{len(lines) - len(kept)} line(s){said}")


def complete_row(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False
