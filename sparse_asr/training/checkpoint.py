"""Checkpoints: one file holding everything needed to continue a run exactly (DESIGN 8).

Rank 0 writes it; each rank's own state (compressor residual/thresholds, RNG states, counters) is
gathered to rank 0 first and stored as `ranks[r]`. On resume every rank reads the file (memory-mapped,
so it only touches its own entry) and takes `ranks[comm.rank]`.
Writes are atomic: a temporary file in the same directory, then os.replace.
"""
from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

FORMAT_VERSION = 1


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(comm, path: str | Path, shared: dict, mine: dict) -> None:
    """Collective: every rank passes its own state `mine`; rank 0 writes `shared` plus all ranks' states."""
    ranks = comm.gather_object(mine, root=0)
    if comm.rank == 0:
        atomic_save({"format_version": FORMAT_VERSION, "world_size": comm.size, **shared, "ranks": ranks}, path)
    comm.barrier()  # nobody goes on (or reads the file) before it is complete


def copy_checkpoint(comm, src: str | Path, dst: str | Path) -> None:
    """Collective: rank 0 copies a finished checkpoint (e.g. last.pt -> best.pt), atomically."""
    if comm.rank == 0:
        dst = Path(dst)
        tmp = dst.with_name(f".{dst.name}.tmp{os.getpid()}")
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    comm.barrier()


def atomic_save(obj: dict, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def atomic_write_text(path: str | Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def load_checkpoint(path: str | Path) -> dict:
    """Read a checkpoint on the CPU; a clear error if it is missing or not one of ours."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except Exception as e:  # a truncated or foreign file
        raise ValueError(f"checkpoint {path} cannot be read: {e}") from e
    if not isinstance(ckpt, dict) or ckpt.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path} is not a checkpoint of this project (format_version {FORMAT_VERSION})")
    return ckpt


def rank_state(ckpt: dict, comm, path) -> dict:
    """This rank's own entry; the world size must be the one the checkpoint was written with."""
    if ckpt["world_size"] != comm.size:
        raise ValueError(f"checkpoint {path} was written by {ckpt['world_size']} ranks but this job has "
                         f"{comm.size}: per-rank compressor state (residuals) cannot be redistributed")
    return ckpt["ranks"][comm.rank]
