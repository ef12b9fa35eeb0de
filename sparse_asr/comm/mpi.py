"""mpi4py's MPI module, imported in this one place: mpi4py initializes MPI on its first import, so whatever MPICH
reads at initialization is decided here, before it.

One setting: on a node that runs more ranks than there are cores for them (4 or 8 ranks on a 2-core laptop or CI
machine), a rank waiting in a collective sleeps instead of spinning. MPICH's waiting ranks poll and call
sched_yield, which under Linux's fair scheduler still takes each spinner its share of a core from the ranks that
have work; MPIR_CVAR_ENABLE_HEAVY_YIELD=1 makes them nanosleep instead. bench/mpi_yield.py measures it: while one
rank works and the others wait, spinning slows it in proportion to the ranks per core; balanced steps are the same
either way. With a core per rank (a cluster) spinning answers sooner, so there it is left as it is. A value the user
set is kept. The results of MPI calls do not depend on it, only how a rank waits.
"""
from __future__ import annotations

import os

YIELD_VARIABLE = "MPIR_CVAR_ENABLE_HEAVY_YIELD"


def ranks_on_this_node(environ=os.environ) -> int | None:
    """How many ranks share this node, as MPICH's launcher (hydra) tells each rank; None under another launcher."""
    value = environ.get("MPI_LOCALNRANKS", "")
    return int(value) if value.isdigit() else None


def oversubscribed(ranks: int | None, cores: int | None = None) -> bool:
    """More ranks on this node than cores this process may run on (default: this process's CPU affinity)."""
    cores = len(os.sched_getaffinity(0)) if cores is None else cores
    return ranks is not None and ranks > cores


def load_mpi():
    """mpi4py's MPI module, initialized (ImportError without mpi4py)."""
    if oversubscribed(ranks_on_this_node()):
        os.environ.setdefault(YIELD_VARIABLE, "1")
    from mpi4py import MPI

    return MPI
