"""One small interface over mpi4py, plus a one-process fallback.

Every collective takes and returns torch tensors. Each call is timed and its traffic counted
at the *application level* (DESIGN 3), independent of the algorithm MPI uses internally:
  - allreduce of n elements: the ring cost, 2n(P-1)/P elements sent and received;
  - allgatherv: a rank sends its part to the P-1 others and receives the others' parts;
  - alltoallv and point-to-point: exactly what leaves and what arrives.
A compressor measures a phase with `with comm.measure() as moved:` (the one byte counter; `counts()` is the
running total the benches read).
"""
from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, fields

import numpy as np
import torch

from sparse_asr.comm.mpi import load_mpi


@dataclass
class CommCounts:
    """Traffic of one rank. Supports `a - b` to measure a phase."""

    bytes_sent: int = 0
    bytes_recv: int = 0
    msgs_sent: int = 0
    msgs_recv: int = 0
    seconds: float = 0.0

    def __sub__(self, other: "CommCounts") -> "CommCounts":
        return CommCounts(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)})

    def __add__(self, other: "CommCounts") -> "CommCounts":
        return CommCounts(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})


class _Request:
    """A pending point-to-point transfer; `waitall` completes it (and copies CUDA results back)."""

    def __init__(self, mpi_request, host: torch.Tensor, target: torch.Tensor | None):
        self.mpi_request = mpi_request
        self.host = host  # keeps the staged buffer alive until completion
        self.target = target  # CUDA tensor to fill after an irecv, else None


class _Heartbeat:
    """An mpi4py communicator whose every call records itself while it runs: `in_flight` is (call name,
    call number) or None. training/runtime.py's Watchdog reads it from another thread to tell a call that
    never ends (a rank stopped, hung or dead) from a slow run."""

    def __init__(self, mpi_comm):
        self._comm = mpi_comm
        self.in_flight = None
        self._calls = 0

    def call(self, name: str, fn, *args, **kwargs):
        self._calls += 1
        self.in_flight = (name, self._calls)
        try:
            return fn(*args, **kwargs)
        finally:
            self.in_flight = None

    def __getattr__(self, name):
        attribute = getattr(self._comm, name)
        if not callable(attribute):
            return attribute
        return lambda *args, **kwargs: self.call(name, attribute, *args, **kwargs)


