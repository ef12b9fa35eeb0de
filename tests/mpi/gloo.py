"""A gloo process group beside our MPI ranks, for checks against PyTorch's DDP hooks (powersgd_check, half_check).

    with gloo_group(comm):
        ...  # torch.distributed collectives; call gc.collect() between cases

A TCP store on rank 0 (a free loopback port, broadcast over MPI). The hooks' future callbacks run Python on gloo's
threads, and a garbage collection started there could free the process group, whose destructor then joins that
very thread ("terminate called ... Resource deadlock avoided", seen once in ~10 runs under load): collections run
only on the main thread while gloo lives, and every rank is done with gloo before any tears it down.
"""
import gc
import socket
from contextlib import contextmanager
from datetime import timedelta

import torch.distributed as dist


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def gloo_group(comm):
    port = comm.bcast_object(free_port() if comm.rank == 0 else None)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.rank, world_size=comm.size,
                            timeout=timedelta(seconds=60))
    gc.disable()
    try:
        yield
    finally:
        gc.collect()
        comm.barrier()
        dist.destroy_process_group()
        gc.collect()
        gc.enable()
        comm.barrier()
