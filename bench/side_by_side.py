"""Exchanges timed side by side in one MPI job, on the same gradients, with the streaming floor beside them.

Every step: the source's gradient for that step; after a barrier, the floor, one `d += b` over n float32 (one pass
over memory); then each exchange on its own copy of the gradient, each after a barrier, the order alternating step
by step so that a busy machine slows all of them alike. Steps 0 .. warmup-1 run untimed (cold starts, exact
first steps). Used by bench/oktopk_vs_baseline.py and bench/oktopk_original.py.
"""
import os
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch


@dataclass
class SideBySide:
    floor_s: list  # this rank's floor, seconds per timed step
    rows: dict  # name -> this rank's rows, one per timed step, as its exchange returned them
    load_before: tuple  # os.getloadavg() before the first step and after the last
    load_after: tuple


def run_side_by_side(comm, source, n: int, warmup: int, steps: int,
                     exchanges: dict[str, Callable[[torch.Tensor, bool], tuple]]) -> SideBySide:
    """Run warmup + steps steps. exchanges: name -> function(flat, timed) that runs one exchange on `flat` (the
    step's gradient, a copy of its own) and returns its row, whose first entry is the exchange's seconds."""
    floor_d, floor_b = torch.zeros(n), torch.ones(n)
    names = list(exchanges)
    result = SideBySide([], {name: [] for name in names}, os.getloadavg(), ())
    for step in range(warmup + steps):
        grad = source.gradient(step)
        timed = step >= warmup
        comm.barrier()
        t0 = time.perf_counter()
        floor_d += floor_b
        if timed:
            result.floor_s.append(time.perf_counter() - t0)
        for name in names if step % 2 == 0 else names[::-1]:
            flat = grad.clone()
            comm.barrier()
            row = exchanges[name](flat, timed)
            if timed:
                result.rows[name].append(row)
    result.load_after = os.getloadavg()
    return result


def slowest(comm, seconds) -> np.ndarray:
    """Each timed step's slowest rank: `seconds` (steps, or steps x columns) reduced by max over the ranks."""
    worst = torch.tensor(np.asarray(seconds, dtype=np.float64))
    comm.allreduce_(worst, "max")
    return worst.numpy()


def median_ms(seconds) -> float:
    return 1e3 * statistics.median(np.asarray(seconds).tolist())
