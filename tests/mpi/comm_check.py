"""The Communicator's results and its byte/message counters, at whatever P it runs with.

    mpiexec -n P python -m tests.mpi.comm_check          # P = 1..4
    python -m tests.mpi.comm_check --no-mpi              # the fallback when mpi4py is missing

Results are compared with numpy computed from every rank's inputs (each rank derives any rank's
input from its seed); counters with the DESIGN 3 closed forms, exactly:
  allreduce of n elements: 2n(P-1)/P elements sent and received, 2(P-1) messages each way;
  allgatherv: my part to each of the P-1 others, the others' parts received;
  alltoallv and point-to-point: exactly what leaves and what arrives;
  a size exchange (allgather_int, the sizes before alltoallv, alltoall_counts): 8(P-1) bytes as 'meta'.
Any failure aborts all ranks with a non-zero exit code.
"""
import sys

if "--no-mpi" in sys.argv:
    sys.modules["mpi4py"] = None  # importing it now raises ImportError: the one-process fallback

import numpy as np
import torch

from sparse_asr.comm import Communicator
from sparse_asr.comm.communicator import CommCounts
from tests.reference import meta_bytes, ring_allreduce_bytes
from sparse_asr.training.runtime import run_or_abort


def values(rank: int, n: int, dtype) -> np.ndarray:
    x = np.random.default_rng(rank).standard_normal(n) * 100
    return x.astype(dtype)


def expect(comm, op, before_total, before_op, sent, recv, msgs_sent, msgs_recv, where):
    """The totals and the op's counters grew by exactly these amounts."""
    for got in (comm.counts() - before_total, comm.counts(op) - before_op):
        assert (got.bytes_sent, got.bytes_recv, got.msgs_sent, got.msgs_recv) == (sent, recv, msgs_sent, msgs_recv), (
            where, got, (sent, recv, msgs_sent, msgs_recv))
        assert got.seconds >= 0.0, where


def snapshot(comm, op):
    return comm.counts(), comm.counts(op)


def check_allreduce(comm):
    P, r = comm.size, comm.rank
    n = 1001  # not a multiple of P
    for dtype, torch_dtype in [(np.float32, torch.float32), (np.float64, torch.float64), (np.int64, torch.int64)]:
        everyone = [values(q, n, dtype) for q in range(P)]
        for op, reduce in [("sum", np.sum), ("max", np.max), ("min", np.min)]:
            t = torch.from_numpy(everyone[r].copy())
            assert t.dtype == torch_dtype
            before = snapshot(comm, "allreduce")
            out = comm.allreduce_(t, op=op)
            assert out is t, "allreduce_ works in place"
            expected = reduce(np.stack(everyone), axis=0)
            if op == "sum" and dtype is not np.int64:  # MPI may add in another order
                tol = 1e-5 if dtype is np.float32 else 1e-12
                np.testing.assert_allclose(t.numpy(), expected, rtol=tol, atol=tol * 1e3)
            else:
                assert np.array_equal(t.numpy(), expected.astype(dtype)), (op, dtype)
            nbytes = ring_allreduce_bytes(n, P, t.element_size())
            assert nbytes == 2 * n * t.element_size() * (P - 1) // P
            expect(comm, "allreduce", *before, nbytes, nbytes, 2 * (P - 1), 2 * (P - 1), f"allreduce {op} {dtype}")
    # counted under another op name when asked (BatchNorm's statistics as "syncbn"), and in the totals
    t = torch.from_numpy(values(r, n, np.float64))
    before, before_allreduce = snapshot(comm, "syncbn"), comm.counts("allreduce")
    comm.allreduce_(t, count_as="syncbn")
    np.testing.assert_allclose(t.numpy(), np.sum([values(q, n, np.float64) for q in range(P)], axis=0), rtol=1e-12)
    nbytes = ring_allreduce_bytes(n, P, 8)
    expect(comm, "syncbn", *before, nbytes, nbytes, 2 * (P - 1), 2 * (P - 1), "allreduce counted as syncbn")
    assert (comm.counts("allreduce") - before_allreduce).bytes_recv == 0, "counted under 'allreduce' too"
    try:  # MPI has no bfloat16 sum: refused instead of adding bit patterns as integers
        comm.allreduce_(torch.ones(3, dtype=torch.bfloat16))
    except TypeError:
        pass
    else:
        raise AssertionError("allreduce_ of bfloat16 did not raise")


def check_allgatherv(comm):
    P, r = comm.size, comm.rank
    counts = [(3 * q) % 5 for q in range(P)]  # rank 0 sends nothing
    everyone = [values(q, counts[q], np.float32) for q in range(P)]
    for known in (False, True):
        t = torch.from_numpy(everyone[r].copy())
        before = snapshot(comm, "allgatherv")
        meta_before = comm.counts("meta")
        out, got_counts = comm.allgatherv(t, counts=counts if known else None)
        assert got_counts == counts, (got_counts, counts)
        assert np.array_equal(out.numpy(), np.concatenate(everyone)), "allgatherv result"
        mine = counts[r] * 4
        expect(comm, "allgatherv", before[0] + (comm.counts("meta") - meta_before), before[1],
               mine * (P - 1), (sum(counts) - counts[r]) * 4, P - 1, P - 1, f"allgatherv known={known}")
        meta = comm.counts("meta") - meta_before
        expected_meta = 0 if known else meta_bytes(P)
        assert (meta.bytes_sent, meta.bytes_recv) == (expected_meta, expected_meta), ("allgatherv size exchange", meta)
    # integers and raw bytes travel unchanged (the packed-pairs path)
    t = torch.arange(r * 10, r * 10 + 4, dtype=torch.int64).view(torch.uint8)
    out, _ = comm.allgatherv(t, counts=[32] * P)
    assert np.array_equal(out.view(torch.int64).numpy(),
                          np.concatenate([np.arange(q * 10, q * 10 + 4) for q in range(P)]))
    assert comm.allgather_int(r * 7 + 1) == [q * 7 + 1 for q in range(P)]


