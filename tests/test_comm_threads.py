"""sparse_asr/comm/threads.py: P simulated ranks as threads in one process, each with the project's Communicator.

They must pass the checks MPI ranks pass under mpiexec: tests/mpi/comm_check.py (results and exact byte and
message counts of every call) and tests/mpi/compressor_check.py (every registered compressor against its
numpy reference: updates, residuals exactly, mass conservation, exact volumes), at P = 1..4. Where a sum has
at most two terms its order cannot matter, so there the updates are bitwise those of MPI ranks. A failing
rank, a missing collective and a missing message end the run with an error instead of a hang.
"""
import time

import numpy as np
import pytest
import torch

from sparse_asr.comm import ThreadGroup
from sparse_asr.comm.threads import GroupBroken
from sparse_asr.compression import COMPRESSORS, build_compressor
from tests import reference as ref
from tests.mpi import comm_check, compressor_check

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("one_thread")]  # tests/conftest.py

# every check of comm_check but check_split (a thread group does not split: make one of the size needed)
COMM_CHECKS = [comm_check.check_allreduce, comm_check.check_allgatherv, comm_check.check_alltoallv,
               comm_check.check_p2p, comm_check.check_bcast_and_objects, comm_check.check_accounting]


@pytest.mark.parametrize("P", [1, 2, 3, 4])
def test_thread_ranks_pass_the_communicator_checks(P):
    def checks(comm):
        for check in COMM_CHECKS:
            check(comm)
        return comm.counts()

    counts = ThreadGroup(P, timeout_s=60).run(checks)
    if P > 1:  # they did communicate, and counted it
        assert all(c.bytes_recv > 0 and c.msgs_recv > 0 for c in counts)


@pytest.mark.parametrize("P", [1, 2, 3, 4])
def test_every_compressor_matches_its_reference_on_thread_ranks(P):
    """compressor_check's whole run (every registered algorithm and case, 20 steps each, and compression.dense_1d)
    on P thread ranks: update = reference sum / P (bitwise at P = 1) and the same bits on every rank, residual
    exactly acc minus the reference's applied entries, conservation, exact bytes sent and received."""
    ThreadGroup(P, timeout_s=120).run(compressor_check.run_cases)


def step_on_threads(group, compressors, grads) -> list[np.ndarray]:
    def step(comm):
        flat = torch.from_numpy(grads[comm.rank].copy())
        compressors[comm.rank].step(flat)
        return flat.numpy()

    return group.run(step)


@pytest.mark.parametrize("name", list(COMPRESSORS))
def test_two_thread_ranks_give_the_exactly_rounded_sum(name):
    """At P = 2 a sum has two terms, so every correct summation order (MPI's included) gives the float32 of the
    exact sum: the updates must be bitwise reference sum / 2 (the reference sums in float64, exactly here), where
    the reference computes the compressor's float32 operations (Expected.exact; onebit's scales are float64 means)."""
    reference = ref.REFERENCES[name]
    density, options = reference.cases[0]
    N = compressor_check.N
    group = ThreadGroup(2, timeout_s=60)
    compressors = [build_compressor(name, comm, N, density, **options) for comm in group.comms]
    residuals = [np.zeros(N, np.float32) for _ in range(2)]
    for step in range(6):
        grads = [compressor_check.gradient(step, r) for r in range(2)]
        accs = [residuals[r] + grads[r] for r in range(2)]
        before = {} if reference.state is None else {"before": [reference.state(c) for c in compressors]}
        expected = reference.expected(accs, compressors[0].k, density, options, step, **before)
        updates = step_on_threads(group, compressors, grads)
        assert np.array_equal(updates[0], updates[1]), (name, step)
        if expected.exact:
            assert np.array_equal(updates[0] * 2, expected.total.astype(np.float32)), (name, step)
        else:
            np.testing.assert_allclose(updates[0] * 2.0, expected.total, rtol=1e-5, atol=1e-5, err_msg=f"{name} {step}")
        residuals = [c.residual.numpy().copy() if hasattr(c, "residual") else np.zeros(N, np.float32)
                     for c in compressors]


def test_a_failing_rank_ends_every_rank_with_its_own_error():
    group = ThreadGroup(4, timeout_s=30)

    def fn(comm):
        if comm.rank == 2:
            raise ValueError("boom")
        comm.allreduce_(torch.ones(3))  # the others wait here for rank 2, which never comes

    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="boom") as info:
        group.run(fn)
    assert time.perf_counter() - t0 < 10, "the waiting ranks were not released at once"
    assert any("simulated rank 2 of 4" in note for note in info.value.__notes__)
    with pytest.raises(GroupBroken):  # its ranks' state is no longer consistent
        group.run(lambda comm: None)


def test_a_rank_missing_a_collective_or_a_message_times_out():
    def skips_allreduce(comm):
        if comm.rank == 0:
            comm.allreduce_(torch.ones(3))

    with pytest.raises(TimeoutError, match="Allreduce"):
        ThreadGroup(2, timeout_s=0.5).run(skips_allreduce)

    def receives_nothing(comm):
        if comm.rank == 1:
            comm.waitall([comm.irecv(torch.empty(4), source=0, tag=9)])

    with pytest.raises(TimeoutError, match="no message from rank 0"):
        ThreadGroup(2, timeout_s=0.5).run(receives_nothing)


def test_ranks_in_different_collectives_raise():
    def mismatched(comm):
        if comm.rank == 0:
            comm.allreduce_(torch.ones(4))
        else:
            comm.allgatherv(torch.ones(4), counts=[4, 4])

    with pytest.raises(RuntimeError, match="called Allreduce while rank 1 called Allgatherv|called Allgatherv while "
                                           "rank 0 called Allreduce"):
        ThreadGroup(2, timeout_s=5).run(mismatched)


def test_messages_arrive_in_the_order_sent_with_their_exact_size():
    """Receives from one rank with one tag match its sends in order (MPI's non-overtaking rule), whatever order
    they are waited in; the sender may reuse its buffer at once (sends are buffered); a wrong size is an error."""
    def exchange(comm):
        if comm.rank == 0:
            buf = torch.zeros(4)
            for value in (1.0, 2.0, 3.0):
                buf.fill_(value)
                comm.waitall([comm.isend(buf, dest=1, tag=5)])
            comm.waitall([comm.isend(torch.zeros(2), dest=1, tag=6)])
            return None
        got = [torch.empty(4) for _ in range(3)]
        requests = [comm.irecv(t, source=0, tag=5) for t in got]
        comm.waitall(requests[::-1])
        return [t.tolist() for t in got]

    group = ThreadGroup(2, timeout_s=5)
    with pytest.raises(ValueError, match="posted a receive of 12 bytes"):
        def with_wrong_size(comm):
            out = exchange(comm)
            if comm.rank == 1:
                assert out == [[1.0] * 4, [2.0] * 4, [3.0] * 4], out
                comm.waitall([comm.irecv(torch.empty(3), source=0, tag=6)])

        group.run(with_wrong_size)


def test_object_collectives_hand_over_copies():
    def fn(comm):
        mine = {"rank": comm.rank, "items": [comm.rank]}
        everyone = comm.allgather_object(mine)
        everyone[1 - comm.rank]["items"].append("changed by the receiver")
        comm.barrier()
        return mine

    assert ThreadGroup(2).run(fn) == [{"rank": 0, "items": [0]}, {"rank": 1, "items": [1]}]
