"""Registry of gradient compressors by config name. Add a new algorithm here (see README)."""
from sparse_asr.compression.base import Compressor, SparseCompressor, StepStats
from sparse_asr.compression.dense import DenseAllreduce
from sparse_asr.compression.oktopk import OkTopk
from sparse_asr.compression.gaussiank import Gaussiank
from sparse_asr.compression.gtopk import GTopk
from sparse_asr.compression.topk_allgather import TopkAllgather
from sparse_asr.compression.topk_dsa import TopkDSA

COMPRESSORS: dict[str, type[Compressor]] = {
    DenseAllreduce.name: DenseAllreduce,
    OkTopk.name: OkTopk,
    TopkAllgather.name: TopkAllgather,
    TopkDSA.name: TopkDSA,
    GTopk.name: GTopk,
    Gaussiank.name: Gaussiank,
}


def build_compressor(name: str, comm, numel: int, density: float, device="cpu", **options) -> Compressor:
    """Make the compressor called `name`; `options` are its own keyword arguments (e.g. Ok-Topk's intervals)."""
    if name not in COMPRESSORS:
        raise ValueError(f"unknown compression algorithm {name!r}; known: {sorted(COMPRESSORS)}")
    cls = COMPRESSORS[name]
    if cls is DenseAllreduce:
        return cls(comm, numel)
    return cls(comm, numel, density, device=device, **options)


__all__ = ["COMPRESSORS", "Compressor", "SparseCompressor", "StepStats", "build_compressor"]
