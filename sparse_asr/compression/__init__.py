"""Registry of gradient compressors by config name. Adding an algorithm: its own file, one line here,
and its reference in tests/reference.py (see README, "Adding a compressor")."""
from sparse_asr.compression.base import (Compressor, CompressorWrapper, Cost, ErrorFeedback, SparseCompressor,
                                         SparseUpdate, StepStats)
from sparse_asr.compression.cltk import CLTk
from sparse_asr.compression.dense import DenseAllreduce, DenseVectors, DenseWarmup
from sparse_asr.compression.gaussiank import Gaussiank
from sparse_asr.compression.gtopk import GTopk
from sparse_asr.compression.oktopk import OkTopk
from sparse_asr.compression.powersgd import PowerSGD
from sparse_asr.compression.topk_allgather import TopkAllgather
from sparse_asr.compression.topk_dsa import TopkDSA

COMPRESSORS: dict[str, type[Compressor]] = {
    cls.name: cls for cls in (DenseAllreduce, OkTopk, TopkAllgather, TopkDSA, GTopk, Gaussiank, PowerSGD, CLTk)
}


def warmup_steps(setting: int | str, total_steps: int) -> int:
    """compression.warmup_steps resolved: 'auto' = 5% of the run's optimizer steps (a fraction, not a
    constant, so that short runs still compress)."""
    return total_steps * 5 // 100 if setting == "auto" else int(setting)


def build_compressor(name: str, comm, numel: int, density: float = 1.0, device="cpu", shapes=None,
                     warmup: int = 0, dense_1d: bool = False, **options) -> Compressor:
    """The compressor called `name` (its `options` validated by its Options), with the 1-D parameters (by
    `shapes`) beside it by dense allreduce if `dense_1d`, behind `warmup` dense steps."""
    if name not in COMPRESSORS:
        raise ValueError(f"unknown compression algorithm {name!r}; known: {', '.join(sorted(COMPRESSORS))}")
    compressor = COMPRESSORS[name](comm, numel, density, device=device, shapes=shapes, **options)
    if name == DenseAllreduce.name:
        return compressor
    if dense_1d:
        compressor = DenseVectors(compressor)
    return DenseWarmup(compressor, warmup) if warmup else compressor


__all__ = ["COMPRESSORS", "Compressor", "CompressorWrapper", "Cost", "DenseVectors", "DenseWarmup", "ErrorFeedback",
           "SparseCompressor", "SparseUpdate", "StepStats", "build_compressor", "warmup_steps"]
