"""The Compressor interface (DESIGN 3) and the error-feedback step every sparse algorithm shares.

A compressor turns each rank's flat gradient into the averaged global update, in place:

    stats = compressor.step(flat_grad)   # afterwards flat_grad == global update on every rank

Every compressor has the same constructor, `Cls(comm, numel, density, device=..., shapes=..., **options)`:
`shapes` are the parameters' shapes in flat-buffer order (only algorithms that work per tensor look at
them) and `options` are the algorithm's own settings (compression.options.* in a config), declared as the
fields of its `Options` dataclass with the same `setting(default, rule, must)` as the rest of the config and
checked by the same checker (sparse_asr/settings.py), for the constructor and the config loader alike. Each
algorithm also states its closed-form volume (`cost`), which the benchmarks and the tests use.

Sparse algorithms only implement `exchange(acc)`: given the accumulated gradient
acc = grad + residual, select, communicate, and say which global entries get which summed value
and which of *this rank's* entries were applied (a SparseUpdate). The base class does the rest,
identically for every algorithm: output = values / P at the global indices, and residual = acc with
exactly the applied local entries zeroed (what was selected locally but dropped globally stays).

`step` takes a finite gradient: the trainer checks it once per step and skips the step on every rank
together when any rank's is not (a compressor cannot: its collectives would deadlock), so no
non-finite value ever enters a residual. Wrappers (CompressorWrapper: the dense warm-up, the 1-D
parameters) put dense allreduce beside another compressor and delegate the rest to it.
"""
from __future__ import annotations

import math
import time
import typing
from dataclasses import dataclass, field

import torch

from sparse_asr.comm.communicator import CommCounts, Communicator
from sparse_asr.compression import kernels
from sparse_asr.compression.memory import ErrorFeedback
from sparse_asr.compression.selection import threshold_select
from sparse_asr.settings import build


@dataclass(frozen=True)  # built once per step by the compressor; never edited afterwards
class StepStats:
    """What one `step()` did. Every field is defined from the first step on (never NaN)."""

    algorithm: str
    dense: bool
    numel: int
    k: int  # target number of entries (numel for dense)
    selected_local: int  # entries this rank selected
    selected_global: int  # entries in the global update
    bytes_sent: int
    bytes_recv: int
    messages: int  # messages sent by this rank
    seconds_select: float
    seconds_comm: float
    dense_bytes: int  # what a dense ring allreduce would have received (for the compression ratio)
    extra: dict[str, float] = field(default_factory=dict)  # algorithm-specific figures

    @property
    def achieved_density(self) -> float:
        """Entries in the global update / numel (the compressor's `density` is its target: k = density x numel)."""
        return self.selected_global / self.numel



def dense_allreduce_bytes(numel: int, world_size: int, itemsize: int = 4) -> int:
    """Bytes one rank receives in a ring allreduce of `numel` elements: 2n(P-1)/P."""
    return 2 * numel * itemsize * (world_size - 1) // world_size


@dataclass(frozen=True)
class Cost:
    """Closed-form traffic of one step for one rank, in 4-byte words received (a pair = 2 words) and
    messages sent, in the paper's model: its range (low == high where the volume is one number) and the
    typical value inside it that projections use (bench/project_scaling.py)."""

    low: float
    high: float
    typical: float
    messages: float
    formula: str  # the same, in words, e.g. "2k(P-1)"


@dataclass(frozen=True)
class NoOptions:
    pass


