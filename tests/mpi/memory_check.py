"""The memories beside error feedback around the selections, against numpy mirrors: EF21-SGDM's
(compression.memory=ef21) and ScaleCom's low-pass filter (compression.memory=lowpass).

    mpiexec -n P python -m tests.mpi.memory_check

EF21:
For TopkA, Ok-Topk (exact thresholds) and CLT-k, heavy-ball and Nesterov, STEPS steps on heavy-tailed random
gradients (a component shared by the ranks plus a rank's own). Every step each rank gathers all ranks' gradients and
mirrors every rank's memory in numpy: u and the rank estimate h exactly (bitwise), the selection from d = v - h by
the reference of tests/reference.py, the global estimate as the previous one plus the reference's sum / P. Checked:
  - the update is the global estimate, the same bits on every rank;
  - h takes exactly the applied entries of d, and d keeps the rest;
  - conservation: the global estimate is the mean of the ranks' h (what EF21 rests on);
  - at density 1 the update is the mean of the ranks' momentum steps v (dense momentum SGD's step);
  - a resume from state_dict continues bitwise.
Low-pass: the memory follows m <- (1 - beta) m + beta (acc - sent) for the reference's selection from acc = m + g
(within float32 rounding), every rank applies the same update (the reference's sum / P), and at beta = 1 it is
error feedback bit for bit (the same update and residual as the default memory, step by step).
Any failure aborts all ranks with a non-zero exit code.
"""

import numpy as np
import torch

from sparse_asr.comm import Communicator
from sparse_asr.compression import build_compressor
from sparse_asr.compression.memory import EF21Momentum, LowPassResidual
from sparse_asr.training.runtime import run_or_abort
from tests import reference as ref
from tests.mpi.compressor_check import N, gradient

STEPS = 12
MOMENTUM = np.float32(0.9)
CASES = [("topka", 0.02, {}), ("oktopk", 0.02, ref.EXACT_OKTOPK), ("cltk", 0.02, {}), ("topka", 1.0, {})]


def mirror_momentum(u: np.ndarray, g: np.ndarray, nesterov: bool) -> tuple[np.ndarray, np.ndarray]:
    """(u, v) after gradient g, in the float32 operations the memory does."""
    if nesterov:
        u = ((u + g) * MOMENTUM).astype(np.float32)
        return u, (u + g).astype(np.float32)
    u = (MOMENTUM * u + g).astype(np.float32)
    return u, u.copy()


def make(comm, name, density, options, nesterov):
    memory = EF21Momentum(N, torch.device("cpu"), float(MOMENTUM), nesterov)
    return build_compressor(name, comm, N, density, memory=memory, **options)


def check_case(comm, name, density, options, nesterov):
    P, rank = comm.size, comm.rank
    comp = make(comm, name, density, options, nesterov)
    memory, reference = comp.memory, ref.REFERENCES[name]
    u = [np.zeros(N, np.float32) for _ in range(P)]
    h = [np.zeros(N, np.float32) for _ in range(P)]
    estimate = np.zeros(N, np.float32)
    for step in range(STEPS):
        where = f"ef21 {name} density={density} nesterov={nesterov} P={P} rank={rank} step={step}"
        grads = comm.allgather_object(gradient(step, rank))
        flat = torch.from_numpy(grads[rank].copy())
        comp.step(flat)
        update = flat.numpy().copy()

        v = [None] * P
        for q in range(P):
            u[q], v[q] = mirror_momentum(u[q], grads[q], nesterov)
        d = [(v[q] - h[q]).astype(np.float32) for q in range(P)]
        expected = reference.expected(d, comp.k, density, options, step)
        assert np.array_equal(memory.u.numpy(), u[rank]), f"{where}: momentum differs from the mirror"
        # the update is the global estimate: the previous one plus the averaged applied differences
        np.testing.assert_allclose(update.astype(np.float64), estimate + expected.total / P, rtol=1e-5, atol=1e-5,
                                   err_msg=where)
        assert np.array_equal(update, memory.estimate.numpy()), f"{where}: the update is not the global estimate"
        assert all(np.array_equal(x, update) for x in comm.allgather_object(update)), f"{where}: ranks disagree"
        for q in range(P):
            h[q][expected.applied[q]] += d[q][expected.applied[q]]
            d[q][expected.applied[q]] = 0.0
        assert np.array_equal(memory.h.numpy(), h[rank]), f"{where}: rank estimate differs from the mirror"
        assert np.array_equal(memory.difference.numpy(), d[rank]), f"{where}: difference differs from the mirror"
        # conservation: the global estimate is the mean of the ranks' estimates
        ranks_h = comm.allgather_object(memory.h.numpy().copy())
        np.testing.assert_allclose(np.mean(np.array(ranks_h, dtype=np.float64), axis=0), update, rtol=1e-5, atol=1e-4,
                                   err_msg=f"{where}: global estimate is not the mean of the ranks' h")
        if density == 1.0:
            np.testing.assert_allclose(update, np.mean(np.array(v, dtype=np.float64), axis=0), rtol=1e-5, atol=1e-5,
                                       err_msg=f"{where}: density 1 is not momentum SGD's step")
        estimate = update.copy()


