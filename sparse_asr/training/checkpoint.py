"""Checkpoints: the training state of a run, one file holding everything needed to continue exactly
(DESIGN 8).

`TrainingState` is the explicit, versioned record: the parts every rank holds identically (config,
model, optimizer, progress) and each rank's own parts (compressor state such as residuals and
thresholds, RNG states, BatchNorm statistics of a mid-epoch checkpoint, traffic counters, the
epoch's running figures). Rank 0 writes the file; each rank's own part is gathered to rank 0 first
and stored as `ranks[r]`. On resume every rank reads the file (memory-mapped, so it only touches its
own entry) and takes `ranks[comm.rank]`. Writes are atomic: a temporary file, then os.replace.
"""
from __future__ import annotations

import dataclasses
import math
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from sparse_asr.fileio import atomic_write

FORMAT_VERSION = 2


@dataclass
class Progress:
    step: int = 0  # optimizer steps taken
    epoch: int = 0  # epochs completed
    batch_in_epoch: int = 0  # batches of the current epoch already consumed (the sampler's position)
    skipped_steps: int = 0  # non-finite steps skipped so far
    nonfinite_in_row: int = 0
    best_wer: float = math.inf  # best dev WER so far (best.pt)


@dataclass
class RankState:
    """What differs between ranks."""

    compressor: dict
    rng: dict
    buffers: dict  # BatchNorm running statistics (per rank until the epoch-end average)
    cum_bytes_recv: float  # this rank's bytes received since the run started
    epoch_window: dict  # the epoch's running figures so far (MetricWindow.state_dict)


@dataclass
class TrainingState:
    config: dict
    model: dict
    optimizer: dict
    progress: Progress
    mine: RankState
    extra: dict = field(default_factory=dict)  # anything else a run records (e.g. the resolved warm-up)


def save_training_state(comm, path: str | Path, state: TrainingState) -> None:
    """Collective: every rank passes its state; rank 0 writes the shared parts and all ranks' own parts."""
    ranks = comm.gather_object(dataclasses.asdict(state.mine), root=0)
    if comm.rank == 0:
        atomic_save({"format_version": FORMAT_VERSION, "world_size": comm.size, "config": state.config,
                     "model": state.model, "optimizer": state.optimizer,
                     "progress": dataclasses.asdict(state.progress), "extra": state.extra, "ranks": ranks}, path)
    comm.barrier()  # nobody goes on (or reads the file) before it is complete


def load_training_state(comm, path: str | Path) -> TrainingState:
    """This rank's view of a checkpoint; the world size must be the one it was written with."""
    ckpt = load_checkpoint(path)
    if ckpt["world_size"] != comm.size:
        raise ValueError(f"checkpoint {path} was written by {ckpt['world_size']} ranks but this job has "
                         f"{comm.size}: per-rank compressor state (residuals) cannot be redistributed")
    return TrainingState(config=ckpt["config"], model=ckpt["model"], optimizer=ckpt["optimizer"],
                         progress=Progress(**ckpt["progress"]), mine=RankState(**ckpt["ranks"][comm.rank]),
                         extra=ckpt["extra"])


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


def copy_checkpoint(comm, src: str | Path, dst: str | Path) -> None:
    """Collective: rank 0 copies a finished checkpoint (e.g. last.pt -> best.pt), atomically."""
    if comm.rank == 0:
        with open(src, "rb") as f_src:
            atomic_write(dst, lambda f: shutil.copyfileobj(f_src, f))
    comm.barrier()


def atomic_save(obj: dict, path: str | Path) -> None:
    atomic_write(path, lambda f: torch.save(obj, f))


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
