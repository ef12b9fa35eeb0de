"""Raise an error through run_or_abort on every rank, as train.py's main does, to see what each rank prints.

    [mpiexec -n P] python -m tests.mpi.raise_error config|missing|refused|bug
"""
import sys

from sparse_asr.comm import Communicator
from sparse_asr.fileio import UnsafePathError
from sparse_asr.training.config import ConfigError
from sparse_asr.training.runtime import run_or_abort

ERRORS = {"config": ConfigError("cfg.yaml: train.epochs must be >= 1, got 0"),
          "missing": FileNotFoundError("checkpoint runs/x/last.pt does not exist"),
          "refused": UnsafePathError("runs/x/metrics.jsonl is a symbolic link; refusing to follow it"),
          "bug": RuntimeError("something unexpected")}


def fail(comm, kind):
    comm.barrier()  # every rank reaches the error before the first one's abort ends the job
    raise ERRORS[kind]


if __name__ == "__main__":
    comm = Communicator()
    run_or_abort(comm, fail, comm, sys.argv[1])
