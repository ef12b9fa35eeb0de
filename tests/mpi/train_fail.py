"""Under mpiexec: an exception on rank 1 at optimizer step 3 must end EVERY rank promptly (train.py
aborts the MPI job; rank 0 is then waiting inside a collective and must not hang).

    mpiexec -n P python -m tests.mpi.train_fail MANIFEST_DIR OUT_DIR

Prints 'INJECTED <unix time>' to stderr just before raising, so the test can time the shutdown.
"""
import sys
import time

from sparse_asr.comm import Communicator
from tests.mpi.train_common import run_job_or_abort, tiny_overrides
from sparse_asr.training.trainer import Trainer

original = Trainer.train_step


def train_step(self, batch):
    if self.comm.rank == 1 and self.progress.step == 3:
        print(f"INJECTED {time.time()}", file=sys.stderr, flush=True)
        raise RuntimeError("injected failure at step 3")
    return original(self, batch)


if __name__ == "__main__":
    Trainer.train_step = train_step
    P = Communicator().size
    overrides = tiny_overrides(sys.argv[1], sys.argv[2], "fail", train__global_batch_size=4 * P,
                               data__max_train_utterances=16 * P, train__epochs=3)
    run_job_or_abort(overrides)
    print("rank finished normally (it should not)", flush=True)
