"""Per-process set-up shared by train.py and evaluate.py: local rank, device, CPU threads, seeds,
and the rule that an exception on any rank ends the whole job (never a hang)."""
from __future__ import annotations

import os
import random
import socket
import sys
import time
import traceback

import numpy as np
import torch

LOCAL_RANK_VARIABLES = ("MPI_LOCALRANKID", "PMI_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "PALS_LOCAL_RANKID",
                        "SLURM_LOCALID")


def local_rank_and_size(comm) -> tuple[int, int]:
    """This rank's index among the ranks on its node, and how many ranks the node runs. The launcher's
    variable wins when set; otherwise ranks are grouped by host name (works with any MPI)."""
    hosts = comm.allgather_object(socket.gethostname())
    mine = hosts[comm.rank]
    local_size = hosts.count(mine)
    for name in LOCAL_RANK_VARIABLES:
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name]), local_size
    return hosts[: comm.rank].count(mine), local_size


def pick_device(requested: str, local_rank: int) -> torch.device:
    """auto: one GPU per rank by local rank when CUDA is available (if a wrapper already narrowed
    CUDA_VISIBLE_DEVICES to one GPU, local_rank % 1 = 0 picks it), else the CPU."""
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("distributed.device is 'cuda' but CUDA is not available on this node")
    device = torch.device("cuda", local_rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def set_threads(requested: int, local_size: int) -> int:
    """CPU threads per rank: the configured number; else OMP_NUM_THREADS if the user set it; else the
    cores this process may use divided among the ranks of the node (no oversubscription)."""
    if requested:
        torch.set_num_threads(requested)
    elif not os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // local_size))
    return torch.get_num_threads()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def run_or_abort(comm, fn, *args):
    """Run fn(*args); any exception on any rank prints `rank R: error` and a traceback to stderr,
    then aborts the MPI job so the other ranks (possibly inside a collective) end too."""
    try:
        return fn(*args)
    except BaseException as e:  # noqa: BLE001 -- including KeyboardInterrupt: the job must end
        if isinstance(e, SystemExit) and not e.code:
            raise
        print(f"rank {comm.rank}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        traceback.print_exc()
        sys.stderr.flush()
        if comm.size > 1:
            time.sleep(1.0)  # let the launcher forward this message before MPI_Abort tears the job down
        comm.abort(1)