def check_alltoallv(comm):
    P, r = comm.size, comm.rank
    send_counts = lambda src: [(src + 2 * dst) % 3 for dst in range(P)]  # noqa: E731  (some zero)
    # element i of the block src -> dst encodes (src, dst, i)
    block = lambda src, dst: np.array([1000 * src + 10 * dst + i for i in range(send_counts(src)[dst])], np.float64)  # noqa: E731
    t = torch.from_numpy(np.concatenate([block(r, dst) for dst in range(P)]))
    before = snapshot(comm, "alltoallv")
    meta_before = comm.counts("meta")
    out, recv_counts = comm.alltoallv(t, send_counts(r))
    assert recv_counts == [send_counts(src)[r] for src in range(P)], recv_counts
    assert np.array_equal(out.numpy(), np.concatenate([block(src, r) for src in range(P)])), "alltoallv result"
    meta = comm.counts("meta") - meta_before
    sent = sum(c for dst, c in enumerate(send_counts(r)) if dst != r)
    recv = sum(c for src, c in enumerate(recv_counts) if src != r)
    msgs_s = sum(1 for dst, c in enumerate(send_counts(r)) if dst != r and c)
    msgs_r = sum(1 for src, c in enumerate(recv_counts) if src != r and c)
    expect(comm, "alltoallv", before[0] + meta, before[1], 8 * sent, 8 * recv, msgs_s, msgs_r, "alltoallv")
    expected_meta = meta_bytes(P)
    assert (meta.bytes_sent, meta.bytes_recv) == (expected_meta, expected_meta), ("alltoallv size exchange", meta)
    assert comm.alltoall_counts(send_counts(r)) == recv_counts


def check_p2p(comm):
    P, r = comm.size, comm.rank
    if P == 1:
        return
    right, left = (r + 1) % P, (r - 1) % P
    n_to = lambda src: 5 + src  # noqa: E731
    before = snapshot(comm, "p2p")
    send = torch.full((n_to(r),), float(r), dtype=torch.float32)
    recv = torch.empty(n_to(left), dtype=torch.float32)
    requests = [comm.irecv(recv, left, tag=3), comm.isend(send, right, tag=3)]
    comm.waitall(requests)
    assert torch.equal(recv, torch.full((n_to(left),), float(left))), "ring exchange"
    expect(comm, "p2p", *before, 4 * n_to(r), 4 * n_to(left), 1, 1, "p2p")


def check_bcast_and_objects(comm):
    P, r = comm.size, comm.rank
    root = P - 1
    t = torch.from_numpy(values(r, 9, np.float32))
    before = snapshot(comm, "bcast")
    comm.bcast_(t, root=root)
    assert np.array_equal(t.numpy(), values(root, 9, np.float32)), "bcast_"
    nbytes = 9 * 4
    expect(comm, "bcast", *before, nbytes * (P - 1) if r == root else 0, 0 if r == root else nbytes, 0, 0, "bcast")
    assert comm.bcast_object({"from": r}, root=root) == {"from": root}
    assert comm.allgather_object(("rank", r)) == [("rank", q) for q in range(P)]
    comm.barrier()


def check_split(comm):
    """The first `size` ranks form a communicator of their own; the others get None."""
    P, r = comm.size, comm.rank
    for size in sorted({1, max(1, P - 1), P}):
        sub = comm.split(size)
        if r >= size:
            assert sub is None, (size, r)
            continue
        assert (sub.size, sub.rank) == (size, r), (size, sub.size, sub.rank)
        t = torch.tensor([float(r + 1)])
        sub.allreduce_(t)
        assert t.item() == size * (size + 1) / 2, (size, t)  # only the members' values
        assert sub.counts().bytes_recv == ring_allreduce_bytes(1, size, 4), "a fresh communicator counts its own"
    comm.barrier()


def check_accounting(comm):
    """Totals are the sum over operations; subtraction gives a phase's figures."""
    totals = comm.counts()
    summed = CommCounts()
    for c in comm.per_op().values():
        summed = summed + c
    assert (summed.bytes_sent, summed.bytes_recv, summed.msgs_sent, summed.msgs_recv) == (
        totals.bytes_sent, totals.bytes_recv, totals.msgs_sent, totals.msgs_recv), (summed, totals)
    zero = totals - totals
    assert (zero.bytes_sent, zero.bytes_recv, zero.msgs_sent, zero.seconds) == (0, 0, 0, 0.0)
    if comm.size == 1:
        assert totals.bytes_sent == totals.bytes_recv == 0, "one process moves nothing"


def main():
    torch.set_num_threads(1)
    comm = Communicator()
    if "--no-mpi" in sys.argv:
        assert comm._comm is None and comm.size == 1, "fallback expected without mpi4py"
    run_or_abort(comm, run_checks, comm)  # a failed assertion on any rank ends every rank


def run_checks(comm):
    for check in (check_allreduce, check_allgatherv, check_alltoallv, check_p2p, check_bcast_and_objects, check_split,
                  check_accounting):
        check(comm)
    if comm.rank == 0:
        print(f"ok communicator P={comm.size}", flush=True)


if __name__ == "__main__":
    main()