class Compressor:
    """Base of every algorithm. `name` is the registry key (see compression/__init__.py)."""

    name = "base"
    Options = NoOptions  # the algorithm's own settings: a frozen dataclass of setting(...) fields (settings.py)
    uses_density = True  # False: what it sends does not depend on compression.density (dense, PowerSGD)

    def __init__(self, comm: Communicator, numel: int, density: float = 1.0, device: str | torch.device = "cpu",
                 shapes: typing.Sequence[torch.Size] | None = None, **options):
        self.comm = comm
        self.numel = numel
        Compressor.set_density(self, density)  # k; the algorithms' own set_density may need their options first
        self.device = torch.device(device)
        self.shapes = [torch.Size(s) for s in shapes] if shapes is not None else [torch.Size([numel])]
        if sum(s.numel() for s in self.shapes) != numel:
            raise ValueError(f"{self.name}: parameter shapes hold {sum(s.numel() for s in self.shapes)} "
                             f"entries, the gradient has {numel}")
        self.options = self.make_options(options)

    @classmethod
    def make_options(cls, raw: dict | None = None):
        """compression.options (a mapping; None = the defaults) as this algorithm's checked Options; a bad key or
        value is a ConfigError naming compression.options.<key> and the algorithm."""
        return build(cls.Options, raw or {}, "compression.options.", where=lambda key: f"algorithm {cls.name!r}")

    @staticmethod
    def cost(n: int, k: int, P: int, shapes=None, options=None) -> Cost:
        """Closed-form words received and messages sent per rank per step (see Cost) for n gradient entries,
        k = round(density * n) and P ranks. `shapes` (the parameter shapes; None = one vector) and
        `options` (the algorithm's Options; None = its defaults) matter only to algorithms whose volume
        depends on them (PowerSGD's); the others take and ignore them, so every caller asks alike."""
        raise NotImplementedError

    @property
    def warmup_steps(self) -> int:
        """Dense steps before this compressor's own (DenseWarmup's count; 0 for a bare compressor)."""
        return 0

    @property
    def carries_momentum(self) -> bool:
        """True when its memory holds the optimizer's momentum (DGC): the optimizer then steps without any."""
        return False

    def start_epoch(self, epoch: int) -> None:
        """Called by the trainer before each epoch's first step (and a resumed run's first): a schedule's hook."""

    @property
    def owed(self) -> torch.Tensor | None:
        """What this rank has computed and not yet sent, in units of the ranks' sum (benches measure its mass);
        None where nothing is owed."""
        return None

    @property
    def applied_count(self) -> int | None:
        """How many of this rank's entries the last step applied whole (their value entered the update and left
        the memory); None where the exchange applies none whole (a low-rank or quantized one)."""
        return None

    def set_density(self, density: float) -> None:
        """The target density from the next step on (DensityWarmup changes it each epoch)."""
        if not 0.0 < density <= 1.0:
            raise ValueError(f"density must be in (0, 1], got {density}")
        self.density, self.k = density, max(1, int(round(density * self.numel)))

    def describe(self) -> str:
        return f"{self.name} at density {self.density:g}"

    def step(self, flat_grad: torch.Tensor) -> StepStats:
        raise NotImplementedError

    def stats(self, moved: CommCounts, selected_local: int, selected_global: int, seconds_select: float = 0.0,
              k: int | None = None, dense: bool = False, extra: dict | None = None) -> StepStats:
        """The step's StepStats from the traffic `moved` (comm.measure()) and what was selected."""
        return StepStats(algorithm=self.name, dense=dense, numel=self.numel, k=self.k if k is None else k,
                         selected_local=selected_local, selected_global=selected_global,
                         bytes_sent=moved.bytes_sent, bytes_recv=moved.bytes_recv, messages=moved.msgs_sent,
                         seconds_select=seconds_select, seconds_comm=moved.seconds,
                         dense_bytes=dense_allreduce_bytes(self.numel, self.comm.size), extra=extra or {})

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


@dataclass
class SparseUpdate:
    """What `SparseCompressor.exchange` returns.

    indices: global entries of the update (each once); values: their sum over ranks (not yet / P);
    applied: this rank's entries whose value is included in `values` (they leave the residual);
    selected_local: how many entries this rank selected; seconds_select: time spent selecting;
    extra: algorithm-specific figures for StepStats.extra.
    """

    indices: torch.Tensor
    values: torch.Tensor
    applied: torch.Tensor
    selected_local: int
    seconds_select: float
    extra: dict[str, float] = field(default_factory=dict)


class CompressorWrapper(Compressor):
    """A compressor around another (`inner`): the same communicator, size, density, k, shapes and device, the
    same name in the logs; what a wrapper does not change it delegates."""

    def __init__(self, inner: Compressor):
        self.inner = inner
        super().__init__(inner.comm, inner.numel, inner.density, device=inner.device, shapes=inner.shapes)

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def warmup_steps(self) -> int:
        return self.inner.warmup_steps

    @property
    def carries_momentum(self) -> bool:
        return self.inner.carries_momentum

    def set_density(self, density: float) -> None:
        super().set_density(density)
        self.inner.set_density(density)

    def start_epoch(self, epoch: int) -> None:
        self.inner.start_epoch(epoch)

    @property
    def owed(self) -> torch.Tensor | None:
        return self.inner.owed

    @property
    def applied_count(self) -> int | None:
        return self.inner.applied_count

    def describe(self) -> str:
        return self.inner.describe()

    def step(self, flat_grad: torch.Tensor) -> StepStats:
        return self.inner.step(flat_grad)

    def state_dict(self) -> dict:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state)


