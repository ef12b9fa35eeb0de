"""P simulated ranks in one process: P Python threads, each with a real `Communicator`.

    group = ThreadGroup(4)
    results = group.run(fn, *args)    # fn(comm, *args) on every rank, each in its own thread; results in rank order

Each rank's communicator IS the project's `Communicator` (communicator.py): its interface, its staging and
its application-level byte and message counting (DESIGN 3) are the code an MPI run executes. Only the
transport under it differs: `_ThreadComm` implements the few mpi4py calls the Communicator makes
(Allreduce, Allgather(v), Alltoall(v), Bcast, Isend/Irecv/Waitall, the object collectives, Barrier)
with shared memory between the threads; `split` is not among them (make a ThreadGroup of the size needed).
No MPI call is made, but mpi4py must be importable: the Communicator imports it. Torch and numpy release the
GIL in their kernels, so the ranks' compute overlaps as far as the cores allow.

Semantics kept from MPI: collectives are called by every rank in the same order; point-to-point
messages between two ranks with the same tag arrive in the order they were sent (each send and each
receive takes the next sequence number of its (source, destination, tag)); sends are buffered (a copy
is taken at Isend), receives complete in Waitall and must have exactly the posted size. Sums add the
ranks' buffers once, in rank order, so every rank gets the same bits (MPI's summation order differs:
results agree with an MPI run to rounding, exactly where no sum has more than two terms).

No hangs: every wait has a timeout (`timeout_s`), and a rank that raises breaks the group, so every
other rank's pending call raises at once; `run` then re-raises the failing rank's own exception (noted
with its rank). A broken group refuses further runs: its ranks' state is no longer consistent.
"""
from __future__ import annotations

import pickle
import threading
from types import SimpleNamespace

import numpy as np

from sparse_asr.comm.communicator import Communicator


class GroupBroken(RuntimeError):
    """Raised in every rank's pending call once another rank of the group has failed."""


