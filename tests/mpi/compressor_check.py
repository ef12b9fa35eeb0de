"""Every compressor against the numpy references of tests/reference.py, at whatever P it runs with.

    mpiexec -n P python -m tests.mpi.compressor_check

For each case, STEPS steps on heavy-tailed random gradients (a component shared by all ranks, so
selections overlap, plus a per-rank one). Each step every rank gathers all ranks' gradients and
recomputes, in numpy, every rank's accumulated gradient and the expected result. It checks:
  - the update equals the reference global sum / P, and is bitwise identical on every rank;
  - the residual is exactly acc with the reference's applied entries zeroed (so residuals matter
    from step 2 on);
  - mass conservation from the compressors' own outputs: P * update + sum of residuals after ==
    sum of (residual before + gradient), in float64 (where the reference says it conserves: not for the lossy
    exchanges without memory, bf16, fp16, qsgd);
  - bytes sent and received equal the per-algorithm volumes of the reference exactly.
An exchange whose memory is not a residual of applied entries (onebit's worker and server errors) gives its
reference every rank's state before the step (Reference.state) and is checked against the state the reference
computes; its owed mass, for conservation, is the compressor's own `owed`. At P = 1 the update is the reference's
bitwise where the reference computes the same float32 operations (Expected.exact; not onebit's float64 scales).
DGC's memory (compression.memory=dgc) around TopkA and Ok-Topk, every combination of Nesterov and masking: u and v
are exactly a float32 numpy mirror of the momentum correction, the update is the reference's selection from the
ranks' velocities, v loses exactly the applied entries (u too with masking), and velocity mass is conserved. At
density 1 it is dense momentum SGD step for step (optim.SGDStep, weight decay and Nesterov included; masking
there clears every momentum, leaving plain SGD).
And compression.dense_1d (DenseVectors) around Ok-Topk and TopkA: the 1-D parameters' entries are the exact
mean over ranks, the rest is bitwise what the bare compressor makes of the gradient with those entries
zeroed, their residual stays 0, and the bytes are the bare compressor's plus one ring allreduce of them.
Any failure aborts all ranks with a non-zero exit code.
"""

import numpy as np
import torch

from sparse_asr.comm import Communicator
from sparse_asr.compression import COMPRESSORS, MomentumCorrection, build_compressor
from sparse_asr.compression.base import dense_allreduce_bytes
from tests import reference as ref
from sparse_asr.training.runtime import run_or_abort

N = 2999  # not a multiple of P: uneven regions
STEPS = 20


def gradient(step: int, rank: int) -> np.ndarray:
    shared = np.random.default_rng(10_000 + step).standard_t(3, N)
    own = np.random.default_rng(1000 * rank + step).standard_t(2, N)
    return (0.5 * shared + own).astype(np.float32)


def owed(comp) -> np.ndarray:
    """What the rank still owes the model, in units of the ranks' sum: a selection's residual, another memory's own
    `owed` (onebit: worker error + P x server error), else nothing."""
    memory = getattr(comp, "residual", None)
    memory = getattr(comp, "owed", None) if memory is None else memory
    return np.zeros(N, np.float32) if memory is None else memory.numpy().copy()


def expected_step(comm, comp, reference, accs, density, options, step) -> ref.Expected:
    """The reference's step from every rank's acc; with its own memory (Reference.state), also from every rank's
    state before the step (collective: call it before the step)."""
    if reference.state is None:
        return reference.expected(accs, comp.k, density, options, step)
    before = comm.allgather_object(reference.state(comp))
    return reference.expected(accs, comp.k, density, options, step, before=before)


def check_memory(comp, reference, expected, P, rank, where) -> None:
    """The state after the step (Reference.state) against the reference's, to float tolerance: relative to the
    larger of its own entries and the update's (an error can be a rounding of the values it came from)."""
    if expected.memory is None:
        return
    after = reference.state(comp)
    for key, value in expected.memory[rank].items():
        scale = max(np.abs(value).max(initial=0.0), np.abs(expected.total).max(initial=0.0) / P)
        np.testing.assert_allclose(after[key], value, rtol=1e-5, atol=1e-6 * scale, err_msg=f"{where}: {key}")


