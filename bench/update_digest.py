"""A fingerprint of what every registered compressor computes: the SHA-256 of its updates and memory (residual,
or PowerSGD's error) over STEPS steps of the reference gradients (tests/mpi/compressor_check.py's), per
algorithm and, for every selection, per other memory of MEMORIES (rows ALGORITHM+MEMORY, the config's default
settings), on this job's ranks. Each is built as a run builds its exchange (compression.build_exchange). Run it
on two trees (e.g. before and after a refactor, PYTHONPATH=OLD_TREE) to show that the refactor changed no bit;
the same CPU and kernels on both sides, since rounding differs between them.

    mpiexec -n P .venv/bin/python bench/update_digest.py [--steps 40]
"""
from __future__ import annotations

import argparse
import hashlib

import numpy as np
import torch

from sparse_asr.comm import Communicator
from sparse_asr.compression import COMPRESSORS, DEFAULT_MEMORY, MEMORIES, build_exchange, sparse_algorithms
from sparse_asr.training.config import CompressionConfig, OptimConfig
from sparse_asr.training.launch import setup_process

N = 2999  # as tests/mpi/compressor_check.py


def gradient(step: int, rank: int) -> np.ndarray:
    shared = np.random.default_rng(10_000 + step).standard_t(3, N)
    own = np.random.default_rng(1000 * rank + step).standard_t(2, N)
    return (0.5 * shared + own).astype(np.float32)


def digest(comm, name: str, steps: int, memory: str = DEFAULT_MEMORY) -> str:
    density = 1.0 if name == "dense" else 0.02
    section = CompressionConfig(algorithm=name, density=density, warmup_steps=0, memory=memory)
    comp = build_exchange(section, OptimConfig(), comm, [(N,)])
    h = hashlib.sha256()
    for step in range(steps):
        flat = torch.from_numpy(gradient(step, comm.rank))
        comp.step(flat)
        h.update(flat.numpy().tobytes())
        memory = getattr(comp, "residual", None)
        memory = getattr(comp, "error", None) if memory is None else memory
        if memory is not None:
            h.update(memory.numpy().tobytes())
    every = comm.allgather_object(h.hexdigest())  # each rank's own residual enters its digest
    return hashlib.sha256("".join(every).encode()).hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    comm = Communicator()
    setup_process(comm, "cpu", threads=1)
    rows = [(name, digest(comm, name, args.steps)) for name in sorted(COMPRESSORS)]
    rows += [(f"{name}+{memory}", digest(comm, name, args.steps, memory))
             for name in sparse_algorithms() for memory in MEMORIES if memory != DEFAULT_MEMORY]
    if comm.rank == 0:
        print(f"| algorithm | P | SHA-256 of {args.steps} steps' updates and memories (first 16 hex) |\n|---|---|---|")
        for name, value in rows:
            print(f"| {name} | {comm.size} | {value} |")


if __name__ == "__main__":
    main()