class ThreadGroup:
    """`size` simulated ranks; `comms[r]` is rank r's Communicator (use it only from rank r's thread)."""

    def __init__(self, size: int, timeout_s: float = 300.0):
        if size < 1:
            raise ValueError(f"a thread group needs at least one rank, got {size}")
        self.size, self.timeout_s = size, timeout_s
        self._barrier = threading.Barrier(size)
        self._slots: list = [None] * size  # each rank's contribution to the current collective
        self._shared = None  # a result computed once (by rank 0) for every rank, e.g. an allreduce's sum
        self._mail: dict[tuple[int, int, int, int], np.ndarray] = {}  # (source, dest, tag, seq) -> message
        self._sent: dict[tuple[int, int, int], int] = {}  # (source, dest, tag) -> messages sent so far
        self._posted: dict[tuple[int, int, int], int] = {}  # (source, dest, tag) -> receives posted so far
        self._mail_lock = threading.Condition()
        self._failure: str | None = None  # why the group broke
        self.comms = [ThreadCommunicator(self, r) for r in range(size)]

    def run(self, fn, *args) -> list:
        """fn(comm, *args) on every rank at once, each in its own thread; the results in rank order.
        If any rank raises, every rank stops and that exception is raised here."""
        if self._failure is not None:
            raise GroupBroken(f"this thread group broke earlier ({self._failure}): make a new one")
        results, errors = [None] * self.size, [None] * self.size

        def rank_main(rank: int) -> None:
            try:
                results[rank] = fn(self.comms[rank], *args)
            except BaseException as e:  # noqa: BLE001 -- re-raised by run() in the caller's thread
                errors[rank] = e
                self._break(f"rank {rank} raised {type(e).__name__}")

        threads = [threading.Thread(target=rank_main, args=(r,), name=f"sim-rank-{r}", daemon=True)
                   for r in range(self.size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        failed = [(r, e) for r, e in enumerate(errors) if e is not None]
        if failed:
            # The cause, not the GroupBroken errors it set off in the other ranks.
            rank, error = next(((r, e) for r, e in failed if not isinstance(e, GroupBroken)), failed[0])
            error.add_note(f"(on simulated rank {rank} of {self.size})")
            raise error
        return results

    # ------------------------------------------------------------------ synchronisation
    def _break(self, why: str) -> None:
        with self._mail_lock:
            if self._failure is None:
                self._failure = why
            self._mail_lock.notify_all()
        self._barrier.abort()

    def _wait(self, rank: int, what: str) -> None:
        """All ranks meet here (a barrier with the group's timeout)."""
        try:
            self._barrier.wait(self.timeout_s)
        except threading.BrokenBarrierError:
            if self._failure is not None:
                raise GroupBroken(f"rank {rank} in {what}: {self._failure}") from None
            self._break(f"rank {rank} timed out in {what}")
            raise TimeoutError(f"rank {rank}: {what} waited more than {self.timeout_s:g} s for the other "
                               f"ranks") from None

    def post(self, rank: int, value, what: str) -> list:
        """Phase 1 of a collective: publish `value`; returns every rank's once all have published. The
        caller may read them (never write them) until it calls `done`. Ranks in different collectives
        (a bug MPI may not even report) raise here."""
        self._slots[rank] = (what, value)
        self._wait(rank, what)
        calls = [call for call, _ in self._slots]
        if calls.count(what) != self.size:
            other = next(q for q, call in enumerate(calls) if call != what)
            raise RuntimeError(f"rank {rank} called {what} while rank {other} called {calls[other]}")
        return [value for _, value in self._slots]

    def done(self, rank: int, what: str) -> None:
        """Phase 2: every rank has finished reading the others' contributions (they may be reused)."""
        self._wait(rank, what)

    # ------------------------------------------------------------------ point to point
    def send(self, source: int, dest: int, tag: int, data: np.ndarray) -> None:
        with self._mail_lock:
            key = (source, dest, tag)
            seq = self._sent.get(key, 0)
            self._sent[key] = seq + 1
            self._mail[key + (seq,)] = data.copy()  # buffered: the sender may reuse its buffer at once
            self._mail_lock.notify_all()

    def post_receive(self, source: int, dest: int, tag: int) -> tuple[int, int, int, int]:
        with self._mail_lock:
            key = (source, dest, tag)
            seq = self._posted.get(key, 0)
            self._posted[key] = seq + 1
            return key + (seq,)

    def receive(self, key: tuple[int, int, int, int]) -> np.ndarray:
        """The message `key` names, waiting for it (with the group's timeout)."""
        with self._mail_lock:
            arrived = self._mail_lock.wait_for(lambda: key in self._mail or self._failure is not None,
                                               self.timeout_s)
            if key in self._mail:
                return self._mail.pop(key)
        source, dest, tag, _ = key
        if not arrived:
            self._break(f"rank {dest} timed out waiting for rank {source}")
            raise TimeoutError(f"rank {dest}: no message from rank {source} (tag {tag}) in {self.timeout_s:g} s")
        raise GroupBroken(f"rank {dest} waiting for rank {source}: {self._failure}")


class _Request:
    """What Isend/Irecv return; `Waitall` completes receives (sends are buffered, complete at once)."""

    def __init__(self, group: ThreadGroup, key=None, buf: np.ndarray | None = None):
        self.group, self.key, self.buf = group, key, buf

    def wait(self) -> None:
        if self.key is None:
            return
        data = self.group.receive(self.key)
        source, dest, tag, _ = self.key
        if data.nbytes != self.buf.nbytes:
            raise ValueError(f"rank {dest} posted a receive of {self.buf.nbytes} bytes from rank {source} (tag {tag}), "
                             f"the message has {data.nbytes}")
        self.buf.reshape(-1).view(np.uint8)[:] = data.reshape(-1).view(np.uint8)


def _waitall(requests: list[_Request]) -> None:
    for request in requests:
        request.wait()


# The names the Communicator reads from mpi4py's MPI module.
THREAD_MPI = SimpleNamespace(SUM=np.add, MAX=np.maximum, MIN=np.minimum, IN_PLACE=object(), UNDEFINED=-32766,
                             Request=SimpleNamespace(Waitall=_waitall))


def _copy(obj):
    """What an mpi4py object collective hands over: a copy (pickled and unpickled), never the sender's object."""
    return pickle.loads(pickle.dumps(obj))


class _ThreadComm:
    """The mpi4py communicator calls the Communicator makes, for rank `rank` of a ThreadGroup. Buffers
    are numpy arrays (the Communicator's `_buf`)."""

    def __init__(self, group: ThreadGroup, rank: int):
        self.group, self.rank = group, rank

    def Get_rank(self) -> int:
        return self.rank

    def Get_size(self) -> int:
        return self.group.size

    # ---------------------------------------------------------------- collectives on buffers
    def Allreduce(self, sendbuf, recvbuf, op) -> None:
        if sendbuf is not THREAD_MPI.IN_PLACE:
            raise NotImplementedError("only in-place Allreduce (what Communicator.allreduce_ uses)")
        g, r = self.group, self.rank
        values = g.post(r, recvbuf, "Allreduce")
        if r == 0:  # one sum, in rank order, for everyone: every rank gets the same bits
            total = values[0].copy()
            for v in values[1:]:
                op(total, v, out=total)
            g._shared = total
        g.done(r, "Allreduce")
        np.copyto(recvbuf, g._shared)  # rank 0 replaces _shared only after everyone joins the next collective

    def Allgather(self, sendbuf, recvbuf) -> None:
        values = self.group.post(self.rank, sendbuf, "Allgather")
        recvbuf.reshape(-1)[:] = np.concatenate([v.reshape(-1) for v in values])
        self.group.done(self.rank, "Allgather")

    def Allgatherv(self, sendbuf, recvspec) -> None:
        recvbuf, (counts, displs) = recvspec
        values = self.group.post(self.rank, sendbuf, "Allgatherv")
        for q, v in enumerate(values):
            if v.size != counts[q]:
                raise ValueError(f"Allgatherv: rank {q} sends {v.size} elements, rank {self.rank} expects {counts[q]}")
            recvbuf[displs[q]:displs[q] + counts[q]] = v
        self.group.done(self.rank, "Allgatherv")

    def Alltoall(self, sendbuf, recvbuf) -> None:
        values = self.group.post(self.rank, sendbuf, "Alltoall")
        recvbuf[:] = [v[self.rank] for v in values]
        self.group.done(self.rank, "Alltoall")

    def Alltoallv(self, sendspec, recvspec) -> None:
        sendbuf, (send_counts, send_displs) = sendspec
        recvbuf, (recv_counts, recv_displs) = recvspec
        r = self.rank
        values = self.group.post(r, (sendbuf, send_counts, send_displs), "Alltoallv")
        for q, (buf, counts, displs) in enumerate(values):
            if counts[r] != recv_counts[q]:
                raise ValueError(f"Alltoallv: rank {q} sends {counts[r]} elements to rank {r}, which expects "
                                 f"{recv_counts[q]}")
            recvbuf[recv_displs[q]:recv_displs[q] + recv_counts[q]] = buf[displs[r]:displs[r] + counts[r]]
        self.group.done(r, "Alltoallv")

    def Bcast(self, buf, root: int = 0) -> None:
        values = self.group.post(self.rank, buf, "Bcast")
        if self.rank != root:
            np.copyto(buf, values[root])
        self.group.done(self.rank, "Bcast")

    def Barrier(self) -> None:
        self.group.post(self.rank, None, "Barrier")
        self.group.done(self.rank, "Barrier")  # no rank posts again while another still reads the slots

    # ---------------------------------------------------------------- collectives on objects
    def bcast(self, obj, root: int = 0):
        values = self.group.post(self.rank, obj if self.rank == root else None, "bcast")
        result = obj if self.rank == root else _copy(values[root])
        self.group.done(self.rank, "bcast")
        return result

    def allgather(self, obj) -> list:
        values = self.group.post(self.rank, obj, "allgather")
        result = [_copy(v) for v in values]
        self.group.done(self.rank, "allgather")
        return result

    def gather(self, obj, root: int = 0):
        values = self.group.post(self.rank, obj, "gather")
        result = [_copy(v) for v in values] if self.rank == root else None
        self.group.done(self.rank, "gather")
        return result

    # ---------------------------------------------------------------- point to point
    def Isend(self, buf, dest: int, tag: int = 0) -> _Request:
        self.group.send(self.rank, dest, tag, buf)
        return _Request(self.group)

    def Irecv(self, buf, source: int, tag: int = 0) -> _Request:
        return _Request(self.group, self.group.post_receive(source, self.rank, tag), buf)

    # ---------------------------------------------------------------- the rest
    def Split(self, color, key):
        raise NotImplementedError("a ThreadGroup's communicators do not split: make a ThreadGroup of the size you need")

    def Abort(self, code: int = 1):
        self.group._break(f"rank {self.rank} called abort({code})")
        raise RuntimeError(f"rank {self.rank} called abort({code})")


class ThreadCommunicator(Communicator):
    """The project's Communicator over a ThreadGroup's shared memory instead of MPI (module docstring)."""

    def __init__(self, group: ThreadGroup, rank: int):
        super().__init__(mpi_comm=_ThreadComm(group, rank))
        self._mpi = THREAD_MPI  # the MPI constants and Request.Waitall the Communicator's calls use