def check_case(comm, name, density, options):
    P, rank = comm.size, comm.rank
    comp = build_compressor(name, comm, N, density, **options)
    reference = ref.REFERENCES[name]
    sparse = hasattr(comp, "residual")
    ref_residuals = [np.zeros(N, np.float32) for _ in range(P)]
    extras = {}
    for step in range(STEPS):
        grad = gradient(step, rank)
        grads = comm.allgather_object(grad)
        residual_before = owed(comp)
        accs = [ref_residuals[q] + grads[q] for q in range(P)]  # float32, as the compressor adds
        expected = expected_step(comm, comp, reference, accs, density, options, step)
        flat = torch.from_numpy(grad.copy())
        meta_before = comm.counts("meta")
        stats = comp.step(flat)
        update = flat.numpy().copy()
        where = f"{name} density={density} {options} P={P} rank={rank} step={step}"
        total, indices, applied = expected.total, expected.indices, expected.applied

        # The update: reference sum / P, the same bits on every rank.
        if P == 1 and expected.exact:
            assert np.array_equal(update, total.astype(np.float32)), where
        np.testing.assert_allclose(update.astype(np.float64) * P, total, rtol=1e-5, atol=1e-5, err_msg=where)
        assert stats.selected_global == indices.size, (where, stats.selected_global, indices.size)
        updates = comm.allgather_object(update)
        assert all(np.array_equal(u, update) for u in updates), f"{where}: ranks disagree on the update"

        # The residual: exactly acc minus the applied entries.
        if sparse:
            residual = accs[rank].copy()
            residual[applied[rank]] = 0.0
            assert np.array_equal(comp.residual.numpy(), residual), f"{where}: residual differs from the reference"
            assert stats.selected_local >= applied[rank].size, where  # gTopk, Ok-Topk: some selected are dropped
            ref_residuals = []
            for q in range(P):
                r = accs[q].copy()
                r[applied[q]] = 0.0
                ref_residuals.append(r)

        check_memory(comp, reference, expected, P, rank, where)

        # Conservation, from the compressors' own outputs only.
        if reference.conserves:
            mine = (residual_before.astype(np.float64) + grad, owed(comp).astype(np.float64))
            everyone = comm.allgather_object(mine)
            inflow = np.sum([b for b, _ in everyone], axis=0)
            outflow = P * update.astype(np.float64) + np.sum([a for _, a in everyone], axis=0)
            np.testing.assert_allclose(outflow, inflow, rtol=1e-5, atol=1e-5, err_msg=f"{where}: mass not conserved")

        # Volumes, exactly where the algorithm's volume follows from the selections.
        if expected.volumes is not None:
            assert (stats.bytes_sent, stats.bytes_recv) == expected.volumes[rank], \
                (where, stats.bytes_sent, stats.bytes_recv, expected.volumes[rank])
        if name in ("dense", "topka", "gtopk", "randomk", "bf16", "fp16", "onebit", "qsgd"):  # sizes known in advance
            assert comm.counts("meta").bytes_recv == meta_before.bytes_recv, f"{where}: unexpected size exchange"
        for key, value in expected.extra.items():
            assert stats.extra[key] == value, (where, key, stats.extra, expected.extra)
        for key, value in stats.extra.items():
            extras[key] = extras.get(key, 0.0) + value

    if reference.extra_check is not None:  # the cases are built to exercise these branches
        reference.extra_check(density, P, extras)


