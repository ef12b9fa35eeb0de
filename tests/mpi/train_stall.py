"""Under mpiexec: rank 1 stops itself (SIGSTOP) before optimizer step 2, as a stalled node would. With
distributed.timeout_s set, the other ranks' watchdog must end the whole job within seconds, naming the
MPI call that waited; without it, the job would hang forever.

    mpiexec -n P python -m tests.mpi.train_stall MANIFEST_DIR OUT_DIR TIMEOUT_S [startup]

With `startup`, rank 1 stops before the job's first collective (finding the run's directory to lock), as a
node that stalls while the job starts up: the watchdog must cover start-up too.

Prints 'STOPPING <unix time>' to stderr just before the stop, so the test can time the shutdown.
"""
import os
import signal
import sys
import time

from sparse_asr.comm import Communicator
from sparse_asr.training import launch
from sparse_asr.training.launch import run_directory
from sparse_asr.training.trainer import Trainer
from tests.mpi.train_common import run_job_or_abort, tiny_overrides

original = Trainer.train_step


def train_step(self, batch):
    if self.comm.rank == 1 and self.progress.step == 2:
        print(f"STOPPING {time.time()}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
    return original(self, batch)


def stop_at_startup(request, comm):
    if comm.rank == 1:
        print(f"STOPPING {time.time()}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
    return run_directory(request, comm)


if __name__ == "__main__":
    Trainer.train_step = train_step
    if sys.argv[4:] == ["startup"]:
        launch.run_directory = stop_at_startup
    P = Communicator().size
    overrides = tiny_overrides(sys.argv[1], sys.argv[2], "stall", train__global_batch_size=4 * P,
                               data__max_train_utterances=16 * P, train__epochs=3,
                               distributed__timeout_s=sys.argv[3])
    run_job_or_abort(overrides)
    print("rank finished normally (it should not)", flush=True)
