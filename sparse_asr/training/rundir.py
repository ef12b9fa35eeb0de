"""A run directory holds one run. A new run refuses to start in a directory holding a previous run's
files (it would overwrite its checkpoints and config and append to its curves), unless it resumes that
run or is asked to replace it (train.py --overwrite)."""
from __future__ import annotations

import shutil
from pathlib import Path

RUN_FILES = ("config.yaml", "metrics.jsonl", "checkpoints")  # what train.py writes, besides the event files
EVENT_FILES = "events.out.tfevents.*"


def previous_run(run_dir: str | Path) -> list[Path]:
    """The files and directories of a previous run in `run_dir` (none when it does not exist)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    return [run_dir / name for name in RUN_FILES if (run_dir / name).exists()] + sorted(run_dir.glob(EVENT_FILES))


def previous_run_message(run_dir: str | Path) -> str | None:
    """Why a new run may not start in `run_dir` (it holds a previous run, or is not a directory), or None."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        return f"run directory {run_dir} exists and is not a directory"
    found = previous_run(run_dir)
    if not found:
        return None
    names = ", ".join(p.name for p in found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
    return (f"run directory {run_dir} holds a previous run ({names}): choose another name=, continue that run "
            f"with --resume, or replace it with --overwrite")


def clear_previous_run(run_dir: str | Path) -> list[Path]:
    """Delete a previous run's files from `run_dir` (only those: anything else the user put there stays);
    returns what was deleted."""
    found = previous_run(run_dir)
    for path in found:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    return found