def check_dgc_memory(comm, name, density, options, nesterov, masking, momentum=0.9):
    P, rank = comm.size, comm.rank
    memory = MomentumCorrection(N, torch.device("cpu"), momentum, nesterov, masking)
    comp = build_compressor(name, comm, N, density, memory=memory, **options)
    assert comp.carries_momentum
    m = np.float32(momentum)
    us = [np.zeros(N, np.float32) for _ in range(P)]
    vs = [np.zeros(N, np.float32) for _ in range(P)]
    for step in range(STEPS):
        grad = gradient(step, rank)
        grads = comm.allgather_object(grad)
        v_before = memory.v.numpy().astype(np.float64)
        flat = torch.from_numpy(grad.copy())
        comp.step(flat)
        update = flat.numpy().copy()
        where = f"dgc {name} nesterov={nesterov} masking={masking} P={P} rank={rank} step={step}"
        for q in range(P):  # the momentum correction, float32 as the memory computes it
            if nesterov:
                us[q] = (us[q] + grads[q]) * m
                vs[q] = vs[q] + us[q] + grads[q]
            else:
                us[q] = us[q] * m + grads[q]
                vs[q] = vs[q] + us[q]
        expected = ref.REFERENCES[name].expected(vs, comp.k, density, options, step)
        np.testing.assert_allclose(update.astype(np.float64) * P, expected.total, rtol=1e-5, atol=1e-5, err_msg=where)
        assert all(np.array_equal(u, update) for u in comm.allgather_object(update)), f"{where}: ranks disagree"
        accumulated = vs[rank].astype(np.float64)
        for q in range(P):
            vs[q][expected.applied[q]] = 0.0
            if masking:
                us[q][expected.applied[q]] = 0.0
        assert np.array_equal(memory.v.numpy(), vs[rank]), \
            f"{where}: velocity is not v with the applied entries cleared"
        assert np.array_equal(memory.u.numpy(), us[rank]), f"{where}: momentum differs from the mirror"
        # velocity mass: what the ranks accumulated is either in the update or still owed
        sent = comm.allgather_object((accumulated - v_before, memory.v.numpy().astype(np.float64) - v_before))
        inflow = np.sum([a for a, _ in sent], axis=0)
        outflow = P * update.astype(np.float64) + np.sum([b for _, b in sent], axis=0)
        np.testing.assert_allclose(outflow, inflow, rtol=1e-5, atol=1e-5, err_msg=f"{where}: velocity not conserved")


def check_dgc_density_one(comm, nesterov, masking):
    """DGC at density 1 (TopkA selects everything) against dense allreduce + torch's momentum SGD."""
    from sparse_asr.training.config import OptimConfig
    from sparse_asr.training.optim import SGDStep, attach_flat_grad

    P, rank = comm.size, comm.rank
    cfg = OptimConfig(lr=0.05, momentum=0.9, nesterov=nesterov, weight_decay=1e-3, max_grad_norm=0.0)
    sides = []
    for dgc in (False, True):
        model = torch.nn.Sequential(torch.nn.Linear(30, 40), torch.nn.Linear(40, 20))
        init = np.random.default_rng(0)  # not torch's global generator: thread ranks share it
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.from_numpy(init.standard_normal(tuple(p.shape), dtype=np.float32)))
        params = list(model.parameters())
        flat = attach_flat_grad(params)
        memory = MomentumCorrection(flat.numel(), torch.device("cpu"), cfg.momentum, nesterov, masking) if dgc else None
        comp = build_compressor("topka" if dgc else "dense", comm, flat.numel(), 1.0, memory=memory)
        sides.append((params, flat, comp, SGDStep(params, cfg, P, momentum_in_exchange=dgc)))
    for step in range(STEPS):
        grad = torch.from_numpy(np.random.default_rng(100 * rank + step).standard_normal(sides[0][1].numel(),
                                                                                        dtype=np.float32))
        lr = 0.05 / (1 + step % 3)  # a changing learning rate, as the schedule gives
        for params, flat, comp, sgd in sides:
            flat.copy_(grad)
            sgd.before_exchange(flat)
            comp.step(flat)
            sgd.after_exchange(flat, lr)
        (dense_params, *_), (dgc_params, _, dgc, _) = sides
        where = f"dgc at density 1 nesterov={nesterov} masking={masking} P={P} rank={rank} step={step}"
        if masking:  # every entry was sent, so masking cleared every momentum: plain SGD on a momentum-free step
            assert not dgc.memory.u.any() and not dgc.memory.v.any(), where
            continue
        assert not dgc.memory.v.any(), f"{where}: density 1 leaves no velocity behind"
        for a, b in zip(dense_params, dgc_params):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=where)