class Communicator:
    """DESIGN 3. `Communicator()` uses MPI.COMM_WORLD when mpi4py is importable, else one process."""

    def __init__(self, cuda_aware: bool = False, mpi_comm=None):
        self.cuda_aware = cuda_aware
        self._mpi = None
        self._comm = None
        if mpi_comm is not None:
            self._mpi, self._comm = load_mpi(), mpi_comm
        else:
            try:
                MPI = load_mpi()
            except ImportError:  # one process, no MPI installed: same code path with P = 1
                MPI = None
            if MPI is not None:
                self._mpi, self._comm = MPI, MPI.COMM_WORLD
        if self._comm is not None:
            self._comm = _Heartbeat(self._comm)
        self.rank = self._comm.Get_rank() if self._comm is not None else 0
        self.size = self._comm.Get_size() if self._comm is not None else 1
        self._totals = CommCounts()
        self._per_op: dict[str, CommCounts] = {}

    @property
    def in_flight(self) -> tuple[str, int] | None:
        """(MPI call, call number) while an MPI call runs, else None (see _Heartbeat)."""
        return None if self._comm is None else self._comm.in_flight

    # ------------------------------------------------------------------ accounting
    def counts(self, op: str | None = None) -> CommCounts:
        """A copy of the running totals (all operations, or one operation by name)."""
        c = self._totals if op is None else self._per_op.get(op, CommCounts())
        return CommCounts(**{f.name: getattr(c, f.name) for f in fields(c)})

    def per_op(self) -> dict[str, CommCounts]:
        return {op: self.counts(op) for op in self._per_op}

    @contextmanager
    def measure(self):
        """`with comm.measure() as moved: ...`: afterwards `moved` holds the traffic of the block (a CommCounts)."""
        before = self.counts()
        moved = CommCounts()
        yield moved
        for f in fields(moved):
            setattr(moved, f.name, getattr(self._totals, f.name) - getattr(before, f.name))

    def _count(self, op: str, t0: float, sent: int, recv: int, msgs_sent: int, msgs_recv: int):
        delta = CommCounts(sent, recv, msgs_sent, msgs_recv, time.perf_counter() - t0)
        self._totals = self._totals + delta
        self._per_op[op] = self._per_op.get(op, CommCounts()) + delta

    # ------------------------------------------------------------------ staging
    def _host(self, t: torch.Tensor) -> torch.Tensor:
        """A contiguous CPU tensor MPI can read (CUDA tensors staged through pinned memory)."""
        if t.is_cuda and not self.cuda_aware:
            host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            host.copy_(t)
            return host
        return t.contiguous()

    def _empty(self, n: int, like: torch.Tensor) -> torch.Tensor:
        if like.is_cuda and not self.cuda_aware:
            return torch.empty(n, dtype=like.dtype, pin_memory=True)
        return torch.empty(n, dtype=like.dtype, device=like.device)

    def _buf(self, t: torch.Tensor):
        """mpi4py buffer spec for a contiguous tensor (CPU: numpy view; CUDA-aware: the tensor)."""
        if t.is_cuda:
            # MPI reads and writes device memory outside CUDA's stream order: let the kernels that
            # produce (or last used) this buffer finish first.
            torch.cuda.current_stream(t.device).synchronize()
            return t
        return t.numpy() if t.dtype != torch.bfloat16 else t.view(torch.int16).numpy()

    @staticmethod
    def _back(result: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return result.to(like.device, non_blocking=False) if result.device != like.device else result

    # ------------------------------------------------------------------ collectives
    def allreduce_(self, t: torch.Tensor, op: str = "sum", count_as: str = "allreduce") -> torch.Tensor:
        """In-place allreduce (sum, max or min). Counted as a ring: 2n(P-1)/P elements each way, in the
        totals and under the per-op name `count_as` (e.g. "syncbn" keeps BatchNorm traffic apart)."""
        if t.dtype == torch.bfloat16:  # _buf passes it as int16, which MPI would add as integers
            raise TypeError("allreduce_ of bfloat16 is not supported (MPI has no bfloat16 sum): cast to float32")
        t0 = time.perf_counter()
        if self.size > 1:
            host = self._host(t)
            mpi_op = {"sum": self._mpi.SUM, "max": self._mpi.MAX, "min": self._mpi.MIN}[op]
            self._comm.Allreduce(self._mpi.IN_PLACE, self._buf(host), op=mpi_op)
            if host.data_ptr() != t.data_ptr():
                t.copy_(host)
        P = self.size
        nbytes = 2 * t.numel() * t.element_size() * (P - 1) // P
        self._count(count_as, t0, nbytes, nbytes, 2 * (P - 1), 2 * (P - 1))
        return t

    def allgatherv(self, t: torch.Tensor, counts: list[int] | None = None) -> tuple[torch.Tensor, list[int]]:
        """Concatenate every rank's 1-D tensor in rank order. Pass `counts` when every rank knows
        them already (saves the small count exchange, which is counted separately otherwise)."""
        if counts is None:
            counts = self.allgather_int(t.numel())
        t0 = time.perf_counter()
        total = sum(counts)
        if self.size == 1:
            out = t.contiguous().clone()
        else:
            host = self._host(t)
            out = self._empty(total, t)
            displs = np.concatenate([[0], np.cumsum(counts[:-1])]).astype(np.int64)
            self._comm.Allgatherv(self._buf(host), [self._buf(out), (counts, displs)])
            out = self._back(out, t)
        item = t.element_size()
        mine = counts[self.rank]
        P = self.size
        self._count("allgatherv", t0, mine * item * (P - 1), (total - mine) * item, P - 1, P - 1)
        return out, list(counts)

    def allgather_int(self, value: int) -> list[int]:
        """Every rank's integer, in rank order (e.g. message sizes). Counted as op 'meta'."""
        return [v[0] for v in self.allgather_ints([value])]

    def allgather_ints(self, values: list[int]) -> list[list[int]]:
        """Every rank's list of integers (the same length on every rank), in rank order, in one
        exchange. Counted as op 'meta': 8 bytes per integer from each other rank."""
        t0 = time.perf_counter()
        if self.size == 1:
            return [[int(v) for v in values]]
        P, m = self.size, len(values)
        buf = np.empty((P, m), dtype=np.int64)
        self._comm.Allgather(np.array(values, dtype=np.int64), buf)
        self._count("meta", t0, 8 * m * (P - 1), 8 * m * (P - 1), P - 1, P - 1)
        return buf.tolist()

    def alltoallv(self, t: torch.Tensor, send_counts: list[int]) -> tuple[torch.Tensor, list[int]]:
        """Rank r sends t[displ_j : displ_j + send_counts[j]] to rank j; returns what arrived, in
        source-rank order, and the count from each source. Sizes are exchanged first (op 'meta')."""
        assert len(send_counts) == self.size and sum(send_counts) == t.numel(), (send_counts, t.numel())
        if self.size == 1:
            return t.contiguous().clone(), list(send_counts)
        recv_counts = np.asarray(self.alltoall_counts(send_counts), dtype=np.int64)
        t0 = time.perf_counter()
        host = self._host(t)
        out = self._empty(int(recv_counts.sum()), t)
        sdispl = np.concatenate([[0], np.cumsum(send_counts[:-1])]).astype(np.int64)
        rdispl = np.concatenate([[0], np.cumsum(recv_counts[:-1])]).astype(np.int64)
        self._comm.Alltoallv([self._buf(host), (np.asarray(send_counts), sdispl)],
                             [self._buf(out), (recv_counts, rdispl)])
        item = t.element_size()
        r = self.rank
        sent = (sum(send_counts) - send_counts[r]) * item
        recv = int(recv_counts.sum() - recv_counts[r]) * item
        msgs_s = sum(1 for j, c in enumerate(send_counts) if j != r and c > 0)
        msgs_r = sum(1 for j, c in enumerate(recv_counts) if j != r and c > 0)
        self._count("alltoallv", t0, sent, recv, msgs_s, msgs_r)
        return self._back(out, t), [int(c) for c in recv_counts]

    # ------------------------------------------------------------------ point to point
    def isend(self, t: torch.Tensor, dest: int, tag: int = 0) -> _Request:
        t0 = time.perf_counter()
        host = self._host(t)
        req = self._comm.Isend(self._buf(host), dest=dest, tag=tag)
        self._count("p2p", t0, t.numel() * t.element_size(), 0, 1, 0)
        return _Request(req, host, None)

    def irecv(self, t: torch.Tensor, source: int, tag: int = 0) -> _Request:
        """Receive into `t` (its size must be known, e.g. from `alltoall_counts`)."""
        t0 = time.perf_counter()
        host = self._empty(t.numel(), t) if (t.is_cuda and not self.cuda_aware) else t
        req = self._comm.Irecv(self._buf(host), source=source, tag=tag)
        self._count("p2p", t0, 0, t.numel() * t.element_size(), 0, 1)
        return _Request(req, host, t if host is not t else None)

    def waitall(self, requests: list[_Request]) -> None:
        t0 = time.perf_counter()
        if requests:
            self._comm.call("Waitall", self._mpi.Request.Waitall, [r.mpi_request for r in requests])
        for r in requests:
            if r.target is not None:
                r.target.copy_(r.host.view_as(r.target))
        self._count("p2p", t0, 0, 0, 0, 0)

    def alltoall_counts(self, send_counts: list[int]) -> list[int]:
        """How many elements each rank will send me, given what I send each rank (op 'meta')."""
        if self.size == 1:
            return list(send_counts)
        t0 = time.perf_counter()
        recv = np.empty(self.size, dtype=np.int64)
        self._comm.Alltoall(np.asarray(send_counts, dtype=np.int64), recv)
        P = self.size
        self._count("meta", t0, 8 * (P - 1), 8 * (P - 1), P - 1, P - 1)
        return [int(c) for c in recv]

    # ------------------------------------------------------------------ control plane
    def bcast_(self, t: torch.Tensor, root: int = 0) -> torch.Tensor:
        """In-place broadcast of a tensor from `root` (model and optimizer state at start)."""
        t0 = time.perf_counter()
        if self.size > 1:
            host = self._host(t)
            self._comm.Bcast(self._buf(host), root=root)
            if host.data_ptr() != t.data_ptr():
                t.copy_(host)
        nbytes = t.numel() * t.element_size()
        P = self.size
        self._count("bcast", t0, nbytes * (P - 1) if self.rank == root else 0, 0 if self.rank == root else nbytes, 0, 0)
        return t

    # ------------------------------------------------------------------ small reductions (logging, benches)
    def gather_rows(self, vec: torch.Tensor) -> torch.Tensor:
        """Every rank's small 1-D tensor (same length everywhere) as a (P, len) table: one collective,
        no size exchange."""
        table, _ = self.allgatherv(vec.contiguous(), counts=[vec.numel()] * self.size)
        return table.view(self.size, -1)

    def mean_and_max(self, mine: dict[str, float]) -> dict[str, float]:
        """Collective: {key_mean, key_max} over ranks of each of this rank's figures."""
        keys = sorted(mine)
        table = self.gather_rows(torch.tensor([float(mine[k]) for k in keys], dtype=torch.float64))
        out = {}
        for i, key in enumerate(keys):
            out[f"{key}_mean"] = table[:, i].mean().item()
            out[f"{key}_max"] = table[:, i].max().item()
        return out

    def bcast_object(self, obj, root: int = 0):
        return obj if self.size == 1 else self._comm.bcast(obj, root=root)

    def allgather_object(self, obj) -> list:
        return [obj] if self.size == 1 else self._comm.allgather(obj)

    def gather_object(self, obj, root: int = 0) -> list | None:
        """Every rank's object on `root` (in rank order), None elsewhere (e.g. checkpoint state)."""
        return [obj] if self.size == 1 else self._comm.gather(obj, root=root)

    def split(self, size: int) -> "Communicator | None":
        """Collective: a Communicator over the first `size` ranks (None on the others), so one job can
        measure several world sizes (bench/bn_shards.py)."""
        if not 1 <= size <= self.size:
            raise ValueError(f"cannot split {size} ranks out of {self.size}")
        if self._comm is None:
            return Communicator(self.cuda_aware)
        member = self.rank < size
        sub = self._comm.Split(0 if member else self._mpi.UNDEFINED, self.rank)
        return Communicator(self.cuda_aware, mpi_comm=sub) if member else None

    def barrier(self) -> None:
        if self.size > 1:
            self._comm.Barrier()

    def abort(self, code: int = 1) -> None:
        """End every rank of the job now (used when one rank fails, so nobody hangs)."""
        sys.stdout.flush()
        sys.stderr.flush()
        if self.size > 1:
            self._comm.Abort(code)
        sys.exit(code)
