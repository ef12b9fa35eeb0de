"""Under mpiexec: ranks started with different configs (here: seed = rank) must be refused with an
error naming the differing key, and the job must end with a non-zero exit.

    mpiexec -n P python -m tests.mpi.train_mismatch MANIFEST_DIR OUT_DIR
"""
import sys

from sparse_asr.comm import Communicator
from tests.mpi.train_common import run_job_or_abort, tiny_overrides

if __name__ == "__main__":
    comm = Communicator()
    overrides = tiny_overrides(sys.argv[1], sys.argv[2], "mismatch", seed=comm.rank)
    run_job_or_abort(overrides)
    print("rank finished normally (it should not)", flush=True)
