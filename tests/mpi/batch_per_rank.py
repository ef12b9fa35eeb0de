"""Under mpiexec: train.batch_per_rank=3 resolves to a global batch of 3 x P on every rank, and the
trainer's sampler then gives every rank 3 utterances per step.

    mpiexec -n P python -m tests.mpi.batch_per_rank
"""
import numpy as np

from sparse_asr.comm import Communicator
from sparse_asr.data.dataset import BucketingSampler
from sparse_asr.training.config import load_config
from sparse_asr.training.launch import resolve_for_run
from sparse_asr.training.runtime import run_or_abort


def main(comm):
    cfg = resolve_for_run(load_config(None, ["train.batch_per_rank=3", "name=weak"]), comm)
    assert cfg.train.global_batch_size == 3 * comm.size and cfg.train.batch_per_rank is None, cfg.train
    assert cfg.distributed.world_size == comm.size
    durations = np.linspace(1.0, 2.0, 10 * cfg.train.global_batch_size)
    sampler = BucketingSampler(durations, cfg.train.global_batch_size, comm.rank, comm.size, seed=cfg.seed)
    sizes = {len(batch) for batch in sampler}
    assert sizes == {3}, sizes
    if comm.rank == 0:
        print(f"P={comm.size}: global batch {cfg.train.global_batch_size}, 3 utterances per rank per step", flush=True)


if __name__ == "__main__":
    comm = Communicator()
    run_or_abort(comm, main, comm)
