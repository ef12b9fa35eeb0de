"""Continuing a run: which checkpoint, which run directory, which config (DESIGN 8).

    train.py --resume runs/NAME                        the run's newest checkpoint (runs/NAME/checkpoints/last)
    train.py --resume runs/NAME/checkpoints/step-N     any of its checkpoints
    train.py --config C name=NAME --resume auto        continue runs/NAME if it has a checkpoint, else start it

A resumed run continues in the directory its checkpoint lives in (wherever the run was moved to), with
the config stored in the checkpoint. Overrides (and a --config file) may change only the keys in
SAFE_TO_CHANGE; anything else is refused, naming the keys. Only drop_metrics_after writes, and
train.py calls it once the checkpoint has been checked on every rank.
"""
from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

from sparse_asr.fileio import atomic_write
from sparse_asr.training.checkpoint import (INDEX, CheckpointError, Located, check_world_size, complete_checkpoints,
                                            locate_checkpoint, read_index, step_of)
from sparse_asr.training.config import (Config, ConfigError, build_config, flatten, load_config, parse_override,
                                        resolve_world_size, resume_safe_keys, set_dotted, to_dict)

# Keys that change how a run is watched or how long it goes on, not what it computes step by step: the
# settings marked resume_safe in config.py.
SAFE_TO_CHANGE = resume_safe_keys()
# Keys that describe where and how the run was started, not its training: never compared.
LOCATION_KEYS = ("name", "out_dir", "train.resume", "distributed.world_size")


def config_for_run(config_path: str | None, overrides: list[str], resume: str,
                   world_size: int) -> tuple[Config, Located | None, list[str]]:
    """The config this job runs, the checkpoint it continues from (its directory and the index read here,
    which loading verifies the files against: read once; None = a fresh start) and notes for the log (an
    older checkpoint used because the newest is damaged; the config keys changed since the checkpoint).
    `resume`: "" (then train.resume of the config), a run or checkpoint directory, or "auto"."""
    requested = load_config(config_path, overrides) if config_path else None
    given = dict(parse_override(o) for o in overrides)
    resume = resume or (requested.train.resume if requested else str(given.get("train.resume") or ""))
    if not resume:
        if requested is None:
            raise ConfigError("--config is required to start a run (only --resume RUN_DIR may leave it out)")
        return requested, None, []
    asked = resume
    if resume == "auto":
        if requested is None or not requested.name:
            raise ConfigError("--resume auto (train.resume=auto) needs --config and an explicit run name "
                              "(name=NAME): it continues OUT_DIR/NAME if that has a checkpoint, else starts it")
        # Any finished checkpoint counts, not only `last`: a crash between a save and its link, or a user's
        # cleanup, leaves `last` missing or dangling, and the run continues from its newest intact one.
        if not complete_checkpoints(requested.run_dir / "checkpoints"):
            return dataclasses.replace(requested, train=dataclasses.replace(requested.train, resume=asked)), None, []
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
    saved, source = index["config"], str(directory / INDEX)
    if requested is None:
        requested = build_config(saved, overrides, source=source)
    check_location(requested, given, run_dir)
    # A key the saved config lacks was added to the code after the checkpoint was written: it counts as its
    # default, which keeps what the run computed (a new key's default must be the old behaviour).
    old = flatten(to_dict(build_config(saved, source=source)))
    new = flatten(to_dict(resolve_world_size(requested, world_size)))
    changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k) and k not in LOCATION_KEYS)
    unsafe = [k for k in changed if k not in SAFE_TO_CHANGE]
    if unsafe:
        raise ConfigError(f"cannot resume {run_dir} with another configuration: "
                          + "; ".join(f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in unsafe)
                          + f". Only these keys may change when resuming: {', '.join(SAFE_TO_CHANGE)}"
                          + " (start a new run to change anything else)")
    raw = copy.deepcopy(saved)
    for key, value in [*((k, new[k]) for k in changed), ("name", run_dir.name), ("out_dir", str(run_dir.parent)),
                       ("train.resume", asked)]:
        set_dotted(raw, key, value)
    notes = ([fallback] if fallback else []) + ([f"config keys changed since the checkpoint: {', '.join(changed)}"]
                                                 if changed else [])
    return build_config(raw, source=source), Located(directory, index), notes


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
    line cut by a crash (no newline, not JSON) and everything after it goes, so the resumed run never
    appends to half a row. Returns what was dropped, for the log, or None."""
    path = Path(run_dir) / "metrics.jsonl"
    lines = path.read_bytes().splitlines(keepends=True) if path.exists() else []
    keep = min(rows, len(lines))
    for number, line in enumerate(lines[:keep]):
        if not line.endswith(b"\n") or not complete_row(line):
            keep = number
            break
    if keep == len(lines):
        return None
    atomic_write(path, lambda f: f.writelines(lines[:keep]))
    damaged = f"; line {keep + 1} was cut or damaged" if keep < min(rows, len(lines)) else ""
    return (f"metrics.jsonl: kept the {keep} complete rows the checkpoint covers, dropped {len(lines) - keep} "
            f"line(s) after them{damaged}")


def complete_row(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False