def check_resume(comm, nesterov):
    """Six steps, a state_dict, then four more: a fresh memory and compressor loaded from it give the same bits."""
    first = make(comm, "oktopk", 0.02, ref.EXACT_OKTOPK, nesterov)
    for step in range(6):
        first.step(torch.from_numpy(gradient(step, comm.rank)))
    state = first.state_dict()
    second = make(comm, "oktopk", 0.02, ref.EXACT_OKTOPK, nesterov)
    second.load_state_dict(state)
    for step in range(6, 10):
        a, b = torch.from_numpy(gradient(step, comm.rank)), torch.from_numpy(gradient(step, comm.rank))
        first.step(a)
        second.step(b)
        assert torch.equal(a, b), f"ef21 resume nesterov={nesterov} P={comm.size} step={step}: updates differ"


def check_lowpass(comm, name, density, options, beta):
    P, rank = comm.size, comm.rank
    comp = build_compressor(name, comm, N, density, memory=LowPassResidual(N, torch.device("cpu"), beta), **options)
    plain = build_compressor(name, comm, N, density, **options)  # error feedback, for beta = 1
    memories = [np.zeros(N, np.float32) for _ in range(P)]
    for step in range(STEPS):
        where = f"lowpass {name} beta={beta} P={P} rank={rank} step={step}"
        grads = comm.allgather_object(gradient(step, rank))
        flat, flat_plain = torch.from_numpy(grads[rank].copy()), torch.from_numpy(grads[rank].copy())
        comp.step(flat)
        plain.step(flat_plain)
        accs = [(memories[q] + grads[q]).astype(np.float32) for q in range(P)]
        expected = ref.REFERENCES[name].expected(accs, comp.k, density, options, step)
        np.testing.assert_allclose(flat.numpy().astype(np.float64) * P, expected.total, rtol=1e-5, atol=1e-5,
                                   err_msg=where)
        assert all(np.array_equal(x, flat.numpy()) for x in comm.allgather_object(flat.numpy())), \
            f"{where}: ranks disagree"
        for q in range(P):
            sent = np.zeros(N, np.float64)
            sent[expected.applied[q]] = accs[q][expected.applied[q]]
            memories[q] = ((1 - beta) * memories[q].astype(np.float64) + beta * (accs[q] - sent)).astype(np.float32)
        np.testing.assert_allclose(comp.memory.owed.numpy(), memories[rank], rtol=1e-5, atol=1e-5, err_msg=where)
        memories = comm.allgather_object(comp.memory.owed.numpy().copy())  # carried on from the compressor's bits
        if beta == 1.0:
            assert torch.equal(flat, flat_plain), f"{where}: beta = 1 is not error feedback's update"
            assert torch.equal(comp.memory.owed, plain.residual), f"{where}: beta = 1 is not error feedback's residual"


def run_cases(comm):
    for name, density, options in CASES:
        for nesterov in (False, True):
            check_case(comm, name, density, options, nesterov)
        if comm.rank == 0:
            print(f"ok ef21 {name} density={density} P={comm.size}", flush=True)
    for nesterov in (False, True):
        check_resume(comm, nesterov)
    if comm.rank == 0:
        print(f"ok ef21 resume P={comm.size}", flush=True)
    for name, options in (("cltk", {}), ("oktopk", ref.EXACT_OKTOPK)):
        for beta in (0.1, 1.0):
            check_lowpass(comm, name, 0.02, options, beta)
        if comm.rank == 0:
            print(f"ok lowpass {name} P={comm.size}", flush=True)


def main():
    comm = Communicator()
    run_or_abort(comm, run_cases, comm)


if __name__ == "__main__":
    main()
