"""Under mpiexec: bf16 and fp16 allreduce against PyTorch's own DDP hooks, at whatever P it runs with.

    mpiexec -n P python -m tests.mpi.half_check

1. The hooks as the reference: a gloo process group beside MPI (same ranks), bf16_compress_hook and
   fp16_compress_hook on one bucket holding the same per-rank gradient as ours. At P <= 2 every half sum has one
   addition, so ours must be the hook's bits; beyond, gloo's ring adds in another order than our rank order, and
   the two may differ by the rounding of P - 1 half additions: at most 2 (P-1) u sum_r |g_r / P| per entry (u the
   half's unit roundoff), plus the subnormal spacing per addition for fp16.
2. Overflow: a gradient of entries 1e5 (> 65504) gives a non-finite update on every rank for fp16 (as the hook's:
   the cast overflows before the division by P), a finite one for bf16, whose range is float32's.
Any failure aborts all ranks with a non-zero exit code.
"""
import gc

import numpy as np
import torch
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook, fp16_compress_hook

from sparse_asr.comm import Communicator
from sparse_asr.compression import build_compressor
from sparse_asr.training.runtime import run_or_abort
from tests.mpi.gloo import gloo_group

N = 4099  # not a multiple of P
STEPS = 5
HOOKS = {"bf16": bf16_compress_hook, "fp16": fp16_compress_hook}
UNIT_ROUNDOFF = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11}
SUBNORMAL = {"bf16": 0.0, "fp16": 2.0 ** -24}


def gradient(step: int, rank: int) -> torch.Tensor:
    """Entries over many binades (some subnormal in fp16), a part shared by the ranks and a part of their own."""
    shared, own = np.random.default_rng([3, step]), np.random.default_rng([4, step, rank])
    scales = 10.0 ** shared.uniform(-9, 3, N)
    return torch.from_numpy((scales * (shared.standard_normal(N) + own.standard_normal(N))).astype(np.float32))


def against_hook(comm, name: str) -> float:
    P, rank = comm.size, comm.rank
    ours = build_compressor(name, comm, N)
    worst = 0.0
    for step in range(STEPS):
        where = f"{name} P={P} rank={rank} step={step}"
        grad = gradient(step, rank)
        theirs = HOOKS[name](None, (grad.clone(),)).wait()
        mine = grad.clone()
        ours.step(mine)
        if P <= 2:
            assert torch.equal(mine, theirs), f"{where}: not the hook's bits"
            continue
        everyone = comm.allgather_object(grad.numpy())
        bound = 2 * (P - 1) * (UNIT_ROUNDOFF[name] * np.sum(np.abs(everyone), axis=0) / P + SUBNORMAL[name])
        gap = np.abs(mine.numpy().astype(np.float64) - theirs.numpy())
        assert np.all(gap <= bound), f"{where}: differs from the hook by {gap.max():.3g} beyond its rounding bound"
        worst = max(worst, float((gap / np.maximum(bound, 1e-300)).max()))
    return worst


def overflow(comm) -> None:
    """Entries of 1e5: fp16 cannot hold them (the hook casts before it divides by P): the update is not finite,
    on every rank, the hook's too; bf16 holds them."""
    for name in ("fp16", "bf16"):
        grad = torch.full((N,), 1e5)
        mine = grad.clone()
        build_compressor(name, comm, N).step(mine)
        theirs = HOOKS[name](None, (grad.clone(),)).wait()
        finite = bool(torch.isfinite(mine).all())
        assert finite == (name == "bf16"), (name, comm.size, mine[:4])
        assert bool(torch.isfinite(theirs).all()) == finite, (name, theirs[:4])
        assert all(np.array_equal(u, mine.numpy()) for u in comm.allgather_object(mine.numpy())), name



def main(comm):
    torch.set_num_threads(1)
    with gloo_group(comm):  # tests/mpi/gloo.py: garbage is collected only here, between cases
        for name in HOOKS:
            worst = against_hook(comm, name)
            gc.collect()
            if comm.rank == 0:
                print(f"ok hook {name} P={comm.size}: largest gap / rounding bound {worst:.3g}", flush=True)
        overflow(comm)
        if comm.rank == 0:
            print(f"ok overflow P={comm.size}", flush=True)


if __name__ == "__main__":
    comm = Communicator()
    run_or_abort(comm, main, comm)
