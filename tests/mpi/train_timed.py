"""Under mpiexec: train.max_minutes is decided by rank 0's clock for every rank, so all ranks stop
after the same epoch whatever their own clocks say (a rank deciding alone would leave the others
waiting in the next epoch's first collective).

    mpiexec -n P python -m tests.mpi.train_timed MANIFEST_DIR OUT_DIR

Two runs of 3 epochs with a 1-minute budget; in each, one rank's trainer clock runs 10,000x fast
(a minute passes in 6 ms): the last rank's in the first run (rank 0's real clock says go on: every
rank trains 3 epochs), rank 0's in the second (every rank stops after epoch 1).
"""
import sys
import time
import types

from sparse_asr.comm import Communicator
from sparse_asr.training import trainer as trainer_module
from sparse_asr.training.runtime import run_or_abort
from tests.mpi.train_common import read_metrics, run_training, tiny_overrides

FAST_CLOCK = types.SimpleNamespace(perf_counter=lambda: time.perf_counter() * 1e4)


def epochs_trained(comm, manifests, out_dir, name, fast_rank) -> int:
    trainer_module.time = FAST_CLOCK if comm.rank == fast_rank else time
    try:
        run_training(tiny_overrides(manifests, out_dir, name, train__epochs=3, train__max_minutes=1,
                                    train__global_batch_size=4 * comm.size,
                                    data__max_train_utterances=8 * comm.size), comm)
    finally:
        trainer_module.time = time
    epochs = [m["epoch"] for m in read_metrics(f"{out_dir}/{name}") if m["kind"] == "epoch"]
    return epochs[-1]


def main(comm, manifests, out_dir):
    last = comm.size - 1
    assert epochs_trained(comm, manifests, out_dir, "fast-last", fast_rank=last) == 3
    assert epochs_trained(comm, manifests, out_dir, "fast-rank0", fast_rank=0) == 1
    if comm.rank == 0:
        print(f"P={comm.size}: every rank stopped where rank 0's clock said (3 epochs, then 1)", flush=True)


if __name__ == "__main__":
    comm = Communicator()
    run_or_abort(comm, main, comm, sys.argv[1], sys.argv[2])