SHAPES = [torch.Size([37]), torch.Size([40, 50]), torch.Size([5]), torch.Size([29, 33])]  # 2999 entries
ONE_D = np.r_[0:37, 2037:2042]


def check_dense_1d(comm, name, density):
    P, rank = comm.size, comm.rank
    wrapped = build_compressor(name, comm, N, density, shapes=SHAPES, dense_1d=True)
    bare = build_compressor(name, comm, N, density, shapes=SHAPES)
    for step in range(STEPS):
        grad = gradient(step, rank)
        grads = comm.allgather_object(grad)
        flat = torch.from_numpy(grad.copy())
        stats = wrapped.step(flat)
        masked = grad.copy()
        masked[ONE_D] = 0.0
        bare_flat = torch.from_numpy(masked)
        bare_stats = bare.step(bare_flat)
        where = f"dense_1d {name} P={P} rank={rank} step={step}"
        update, expected = flat.numpy(), bare_flat.numpy()
        exact_mean = np.mean(np.stack(grads).astype(np.float64), axis=0)[ONE_D]
        np.testing.assert_allclose(update[ONE_D], exact_mean, rtol=1e-5, atol=1e-6, err_msg=where)
        rest = np.setdiff1d(np.arange(N), ONE_D)
        assert np.array_equal(update[rest], expected[rest]), f"{where}: the compressed part differs from the bare one"
        assert np.all(wrapped.inner.residual.numpy()[ONE_D] == 0.0), f"{where}: residual kept for 1-D entries"
        assert torch.equal(wrapped.inner.residual, bare.residual), where
        ring = dense_allreduce_bytes(ONE_D.size, P)
        assert (stats.bytes_sent, stats.bytes_recv) == (bare_stats.bytes_sent + ring,
                                                        bare_stats.bytes_recv + ring), where
        assert stats.selected_global == bare_stats.selected_global + ONE_D.size, where


def main():
    torch.set_num_threads(1)
    comm = Communicator()
    run_or_abort(comm, run_cases, comm)  # a failed assertion on any rank ends every rank


def run_cases(comm):
    for name in COMPRESSORS:  # the registry is the list: every registered algorithm is checked
        check_algorithm(comm, name)
    check_memories_and_wrappers(comm)


def check_algorithm(comm, name):
    """Every case of the algorithm's reference; an algorithm without one (tests/reference.py REFERENCES) fails."""
    if name not in ref.REFERENCES:
        raise AssertionError(f"algorithm {name!r} has no entry in tests/reference.py REFERENCES")
    for density, options in ref.REFERENCES[name].cases:
        check_case(comm, name, density, options)
    if comm.rank == 0:
        print(f"ok {name} density={density} {options} P={comm.size}", flush=True)


def check_memories_and_wrappers(comm):
    """DGC's memory around TopkA and Ok-Topk, DGC at density 1, and compression.dense_1d."""
    for name, options in (("topka", {}), ("oktopk", ref.EXACT_OKTOPK)):
        for nesterov in (False, True):
            for masking in (True, False):
                check_dgc_memory(comm, name, 0.02, options, nesterov, masking)
        if comm.rank == 0:
            print(f"ok dgc {name} P={comm.size}", flush=True)
    for nesterov in (False, True):
        for masking in (False, True):
            check_dgc_density_one(comm, nesterov, masking)
    if comm.rank == 0:
        print(f"ok dgc density 1 P={comm.size}", flush=True)
    for name in ("oktopk", "topka"):
        check_dense_1d(comm, name, 0.02)
        if comm.rank == 0:
            print(f"ok dense_1d {name} P={comm.size}", flush=True)


if __name__ == "__main__":
    main()
