"""Registry of gradient compressors by config name, and the one call that builds a run's exchange from its
config (build_exchange: the compressor from COMPRESSORS, its memory from MEMORIES, the dense parts around it).
Adding an algorithm: its own file, one line here, and its reference in tests/reference.py (see README, "Adding
a compressor")."""
import torch

from sparse_asr.compression.base import (Compressor, CompressorWrapper, Cost, SparseCompressor,
                                         SparseUpdate, StepStats)
from sparse_asr.compression.cltk import CLTk
from sparse_asr.compression.dense import DenseAllreduce, DenseVectors, DenseWarmup
from sparse_asr.compression.density_warmup import DensityWarmup, warmup_density
from sparse_asr.compression.gaussiank import Gaussiank
from sparse_asr.compression.gtopk import GTopk
from sparse_asr.compression.half import BF16Allreduce, FP16Allreduce
from sparse_asr.compression.memory import DEFAULT_MEMORY, MEMORIES, ErrorFeedback, MomentumCorrection
from sparse_asr.compression.oktopk import OkTopk
from sparse_asr.compression.onebit import OneBit
from sparse_asr.compression.powersgd import PowerSGD
from sparse_asr.compression.qsgd import QSGD
from sparse_asr.compression.randomk import Randomk
from sparse_asr.compression.topk_allgather import TopkAllgather
from sparse_asr.compression.topk_dsa import TopkDSA

COMPRESSORS: dict[str, type[Compressor]] = {
    cls.name: cls for cls in (DenseAllreduce, OkTopk, TopkAllgather, TopkDSA, GTopk, Gaussiank, PowerSGD, CLTk,
                              Randomk, BF16Allreduce, FP16Allreduce, OneBit, QSGD)
}


def warmup_steps(setting: int | str, total_steps: int) -> int:
    """compression.warmup_steps resolved: 'auto' = 5% of the run's optimizer steps (a fraction, not a
    constant, so that short runs still compress)."""
    return total_steps * 5 // 100 if setting == "auto" else int(setting)


def build_compressor(name: str, comm, numel: int, density: float = 1.0, device="cpu", shapes=None,
                     warmup: int = 0, dense_1d: bool = False, memory=None, density_warmup_epochs: int = 0,
                     **options) -> Compressor:
    """The compressor called `name` (its `options` validated by its Options), selecting from `memory` (a
    compression/memory.py object; None = error feedback), its density reached over `density_warmup_epochs`, with
    the 1-D parameters (by `shapes`) beside it by dense allreduce if `dense_1d`, behind `warmup` dense steps."""
    if name not in COMPRESSORS:
        raise ValueError(f"unknown compression algorithm {name!r}; known: {', '.join(sorted(COMPRESSORS))}")
    if memory is not None and (problem := memory_problem(name, memory.name, warmup, dense_1d)):
        raise ValueError(problem)
    extra = {"memory": memory} if memory is not None else {}
    compressor = COMPRESSORS[name](comm, numel, density, device=device, shapes=shapes, **extra, **options)
    if name == DenseAllreduce.name:
        return compressor
    if density_warmup_epochs:
        compressor = DensityWarmup(compressor, density_warmup_epochs)
    if dense_1d:
        compressor = DenseVectors(compressor)
    return DenseWarmup(compressor, warmup) if warmup else compressor


def build_exchange(compression, optim, comm, shapes, device="cpu", warmup: int = 0) -> Compressor:
    """The gradient exchange a compression section describes (training/config.py's CompressionConfig, or any
    object with its fields) for parameters of these `shapes`: COMPRESSORS[algorithm] with its options, selecting
    from MEMORIES[memory] (built by its from_settings; `optim`, the optimizer section, gives the momentum a
    memory may carry), DGC's density warm-up, the 1-D parameters averaged densely beside it if dense_1d, all
    behind `warmup` dense steps. What a run, bare_trainer and the benches build."""
    shapes = [torch.Size(s) for s in shapes]
    numel = sum(s.numel() for s in shapes)
    if compression.memory not in MEMORIES:
        raise ValueError(f"unknown compression.memory {compression.memory!r}; known: {', '.join(MEMORIES)}")
    memory = None  # the default is the compressor's own (error feedback; the only memory dense or PowerSGD take)
    if compression.memory != DEFAULT_MEMORY:
        memory = MEMORIES[compression.memory].from_settings(numel, device, compression, optim)
    return build_compressor(compression.algorithm, comm, numel, compression.density, device, shapes=shapes,
                            warmup=warmup, dense_1d=compression.dense_1d, memory=memory,
                            density_warmup_epochs=compression.density_warmup_epochs, **compression.options)


def sparse_algorithms() -> list[str]:
    """The algorithms that select entries (and so can take any memory)."""
    return sorted(n for n, cls in COMPRESSORS.items() if issubclass(cls, SparseCompressor))


def memory_problem(algorithm: str, memory: str, warmup_steps, dense_1d: bool) -> str | None:
    """Why the memory called `memory`, asked for instead of the selection's default, cannot serve `algorithm`
    behind these dense parts (None: it can). The config loader and build_compressor both ask, so a config is
    refused before its job is queued."""
    if algorithm not in sparse_algorithms():
        return (f"compression.memory={memory} needs a selection that says which entries each rank sent "
                f"({', '.join(sparse_algorithms())}), not {algorithm!r}")
    if MEMORIES[memory].carries_momentum and (warmup_steps != 0 or dense_1d):
        return (f"compression.memory={memory} carries the momentum, which dense steps (compression.warmup_steps="
                f"{warmup_steps}, compression.dense_1d={dense_1d}) would skip: it needs compression.warmup_steps=0 "
                f"and compression.dense_1d=false (compression.density_warmup_epochs is DGC's warm-up)")
    return None


__all__ = ["COMPRESSORS", "DEFAULT_MEMORY", "MEMORIES", "Compressor", "CompressorWrapper", "Cost", "DensityWarmup",
           "DenseVectors", "DenseWarmup", "ErrorFeedback", "MomentumCorrection", "SparseCompressor", "SparseUpdate",
           "StepStats", "build_compressor", "build_exchange", "memory_problem", "sparse_algorithms", "warmup_density",
           "warmup_steps"]