class SparseCompressor(Compressor):
    """A selection around its rank's memory (compression/memory.py; error feedback unless given another): acc is
    held in the memory's buffer during the step, and exactly the applied entries leave it.

    On a CPU with compression.kernels and plain error feedback, a step passes over the n entries once where it
    took four passes: `residual += grad` and zeroing the gradient (the output's buffer) are one loop, fused also
    with the first threshold scan of an algorithm that declares `scans_first` (its exchange selects from acc
    through `select_above` before anything else reads acc); the output's values and the residual's clearing
    are k-sized writes. Elsewhere the same steps run as torch ops, with the same bits."""

    scans_first = False  # True: exchange's first use of acc is select_above (the scan then fuses with accumulating)

    def __init__(self, *args, memory=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.memory = memory if memory is not None else ErrorFeedback(self.numel, self.device)
        if self.memory.owed.numel() != self.numel:
            raise ValueError(f"{self.name}: memory holds {self.memory.owed.numel()} entries, the gradient has "
                             f"{self.numel}")
        self.index_dtype = torch.int32 if self.numel < 2**31 else torch.int64
        self._pending = None  # in a fused step: the gradient not yet added to the residual (and not yet zeroed)

    @property
    def residual(self) -> torch.Tensor:
        """What this rank has computed and not yet sent (the residual; DGC's velocity)."""
        return self.memory.owed

    @property
    def carries_momentum(self) -> bool:
        return self.memory.carries_momentum

    @property
    def owed(self) -> torch.Tensor:
        return self.memory.owed

    @property
    def applied_count(self) -> int | None:
        return self.memory.applied_count

    def describe(self) -> str:
        memory = "" if self.memory.name == ErrorFeedback.name else f", {self.memory.name} memory"
        return super().describe() + memory

    def exchange(self, acc: torch.Tensor) -> SparseUpdate:
        raise NotImplementedError

    def step(self, flat_grad: torch.Tensor) -> StepStats:
        with self.comm.measure() as moved:
            fused = self._fuses(flat_grad)
            if fused:
                self._pending = flat_grad
                if not self.scans_first:
                    self.accumulated()
                acc = self.memory.residual
            else:
                acc = self.memory.accumulate(flat_grad)
            update = self.exchange(acc)
            if fused:
                self.accumulated()  # in case the exchange never scanned acc
                kernels.scatter_scaled(flat_grad, update.indices, update.values, self.comm.size)
                kernels.clear(self.memory.residual, update.applied)  # ErrorFeedback.applied_entries, with no copy
                self.memory.applied_count = update.applied.numel()  # and what it records besides
            else:
                flat_grad.zero_()
                flat_grad[update.indices.long()] = update.values.to(flat_grad.dtype) / self.comm.size
                self.memory.applied_entries(update.applied)
            self.memory.global_update(flat_grad)
        return self.stats(moved, update.selected_local, int(update.indices.numel()), update.seconds_select,
                          extra=update.extra)

    def _fuses(self, flat_grad: torch.Tensor) -> bool:
        """Whether this step runs on compression.kernels: plain error feedback (its accumulate and clearing are
        what the kernels do) and float32 CPU vectors."""
        residual = getattr(self.memory, "residual", None)
        return (type(self.memory) is ErrorFeedback and kernels.available(flat_grad, residual)
                and flat_grad.dtype == residual.dtype == torch.float32 and flat_grad.is_contiguous()
                and residual.is_contiguous())

    def accumulated(self) -> None:
        """Make acc = residual + grad (and zero the gradient) if a fused step has not done so yet: an exchange
        with `scans_first` calls it before reading acc other than through select_above."""
        if self._pending is not None:
            grad, self._pending = self._pending, None
            kernels.accumulate_select(self.memory.residual, grad, math.inf, kernels.PairBuffer())

    def select_above(self, acc: torch.Tensor, threshold: float,
                     out: kernels.PairBuffer) -> tuple[torch.Tensor, torch.Tensor]:
        """selection.threshold_select(acc, threshold): (indices ascending, acc at them). With the kernels they are
        the int32 / float32 columns of `out`'s records (packed already, valid until out is used again), and the
        first scan of a fused step also accumulates, in the same pass."""
        if not kernels.available(acc) or acc.dtype != torch.float32:
            self.accumulated()
            return threshold_select(acc, threshold)
        if self._pending is not None:
            grad, self._pending = self._pending, None
            count = kernels.accumulate_select(self.memory.residual, grad, threshold, out)
        else:
            count = kernels.select(acc, threshold, out)
        return out.columns(count)

    def state_dict(self) -> dict:
        return {"memory": self.memory.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.memory.load_state_dict(state["memory"])


def all_finite(t: torch.Tensor) -> bool:
    """True when no entry is NaN or +-inf. min/max propagate NaN and expose infinities, and avoid
    materialising an n-element isfinite(t) mask, which dominated a full-size sparse step on CPU."""
    if t.numel() == 0:
        return True
    lo, hi = torch.aminmax(t)
    return bool(torch.isfinite(lo)) and bool(torch.isfinite(hi))


def pack_pairs(indices: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """(index, value) pairs as one uint8 buffer of fixed-size records, so a concatenation of
    several ranks' buffers (allgatherv, alltoallv) is still a valid buffer. Indices keep their
    integer type (never packed into floats: exact for any n)."""
    assert indices.numel() == values.numel()
    packed = kernels.records_of(indices, values)
    if packed is not None:  # the columns of one record buffer (a kernel's selection): packed already
        return packed
    # Records assembled as 4-byte words (the index's, then the value's bits): byte-wide columns
    # made this copy an order of magnitude slower. Explicit widths: view(0, -1) is ambiguous.
    idx = indices.contiguous().view(torch.int32).view(indices.numel(), indices.element_size() // 4)
    val = values.to(torch.float32).contiguous().view(torch.int32).view(values.numel(), 1)
    return torch.cat([idx, val], dim=1).view(torch.uint8).flatten()


def pair_bytes(index_dtype: torch.dtype) -> int:
    """Size of one packed (index, float32 value) record."""
    return torch.empty(0, dtype=index_dtype).element_size() + 4


def unpack_pairs(buf: torch.Tensor, index_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(indices, values) of packed records. With the kernels, int32 records come back as views of buf."""
    if index_dtype == torch.int32 and kernels.available(buf):
        columns = kernels.record_columns(buf)
        if columns is not None:
            return columns
    words = torch.empty(0, dtype=index_dtype).element_size() // 4
    rec = buf.view(torch.int32).view(-1, words + 1)
    indices = torch.empty(rec.shape[0], dtype=index_dtype, device=buf.device)
    indices.view(torch.int32).view(-1, words).copy_(rec[:, :words])  # a fresh, aligned buffer
    values = rec[:, words].contiguous().view(torch.float32)
    return indices, values


def sum_pairs(indices: torch.Tensor, values: torch.Tensor,
              numel: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum the values of duplicate indices: (distinct indices ascending, their sums). Given `numel` (the
    indices lie in [0, numel)) and at least numel / 4 pairs, by scatter-add into an n-long buffer (the
    faster way when the pairs are that many, as in TopkA's and Gaussiank's sums at large P); else by
    sorting the pairs, cheaper than touching an n-long buffer when they are few. Both add every index's
    values in input order: the results are the same bits. With the kernels, input that is a few sorted runs (one
    per sender, as every algorithm's is) is merged in one linear pass instead, again the same bits."""
    if kernels.available(indices, values) and indices.dtype in (torch.int32, torch.int64):
        merged = kernels.sum_runs(indices, values)
        if merged is not None:
            return merged
    indices = indices.long()
    if numel is not None and indices.numel() * 4 >= numel:
        seen = torch.zeros(numel, dtype=torch.bool, device=values.device)
        seen[indices] = True
        unique = seen.nonzero().squeeze(1)
        dense = torch.zeros(numel, dtype=torch.float32, device=values.device)
        dense.index_add_(0, indices, values.to(torch.float32))
        return unique, dense[unique]
    unique, inverse = torch.unique(indices, return_inverse=True)
    sums = torch.zeros(unique.numel(), dtype=torch.float32, device=values.device)
    sums.index_add_(0, inverse, values.to(torch.float32))
    return unique, sums


class Timer:
    """`with Timer() as t: ...; t.seconds` -- for selection time in `exchange`."""

    def __enter__(self):
        self.t0 = time.perf_counter()
        self.seconds = 0.0
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.t0
