"""P simulated ranks running every exchange of a screen side by side on the same per-rank gradients (threads, each
with the project's Communicator and its byte counting, comm/threads.py), and the oracle they are measured against."""
from __future__ import annotations

import time
import typing
from dataclasses import dataclass, replace

import torch
import yaml

from sparse_asr.comm import ThreadGroup
from sparse_asr.compression import COMPRESSORS, DEFAULT_MEMORY, MEMORIES, Compressor, StepStats, build_exchange
from sparse_asr.compression.selection import topk_indices
from sparse_asr.training.optim import local_terms_

ORACLE = "oracle"
WORD = 4  # bytes

if typing.TYPE_CHECKING:
    from sparse_asr.screening.measures import ShadowMomentum


class Oracle(Compressor):
    """The exact global top-k of the ranks' mean accumulated gradient, every rank's value applied there."""

    name = ORACLE

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.residual = torch.zeros(self.numel, dtype=torch.float32, device=self.device)
        self.applied = 0  # this rank's entries applied by the last step

    def step(self, flat_grad: torch.Tensor) -> StepStats:
        comm, k = self.comm, min(self.k, self.numel)
        self.residual += flat_grad
        with comm.measure() as moved:
            total = comm.allreduce_(self.residual.clone())  # the ranks' sum of acc, the same bits everywhere
            t0 = time.perf_counter()
            picked = torch.zeros(k, dtype=torch.int64, device=self.device)
            if comm.rank == 0:  # one pick for all: every rank would pick the same from the same sum
                picked = topk_indices(total, k)
            seconds_select = time.perf_counter() - t0
            comm.bcast_(picked)
        flat_grad.zero_()
        flat_grad[picked] = total[picked] / comm.size
        self.residual[picked] = 0.0
        self.applied = k
        return self.stats(moved, k, k, seconds_select)

    @property
    def owed(self) -> torch.Tensor:
        return self.residual

    @property
    def applied_count(self) -> int:
        return self.applied


@dataclass
class Algorithm:
    """One row family of the table: a label, the registered algorithm (or the oracle) and its options."""

    label: str
    name: str
    options: dict
    memory: str = DEFAULT_MEMORY  # a key of compression MEMORIES
    density: float | None = None  # its own density instead of --densities' (e.g. the words of another exchange)

    @property
    def uses_density(self) -> bool:
        return self.name == ORACLE or COMPRESSORS[self.name].uses_density

    @property
    def carries_momentum(self) -> bool:
        """Its memory carries momentum and weight decay: its update is the step (no shadow momentum)."""
        return MEMORIES[self.memory].carries_momentum

    def section(self, compression, density: float | None):
        """The config's compression section as this row's bare exchange: its algorithm, options, memory and
        density (1 where it ignores density), no dense warm-up, no dense 1-D parameters."""
        return replace(compression, algorithm=self.name, density=density if density is not None else 1.0,
                       options=self.options, memory=self.memory, warmup_steps=0, dense_1d=False,
                       density_warmup_epochs=0)

    def build(self, comm, numel: int, density: float | None, shapes, cfg) -> Compressor:
        """This row's compressor on one simulated rank, built as a run builds its exchange (the oracle: its own)."""
        if self.name == ORACLE:
            return Oracle(comm, numel, density, shapes=shapes, **self.options)
        return build_exchange(self.section(cfg.compression, density), cfg.optim, comm, shapes)


@dataclass
class Run:
    """One (algorithm, density) on P simulated ranks: a compressor per rank and the shadow momentum."""

    algorithm: Algorithm
    density: float | None  # None: the algorithm ignores density
    compressors: list[Compressor]
    momentum: ShadowMomentum | None = None  # set when the sparse steps begin


@dataclass
class RunStep:
    """What one step of a Run gave: rank 0's update (every rank's is the same), each rank's StepStats and
    applied count."""

    update: torch.Tensor
    stats: list[StepStats]
    applied: list[int | None]
    cpu_seconds: float = 0.0  # CPU time of the step, summed over the ranks' threads


class SimulatedRanks:
    """P simulated ranks, each running every (algorithm, density) in turn on its own gradient."""

    def __init__(self, P: int, algorithms: list[Algorithm], densities: list[float], numel: int, shapes, cfg,
                 timeout_s: float = 300.0):
        self.P, self.optim = P, cfg.optim
        self.group = ThreadGroup(P, timeout_s)
        self.runs = []
        for algorithm in algorithms:
            own = [algorithm.density] if algorithm.density is not None else densities
            for density in own if algorithm.uses_density else [None]:
                compressors = [algorithm.build(comm, numel, density, shapes, cfg) for comm in self.group.comms]
                self.runs.append(Run(algorithm, density, compressors))

    def step(self, grads: list[torch.Tensor], params: torch.Tensor) -> list[RunStep]:
        """Every run's step on these per-rank gradients (left unchanged: each compressor gets a copy) at these
        parameters (the gradients of a row whose memory carries the momentum get weight decay)."""

        def rank_step(comm):
            r, out = comm.rank, []
            for run in self.runs:
                flat = grads[r].clone()  # compressors turn their input into the update, in place
                if run.algorithm.carries_momentum:  # what SGDStep adds before an exchange that carries the momentum
                    local_terms_(flat, [flat], [params], self.optim, self.P)
                t0 = time.thread_time()
                stats = run.compressors[r].step(flat)
                out.append((flat if r == 0 else None, stats, run.compressors[r].applied_count,
                            time.thread_time() - t0))
            return out

        per_rank = self.group.run(rank_step)
        return [RunStep(per_rank[0][i][0], [per_rank[r][i][1] for r in range(self.P)],
                        [per_rank[r][i][2] for r in range(self.P)], sum(per_rank[r][i][3] for r in range(self.P)))
                for i in range(len(self.runs))]


def parse_variant(text: str) -> Algorithm:
    """LABEL=ALGORITHM[:KEY=VALUE,...], values read as YAML (e.g. oktopk_exact=oktopk:local_threshold_interval=1);
    the key `density` sets the row's density instead of --densities' (randomk_words=randomk:density=0.04), `memory`
    its memory (oktopk_ef21=oktopk:memory=ef21)."""
    label, sep, spec = text.partition("=")
    name, _, options = spec.partition(":")
    if not sep or not label or not name:
        raise ValueError(f"--variant {text!r}: expected LABEL=ALGORITHM[:KEY=VALUE,...]")
    parsed = {}
    for item in filter(None, options.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"--variant {text!r}: option {item!r} is not KEY=VALUE")
        parsed[key] = yaml.safe_load(value)
    density, memory = parsed.pop("density", None), parsed.pop("memory", DEFAULT_MEMORY)
    if density is not None and not (isinstance(density, (int, float)) and 0 < density <= 1):
        raise ValueError(f"--variant {text!r}: density must be in (0, 1], got {density!r}")
    if memory not in MEMORIES:
        raise ValueError(f"--variant {text!r}: memory must be one of {', '.join(MEMORIES)}, got {memory!r}")
    return Algorithm(label, name, parsed, memory=memory, density=float(density) if density is not None else None)
