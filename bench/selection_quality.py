"""Selection quality: how closely each gradient exchange's update follows dense training's, against the
number of ranks P.

    OMP_NUM_THREADS=1 .venv/bin/python bench/selection_quality.py [--config configs/an4_cpu.yaml] \
        [--ranks 1 2 4 8 16 32] [--densities 0.02 0.04] [--dense-steps 50] [--steps 100] \
        [--out bench/results/selection_quality.md] [--checkpoint RUN_DIR] [key.sub=value ...]

The model trains densely, as the config says (its data order and masking, SGD, learning-rate schedule and
clipping), from a fresh model or from a training checkpoint (--checkpoint: its weights, momentum and place in
the schedule, e.g. late in training where the accuracy runs end): `--dense-steps` plain steps, then `--steps`
steps during which every registered compressor and
the oracle (below) run beside the dense training on the same per-rank gradients, for every P of --ranks and
every density of --densities. Each (algorithm, P, density) is P simulated ranks (sparse_asr/comm/threads.py:
one thread per rank, each with the project's Communicator and its byte counting) with its own residuals and
its own shadow SGD momentum buffer; nothing they do feeds back into the model.

Per-rank gradients: each global batch is cut as the trainer's sampler cuts it (rank r: the r-th contiguous
slice). With synchronized BatchNorm (model.sync_batchnorm) a rank's gradient is the sum of its utterances'
contributions to the gradient of the whole batch's loss, so the gradients of the finest cut (F = lcm of
--ranks shards, computed by F simulated ranks with synchronized BatchNorm) give every coarser P's exactly,
up to rounding, as means of F/P consecutive ones. With per-rank BatchNorm each P is computed on its own
(slower). The model follows the dense mean gradient of the smallest P (with synchronized BatchNorm every P
has the same one: the whole batch's). The global batch is the config's (train.global_batch_size, or
batch_per_rank x the largest P) rounded up to a multiple of every P: an4_cpu.yaml's 16 becomes 32 for P up to
32, one utterance per rank there; --global-batch sets it.

Per step, for each (algorithm, P, density):
  cos_update    cos(its update, the dense mean gradient of the same P per-rank gradients)
  along         <update, g> / <g, g> for that dense mean gradient g: how far the update moves along dense's
                step, in units of it (dense: 1). cos says the direction, this the length along it: error
                feedback releases owed mass in bursts, so a worse direction can still go further
  cos_momentum  cos(its shadow momentum buffer, dense's at the same P); both start from the model's buffer
                when the sparse steps begin and take buf = momentum * buf + clipped update + weight_decay *
                params, as the config's SGD does (blank for +dgc rows: their momentum is in the ranks' memories)
  cos_step      cos(the step it makes the model take, dense momentum SGD's step at the same P): the shadow's
                buffer (Nesterov: d + momentum * buffer) or, for a row whose memory carries the momentum (+dgc,
                +ef21), its update itself (the memory carries momentum and weight decay, and the optimizer steps
                without them)
  cos_disp_W<W>, norm_disp_W<W>  the displacement over consecutive windows of W sparse steps (--windows): the sum
                of lr x its step against dense momentum SGD's from the same start on the same gradients, their
                cosine and norm ratio, at the step that ends each window (blank elsewhere). One step's cosine
                cannot rank memories that release deferred mass on different schedules (error feedback's residual
                leaks out every step, DGC's velocity in bursts, EF21's estimate lags): where the model goes over W
                steps can. At density 1 every memory's is 1 at every W.
  owed          ||sum over ranks of the residuals / P|| / ||dense mean gradient||: the error-feedback mass
                the ranks still owe the model, in steps of gradient (dense: 0)
  applied       mean over ranks of (entries of the rank whose value entered the update) / (entries it
                selected); dense 1; PowerSGD selects nothing: blank
  contributors  (sum over ranks of applied entries) / (entries in the update): how many ranks' values an
                updated entry carries on average, out of P (dense and oracle: P)
  words         4-byte words received per rank (mean over ranks), as the Communicator counts them (DESIGN 3)
  entries       entries in the update (the table gives them in units of k = density x parameters)
The table gives the mean over the sparse steps and the last step's value.

oracle: every rank accumulates acc = grad + residual; the update is the exact top-k of the ranks' mean acc,
applied from every rank (each clears its residual there). At P = 1 it is Ok-Topk with exact thresholds, and
TopkA. Its words are those of this implementation: a dense allreduce and a broadcast of the k indices.
Compressors are bare (compression.dense_1d and warm-up do not apply; the dense steps are the warm-up) and use
their default options; --variant adds an algorithm with other options as a row of its own, and --memory
ALGORITHM:MEMORY a row "ALGORITHM+MEMORY" with another memory of compression/memory.py (--dgc ALGORITHM is --memory
ALGORITHM:dgc). With dgc, Deep Gradient Compression's memory (compression.memory=dgc: momentum correction, the
config's momentum_masking; each rank's gradient clipped at max_grad_norm x sqrt(P) and given weight decay before
it, as training/optim.py does; every rank's momentum starts from the model's when the sparse steps begin, as if
DGC had run at density 1 until then, which is momentum SGD). With ef21 (EF21-SGDM) the same momentum start and
empty estimates, filled by the exchanges from the first sparse step on.

Outputs: the table (printed; --out FILE.md writes it), a plot of cos(update, dense) against P, one line per
algorithm, one panel per density plus one against density at the largest P (FILE.png), and every step's
figures (FILE.csv).

Cost: simulating P ranks does P ranks' work, and for the allgather algorithms (TopkA, Gaussiank) one rank's
work grows with P too (each rank sums the P k gathered pairs, compression.base.sum_pairs), so P = 32 dominates.
The report's footer gives the wall and CPU seconds of each part and each algorithm; docs/results.md has those
of the recorded runs. --ranks, --algorithms and --steps trim it.
Memory: a residual per rank and algorithm, about 3 GB at the defaults.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import yaml

from sparse_asr.comm import Communicator, ThreadGroup
from sparse_asr.compression import (COMPRESSORS, MEMORIES, Compressor, ErrorFeedback, SparseCompressor, StepStats,
                                    build_compressor, memory_problem)
from sparse_asr.compression.memory import build_memory
from sparse_asr.compression.base import all_finite
from sparse_asr.compression.selection import topk_indices
from sparse_asr.data.audio import SpecAugment
from sparse_asr.data.dataset import BucketingSampler, SpeechDataset, collate
from sparse_asr.data.manifest import read_manifest
from sparse_asr.models import build_model
from sparse_asr.training.loss import batch_loss
from sparse_asr.training.checkpoint import load_shared
from sparse_asr.training.config import load_config
from sparse_asr.training.launch import setup_process
from sparse_asr.training.optim import (SGDStep, attach_flat_grad, clip_grad_norm_, learning_rate, local_terms_,
                                       set_learning_rate)
from sparse_asr.training.runtime import cpu_model

ORACLE = "oracle"
WORD = 4  # bytes


# ------------------------------------------------------------------------------------------- the oracle
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
        P = comm.size
        return StepStats(algorithm=self.name, dense=False, numel=self.numel, k=self.k, selected_local=k,
                         selected_global=k, bytes_sent=moved.bytes_sent, bytes_recv=moved.bytes_recv,
                         messages=moved.msgs_sent, seconds_select=seconds_select, seconds_comm=moved.seconds,
                         dense_bytes=2 * self.numel * WORD * (P - 1) // P)


def residual_of(compressor: Compressor) -> torch.Tensor | None:
    """What a compressor's rank still owes the model, in units of the ranks' sum (a selection's memory.owed, the
    1-bit exchange's owed errors, the oracle's residual, PowerSGD's error); None where nothing is owed (dense, the
    half-precision allreduces, QSGD)."""
    if isinstance(compressor, SparseCompressor):
        return compressor.memory.owed
    for name in ("owed", "residual", "error"):
        if (owed := getattr(compressor, name, None)) is not None:
            return owed
    return None


def applied_counter(compressor: Compressor):
    """A function giving how many of this rank's entries the compressor's last step applied (their value
    entered the update and left the residual): all for dense, None where nothing is selected (PowerSGD).
    For sparse algorithms it is the size of the `applied` index set `exchange` returns (the entries the base
    class clears from the residual), which StepStats does not carry: the instance's `exchange` is wrapped."""
    if isinstance(compressor, Oracle):
        return lambda: compressor.applied
    if isinstance(compressor, SparseCompressor):
        last = [0]
        exchange = compressor.exchange

        def exchange_and_count(acc):
            result = exchange(acc)
            last[0] = int(result.applied.numel())
            return result

        compressor.exchange = exchange_and_count
        return lambda: last[0]
    if compressor.name == "dense":
        return lambda: compressor.numel
    return lambda: None


# ------------------------------------------------------------------------------------------- simulated ranks
@dataclass
class Algorithm:
    """One row family of the table: a label, the registered algorithm (or the oracle) and its options."""

    label: str
    name: str
    options: dict
    memory: str = ErrorFeedback.name  # a key of compression MEMORIES
    density: float | None = None  # its own density instead of --densities' (e.g. the words of another exchange)

    @property
    def uses_density(self) -> bool:
        return self.name == ORACLE or COMPRESSORS[self.name].uses_density

    @property
    def carries_momentum(self) -> bool:
        """Its memory carries momentum and weight decay: its update is the step (no shadow momentum)."""
        return MEMORIES[self.memory].carries_momentum


@dataclass
class Run:
    """One (algorithm, density) on P simulated ranks: a compressor per rank and the shadow momentum."""

    algorithm: Algorithm
    density: float | None  # None: the algorithm ignores density
    compressors: list[Compressor]
    applied: list  # per rank, applied_counter's function
    momentum: ShadowMomentum | None = None  # set when the sparse steps begin


@dataclass
class RunStep:
    """What one step of a Run gave: rank 0's update (every rank's is the same), each rank's StepStats and
    applied count."""

    update: torch.Tensor
    stats: list[StepStats]
    applied: list[int | None]
    cpu_seconds: float = 0.0  # CPU time of the step, summed over the ranks' threads


def make_compressor(algorithm: Algorithm, comm, numel: int, density: float | None, shapes, cfg) -> Compressor:
    if algorithm.name == ORACLE:
        return Oracle(comm, numel, density, shapes=shapes, **algorithm.options)
    memory = None
    if algorithm.memory != ErrorFeedback.name:
        memory = build_memory(algorithm.memory, numel, "cpu", cfg.optim, cfg.compression)
    return build_compressor(algorithm.name, comm, numel, density if density is not None else 1.0, shapes=shapes,
                            memory=memory, **algorithm.options)


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
                compressors = [make_compressor(algorithm, comm, numel, density, shapes, cfg)
                               for comm in self.group.comms]
                self.runs.append(Run(algorithm, density, compressors, [applied_counter(c) for c in compressors]))

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
                out.append((flat if r == 0 else None, stats, run.applied[r](), time.thread_time() - t0))
            return out

        per_rank = self.group.run(rank_step)
        return [RunStep(per_rank[0][i][0], [per_rank[r][i][1] for r in range(self.P)],
                        [per_rank[r][i][2] for r in range(self.P)], sum(per_rank[r][i][3] for r in range(self.P)))
                for i in range(len(self.runs))]


# ------------------------------------------------------------------------------------------- measurements
def dot(a: torch.Tensor, b: torch.Tensor) -> float:
    """a . b by torch's float32 sum, which adds pairwise: ~1e-8 relative error at lstman4_small's size,
    where torch.dot (1e-5) and linalg.vector_norm (1e-4) are far off, and without a float64 copy."""
    return float((a * b).sum())


def norm(a: torch.Tensor) -> float:
    return math.sqrt(dot(a, a))


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """cos(a, b), 0 when either is zero."""
    norms = norm(a) * norm(b)
    return dot(a, b) / norms if norms > 0 else 0.0


class ShadowMomentum:
    """torch.optim.SGD's momentum buffer for a stream of updates: buf = momentum * buf + d, where d is the
    update clipped as the trainer clips it, plus weight_decay * params (dampening 0, as configured); and the
    step SGD takes from it (buf, or with Nesterov d + momentum * buf)."""

    def __init__(self, buffer: torch.Tensor, optim_cfg):
        self.buffer = buffer.clone()
        self.cfg = optim_cfg

    def add(self, update: torch.Tensor, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the buffer, the step) after this update."""
        d = update.clone()
        clip_grad_norm_(d, self.cfg.max_grad_norm)
        if self.cfg.weight_decay:
            d.add_(params, alpha=self.cfg.weight_decay)
        self.buffer.mul_(self.cfg.momentum).add_(d)
        return self.buffer, d.add_(self.buffer, alpha=self.cfg.momentum) if self.cfg.nesterov else self.buffer


def measure(run: Run, result: RunStep, reference: torch.Tensor, reference_momentum: tuple[torch.Tensor, torch.Tensor],
            params: torch.Tensor) -> tuple[dict, torch.Tensor]:
    """One step's figures for one run (module docstring), and the step it makes the model take."""
    P = len(run.compressors)
    residuals = [residual_of(c) for c in run.compressors]
    owed = 0.0
    if residuals[0] is not None:
        total = residuals[0].clone()
        for residual in residuals[1:]:
            total += residual
        owed = norm(total) / P / norm(reference)
    cos_update = cosine(result.update, reference)
    reference_sq = dot(reference, reference)
    along = dot(result.update, reference) / reference_sq if reference_sq > 0 else 0.0
    dense_buffer, dense_step = reference_momentum
    if run.momentum is not None:
        buffer, step = run.momentum.add(result.update, params)
        cos_momentum = cosine(buffer, dense_buffer)
    else:  # +dgc, +ef21: the update is the step (the momentum lives in the ranks' memories)
        step, cos_momentum = result.update, math.nan
    applied = result.applied
    selected = [s.selected_local for s in result.stats]
    share = contributors = math.nan
    if applied[0] is not None:
        share = float(np.mean([a / s for a, s in zip(applied, selected) if s > 0])) if any(selected) else math.nan
        updated = result.stats[0].selected_global
        contributors = sum(applied) / updated if updated else math.nan
    return {"algorithm": run.algorithm.label, "P": P, "density": run.density if run.density is not None else math.nan,
            "cos_update": cos_update, "along": along, "cos_momentum": cos_momentum,
            "cos_step": cosine(step, dense_step), "owed": owed,
            "applied": share, "contributors": contributors,
            "words": float(np.mean([s.bytes_recv for s in result.stats])) / WORD,
            "update_entries": result.stats[0].selected_global, "k": result.stats[0].k,
            "cpu_seconds": result.cpu_seconds}, step


class Displacements:
    """Where the model goes over consecutive windows of W sparse steps: per key (a run, or dense) the sum of
    lr x step since its window began. Every sparse step: `add` each key's step, then `window_end()` counts the
    step and names the W whose window it ends; their `figures` are read, then `restart(W)`."""

    def __init__(self, sizes: list[int]):
        self.sizes, self.sums, self.steps = sorted(set(sizes)), {}, 0

    def add(self, key, lr: float, step: torch.Tensor) -> None:
        for W in self.sizes:
            if (key, W) in self.sums:
                self.sums[key, W].add_(step, alpha=lr)
            else:
                self.sums[key, W] = step * lr

    def window_end(self) -> list[int]:
        self.steps += 1
        return [W for W in self.sizes if self.steps % W == 0]

    def figures(self, key, dense_key, W: int) -> dict:
        """cos(key's displacement, dense's) and ||key's|| / ||dense's|| over the window of W just ended."""
        mine, dense = self.sums[key, W], self.sums[dense_key, W]
        dense_norm = norm(dense)
        return {f"cos_disp_W{W}": cosine(mine, dense),
                f"norm_disp_W{W}": norm(mine) / dense_norm if dense_norm else 0.0}

    def restart(self, W: int) -> None:
        for key in [key for key in self.sums if key[1] == W]:
            del self.sums[key]


# ------------------------------------------------------------------------------------------- gradients
def load_training_set(cfg) -> SpeechDataset:
    """The config's training utterances (its `max_train_utterances` shortest if set), masked as it says."""
    d = cfg.data
    frame = read_manifest(d.train_manifest)
    if d.max_train_utterances:
        frame = frame.sort_values(["duration", "utt_id"], kind="stable").head(d.max_train_utterances)
    augment = SpecAugment(d.freq_masks, d.freq_mask_width, d.time_masks, d.time_mask_width, d.time_mask_max_fraction)
    return SpeechDataset(frame, augment=augment, seed=cfg.seed)


def global_batches(dataset: SpeechDataset, batch_size: int, seed: int, sorted_epochs: int = 0):
    """(epoch, items of one global batch) forever, in the trainer's order (its sampler, its epochs; the first
    `sorted_epochs` in order of length, SortaGrad)."""
    sampler = BucketingSampler(dataset.durations, batch_size, seed=seed, shuffle=True, drop_last=True,
                               sorted_epochs=sorted_epochs)
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        dataset.set_epoch(epoch)  # the epoch's masks
        for batch in sampler.global_batches():
            yield epoch, [dataset[int(i)] for i in batch]
        epoch += 1


def shards(items: list, P: int) -> list[list]:
    """Rank r's utterances: the r-th contiguous slice, as the sampler gives them."""
    per = len(items) // P
    return [items[r * per:(r + 1) * per] for r in range(P)]


def mean(tensors: list[torch.Tensor]) -> torch.Tensor:
    total = tensors[0].clone()
    for t in tensors[1:]:
        total += t
    return total / len(tensors)


class ShardGradients:
    """The per-rank gradients of a global batch for several P, computed in this process (module docstring).
    `replicas` take the model's parameters before each batch; the trainer's loss: CTC sum / utterances."""

    def __init__(self, model_name: str, sync_bn: bool, finest: int, timeout_s: float = 300.0):
        self.sync_bn, self.finest = sync_bn, finest
        self.group = ThreadGroup(finest, timeout_s) if sync_bn else None
        comms = self.group.comms if sync_bn else [None]
        self.replicas = [build_model(model_name, sync_bn=comm) for comm in comms]
        self.flats = [attach_flat_grad(list(m.parameters())) for m in self.replicas]

    @torch.no_grad()
    def load(self, model: torch.nn.Module) -> None:
        for replica in self.replicas:
            for dst, src in zip(replica.parameters(), model.parameters()):
                dst.copy_(src)

    def gradient(self, r: int, items: list) -> torch.Tensor:
        """Replica r's gradient on these utterances (a copy)."""
        model, flat = self.replicas[r], self.flats[r]
        flat.zero_()
        batch = collate(items)
        log_probs, lengths = model(batch.features, batch.feature_lengths)
        loss = batch_loss(log_probs, lengths, batch)
        loss.backward()
        return flat.clone()

    def __call__(self, items: list, ranks: list[int]) -> dict[int, list[torch.Tensor]]:
        """{P: the P ranks' gradients} for every P of `ranks`."""
        if not self.sync_bn:
            return {P: [self.gradient(0, shard) for shard in shards(items, P)] for P in ranks}
        cut = shards(items, self.finest)
        finest = self.group.run(lambda comm: self.gradient(comm.rank, cut[comm.rank]))
        out = {}
        for P in ranks:
            step = self.finest // P
            out[P] = finest if step == 1 else [mean(finest[r * step:(r + 1) * step]) for r in range(P)]
        return out


def flat_momentum(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter]) -> torch.Tensor:
    """The optimizer's momentum buffers as one flat vector (zeros before its first step)."""
    parts = []
    for p in params:
        buffer = optimizer.state.get(p, {}).get("momentum_buffer")
        parts.append((buffer if buffer is not None else torch.zeros_like(p)).flatten())
    return torch.cat(parts)


# ------------------------------------------------------------------------------------------- the bench
@dataclass
class Settings:
    ranks: list[int]
    densities: list[float]
    algorithms: list[Algorithm]
    dense_steps: int
    steps: int
    global_batch: int
    windows: list[int] = field(default_factory=lambda: [10, 50])  # displacement windows, in sparse steps
    timeout_s: float = 300.0
    log_every: int = 10
    checkpoint: str = ""  # start from this training checkpoint's model, momentum and schedule position


def run_bench(cfg, s: Settings, log=print, start: dict | None = None) -> tuple[pd.DataFrame, dict]:
    """Train densely for dense_steps + steps steps, running every compressor beside the last `steps`.
    Returns every step's figures (one row per step and run) and timings."""
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model.name)  # the trajectory: parameters and optimizer only (replicas do forwards)
    params = list(model.parameters())
    flat_grad = attach_flat_grad(params)
    optimizer = SGDStep(params, cfg.optim).optimizer
    start_step, start_epoch = start_from(start, model, optimizer, log) if start is not None else (0, 0)
    numel, shapes = flat_grad.numel(), [p.shape for p in params]
    dataset = load_training_set(cfg)
    if len(dataset) < s.global_batch:
        raise SystemExit(f"selection_quality: {len(dataset)} training utterances, fewer than one global batch of "
                         f"{s.global_batch}")
    finest = math.lcm(*s.ranks)
    gradients = ShardGradients(cfg.model.name, cfg.model.sync_batchnorm, finest, s.timeout_s)
    trajectory_P = min(s.ranks)
    simulated = {P: SimulatedRanks(P, s.algorithms, s.densities, numel, shapes, cfg, s.timeout_s) for P in s.ranks}
    reference_momentum: dict[int, ShadowMomentum] = {}
    displacements = {P: Displacements(s.windows) for P in s.ranks}
    rows = []
    seconds = {f"{what}_{clock}": 0.0 for what in ("gradients", "compressors", "measures") for clock in ("wall", "cpu")}

    def add_time(what: str, since: tuple[float, float]) -> tuple[float, float]:
        now = time.perf_counter(), time.process_time()  # CPU: all threads of this process
        seconds[f"{what}_wall"] += now[0] - since[0]
        seconds[f"{what}_cpu"] += now[1] - since[1]
        return now

    # From a checkpoint the data epochs count from 0 again (the seed's order): only the SortaGrad epochs the run
    # had not yet done are sorted.
    batches = global_batches(dataset, s.global_batch, cfg.seed, max(0, cfg.train.sorted_epochs - start_epoch))
    t_start, skipped, taken = time.perf_counter(), 0, start_step  # taken: optimizer steps, as the trainer counts them
    total_steps = s.dense_steps + s.steps
    for step in range(total_steps):
        epoch, items = next(batches)
        sparse = step >= s.dense_steps
        t0 = time.perf_counter(), time.process_time()
        gradients.load(model)
        grads = gradients(items, s.ranks if sparse else [trajectory_P])
        references = {P: mean(g) for P, g in grads.items()}  # the dense mean gradient at each P
        add_time("gradients", t0)
        if not all(all_finite(g) for g in references.values()):  # as the trainer: every rank skips the step
            skipped += 1
            log(f"step {step}: non-finite gradient, skipped (as the trainer would)")
            continue
        if sparse:
            params_now = torch.cat([p.detach().flatten() for p in params])
            if not reference_momentum:  # the sparse steps begin: every shadow starts from the model's buffer
                start = flat_momentum(optimizer, params)
                reference_momentum = {P: ShadowMomentum(start, cfg.optim) for P in s.ranks}
                for sim in simulated.values():
                    for run in sim.runs:
                        carries = run.algorithm.carries_momentum
                        run.momentum = None if carries else ShadowMomentum(start, cfg.optim)
                        if carries:  # every rank's momentum = the model's (as if it ran at density 1 so far, which
                            for c in run.compressors:  # is momentum SGD)
                                c.memory.start_from(start)
            lr = learning_rate(cfg.optim, taken, start_epoch + epoch)
            for P, sim in simulated.items():
                t0 = time.perf_counter(), time.process_time()
                results = sim.step(grads[P], params_now)
                t1 = add_time("compressors", t0)
                dense_momentum = reference_momentum[P].add(references[P], params_now)
                moves = displacements[P]
                moves.add("dense", lr, dense_momentum[1])
                measured = []
                for i, (run, result) in enumerate(zip(sim.runs, results)):
                    figures, step_taken = measure(run, result, references[P], dense_momentum, params_now)
                    moves.add(i, lr, step_taken)
                    measured.append(figures)
                ended = moves.window_end()
                for i, figures in enumerate(measured):
                    for W in ended:
                        figures.update(moves.figures(i, "dense", W))
                    rows.append({"step": step, **figures})
                for W in ended:
                    moves.restart(W)
                add_time("measures", t1)
        flat_grad.copy_(references[trajectory_P])
        clip_grad_norm_(flat_grad, cfg.optim.max_grad_norm)
        set_learning_rate(optimizer, learning_rate(cfg.optim, taken, start_epoch + epoch))
        optimizer.step()
        taken += 1
        done = step + 1
        if s.log_every and (done % s.log_every == 0 or done == total_steps):
            elapsed = time.perf_counter() - t_start
            log(f"step {done}/{total_steps} ({'sparse' if sparse else 'dense'}): {elapsed:.0f} s so far, "
                f"{elapsed / done:.2f} s/step", flush=True)
    seconds["skipped_steps"] = skipped
    return pd.DataFrame(rows), seconds


def read_start(path: str, cfg) -> dict:
    """A training checkpoint's shared state (verified), refused with a ValueError or OSError naming it when it
    is missing, damaged, of another model than the config's, or trained with other optimizer settings (the
    trajectory would go on under another learning-rate schedule or momentum than the run's)."""
    _, shared = load_shared(path)
    name = shared["config"]["model"]["name"]
    if name != cfg.model.name:
        raise ValueError(f"--checkpoint {path} holds model {name!r}, the config asks for {cfg.model.name!r}")
    saved, asked = shared["config"].get("optim", {}), asdict(cfg.optim)
    differ = [f"optim.{key}={saved[key]!r} (the config: {asked[key]!r})" for key in asked
              if key in saved and saved[key] != asked[key]]
    if differ:
        raise ValueError(f"--checkpoint {path} was trained with {', '.join(differ)}: give its run's config.yaml as "
                         f"--config, or the same overrides")
    return shared


def start_from(shared: dict, model, optimizer, log) -> tuple[int, int]:
    """Put a checkpoint's model (rank 0's BatchNorm statistics) and optimizer (its momentum buffers) into the
    trajectory; returns its optimizer step and epoch, where the learning-rate schedule goes on."""
    model.load_state_dict(shared["model"])
    optimizer.load_state_dict(shared["optimizer"])
    progress = shared["progress"]
    log(f"started from the checkpoint: optimizer step {progress['step']}, epoch {progress['epoch']}")
    return int(progress["step"]), int(progress["epoch"])


def summarise(steps: pd.DataFrame) -> pd.DataFrame:
    """Per (algorithm, P, density): the mean over the sparse steps and the last step's value."""
    keys = ["algorithm", "P", "density"]
    order = {label: i for i, label in enumerate(dict.fromkeys(steps["algorithm"]))}
    grouped = steps.groupby(keys, dropna=False, sort=False)
    figures = ["cos_update", "along", "cos_momentum", "cos_step", "owed", "applied", "contributors", "words",
               "update_entries", "k", *window_columns(steps)]
    summary = grouped[figures].mean().add_suffix("_mean").join(grouped[figures].last().add_suffix("_last"))
    summary["steps"] = grouped.size()
    summary = summary.reset_index()
    summary["order"] = summary["algorithm"].map(order)
    return summary.sort_values(["order", "density", "P"], na_position="first").drop(columns="order")


def window_columns(steps: pd.DataFrame) -> list[str]:
    """The displacement figures present (cos_disp_W<W>, norm_disp_W<W>), by W."""
    sizes = sorted({int(c.removeprefix("cos_disp_W")) for c in steps.columns if c.startswith("cos_disp_W")})
    return [f"{what}_W{W}" for W in sizes for what in ("cos_disp", "norm_disp")]


def markdown_table(summary: pd.DataFrame) -> str:
    def pair(row, name, digits):
        return f"{row[name + '_mean']:.{digits}f} / {row[name + '_last']:.{digits}f}"

    sizes = sorted({int(c.removeprefix("cos_disp_W").removesuffix("_mean")) for c in summary.columns
                    if c.startswith("cos_disp_W") and c.endswith("_mean")})
    lines = ["| algorithm | P | density | entries updated | cos(update, dense mean gradient) mean / last | "
             "along dense mean / last | cos(momentum, dense momentum) mean / last | "
             "cos(step, dense momentum SGD's step) mean / last | owed mean / last | "
             "share of local picks applied | ranks per applied entry | words received per rank |"
             + "".join(f" displacement over {W} steps: cos / norm ratio |" for W in sizes),
             "|---|---|---|---|---|---|---|---|---|---|---|---|" + "---|" * len(sizes)]
    for _, row in summary.iterrows():
        density = "-" if math.isnan(row["density"]) else f"{row['density']:g}"
        entries = "-" if math.isnan(row["density"]) else f"{row['update_entries_mean'] / row['k_mean']:.2f} k"
        applied = "-" if math.isnan(row["applied_mean"]) else f"{row['applied_mean']:.2f}"
        contributors = "-" if math.isnan(row["contributors_mean"]) else f"{row['contributors_mean']:.2f} of {row['P']}"
        momentum = "-" if math.isnan(row["cos_momentum_mean"]) else pair(row, "cos_momentum", 3)
        lines.append(f"| {row['algorithm']} | {row['P']} | {density} | {entries} | {pair(row, 'cos_update', 3)} | "
                     f"{pair(row, 'along', 3)} | "
                     f"{momentum} | {pair(row, 'cos_step', 3)} | {pair(row, 'owed', 2)} | {applied} | {contributors} | "
                     f"{row['words_mean']:,.0f} |"
                     + "".join(f" {displacement(row, W)} |" for W in sizes))
    return "\n".join(lines)


def displacement(row, W: int) -> str:
    """'cos / norm ratio' of the displacement over W steps, the mean over the run's windows ('-': no full window)."""
    cos, ratio = row[f"cos_disp_W{W}_mean"], row[f"norm_disp_W{W}_mean"]
    return "-" if math.isnan(cos) else f"{cos:.3f} / {ratio:.3f}"


def plot(summary: pd.DataFrame, path: Path, densities: list[float]) -> None:
    """cos(update, dense) against P, a panel per density (density-free algorithms in each), plus one against
    density at the largest P when there are several densities."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sparse_asr.figures import save_png

    several = len(densities) > 1
    panels = len(densities) + several
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4.2), squeeze=False)
    labels = list(dict.fromkeys(summary["algorithm"]))
    styles = {label: dict(marker="os^vD<>ph*"[i % 10], linestyle=("-", "--", ":")[i // 10 % 3])
              for i, label in enumerate(labels)}  # distinct even where two lines coincide (TopkA and TopkDSA)
    ranks = sorted(summary["P"].unique())
    for ax, density in zip(axes[0], densities):
        for label in labels:
            rows = summary[(summary["algorithm"] == label)
                           & (summary["density"].isna() | np.isclose(summary["density"], density))]
            ax.plot(rows["P"], rows["cos_update_mean"], label=label, **styles[label])
        ax.set_xscale("log", base=2)
        ax.set_xticks(ranks, [str(P) for P in ranks])
        ax.set_xlabel("P (simulated ranks)")
        ax.set_title(f"density {density:g}")
    if several:
        ax, largest = axes[0][-1], summary["P"].max()
        at = summary[summary["P"] == largest]
        for label in labels:
            rows = at[at["algorithm"] == label]
            x = densities if rows["density"].isna().all() else rows["density"]
            y = np.repeat(rows["cos_update_mean"].to_numpy(), len(densities)) if rows["density"].isna().all() \
                else rows["cos_update_mean"]
            ax.plot(x, y, label=label, **styles[label])
        ax.set_xlabel("density")
        ax.set_title(f"P = {largest}")
    axes[0][0].set_ylabel("cos(update, dense mean gradient), mean over steps")
    axes[0][0].legend(fontsize="small")
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)


# ------------------------------------------------------------------------------------------- command line
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
    density, memory = parsed.pop("density", None), parsed.pop("memory", ErrorFeedback.name)
    if density is not None and not (isinstance(density, (int, float)) and 0 < density <= 1):
        raise ValueError(f"--variant {text!r}: density must be in (0, 1], got {density!r}")
    if memory not in MEMORIES:
        raise ValueError(f"--variant {text!r}: memory must be one of {', '.join(MEMORIES)}, got {memory!r}")
    return Algorithm(label, name, parsed, memory=memory, density=float(density) if density is not None else None)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/an4_cpu.yaml")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32], help="simulated P values")
    parser.add_argument("--densities", type=float, nargs="+", default=[0.02])
    parser.add_argument("--steps", type=int, default=100, help="sparse steps (the compressors run beside these)")
    parser.add_argument("--dense-steps", type=int, default=50, help="plain dense steps first")
    parser.add_argument("--algorithms", nargs="+", help=f"default: every registered one and {ORACLE}")
    parser.add_argument("--variant", action="append", default=[], metavar="LABEL=ALGORITHM[:KEY=VALUE,...]",
                        help="one more row family: a registered algorithm with these options (repeatable)")
    parser.add_argument("--memory", action="append", default=[], metavar="ALGORITHM:MEMORY",
                        help=f"one more row family: ALGORITHM with another memory ({', '.join(MEMORIES)}), labelled "
                        "ALGORITHM+MEMORY (repeatable)")
    parser.add_argument("--dgc", action="append", default=[], metavar="ALGORITHM",
                        help="the same as --memory ALGORITHM:dgc")
    parser.add_argument("--windows", type=int, nargs="+", default=[10, 50], metavar="W",
                        help="displacement windows, in sparse steps (default 10 50)")
    parser.add_argument("--global-batch", type=int,
                        help="default: the config's global batch, rounded up to a multiple of every P")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a simulated rank waits in a collective")
    parser.add_argument("--out", type=Path, help="write the table to this .md, the plot beside it (.png) and "
                        "every step's figures (.csv)")
    parser.add_argument("--log-every", type=int, default=10, help="progress line every N steps (0: none)")
    parser.add_argument("--seeds", type=int, nargs="+", metavar="S",
                        help="one trajectory per seed (its initial model, data order and masks): every figure as a "
                        "mean with its 95%% interval over them, and each algorithm's gap to the oracle "
                        "(bench/selection_intervals.py)")
    parser.add_argument("--per-rank", type=int, nargs="+", metavar="U",
                        help="the grid: every P of --ranks x U utterances per rank (global batch P x U, one trajectory "
                        "per global batch and seed), the cells compared seed by seed")
    parser.add_argument("--checkpoint", help="start from this training checkpoint (a run directory or one of its "
                        "checkpoints): its model, momentum and place in the learning-rate schedule, instead of a fresh "
                        "model; the config must name the same model and optim settings as the run's")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides")
    return parser.parse_args(argv)


def settings_from(args, cfg) -> tuple[Settings, str]:
    """Validated settings, and a note on how the global batch was chosen."""
    ranks = sorted(set(args.ranks))
    if ranks[0] < 1:
        raise ValueError(f"--ranks must be positive, got {args.ranks}")
    if any(not 0 < d <= 1 for d in args.densities):
        raise ValueError(f"--densities must be in (0, 1], got {args.densities}")
    if args.steps < 1 or args.dense_steps < 0:
        raise ValueError("--steps must be >= 1 and --dense-steps >= 0")
    if min(args.windows) < 1:
        raise ValueError(f"--windows must be >= 1, got {args.windows}")
    names = args.algorithms if args.algorithms is not None else [*COMPRESSORS, ORACLE]
    algorithms = [Algorithm(name, name, {}) for name in names] + [parse_variant(v) for v in args.variant]
    for spec in [*args.memory, *(f"{name}:dgc" for name in args.dgc)]:
        name, _, memory = spec.partition(":")
        if memory not in MEMORIES or name not in COMPRESSORS:
            raise ValueError(f"--memory {spec!r}: expected ALGORITHM:MEMORY, MEMORY one of {', '.join(MEMORIES)}")
        algorithms.append(Algorithm(f"{name}+{memory}", name, {}, memory=memory))
    for a in algorithms:
        if a.name != ORACLE and a.name not in COMPRESSORS:
            raise ValueError(f"unknown algorithm {a.name!r}; known: {', '.join([*COMPRESSORS, ORACLE])}")
        if a.memory != ErrorFeedback.name and (problem := memory_problem(a.name, a.memory, 0, False)):
            raise ValueError(f"{a.label}: {problem}")
    if len({a.label for a in algorithms}) != len(algorithms):
        raise ValueError("two rows with the same algorithm label")
    lcm = math.lcm(*ranks)
    configured = cfg.train.global_batch_size or cfg.train.batch_per_rank * ranks[-1]
    if args.per_rank is not None:
        if args.global_batch is not None or min(args.per_rank) < 1:
            raise ValueError("--per-rank takes utterances per rank >= 1 and sets the global batches itself "
                             "(no --global-batch)")
        batch, note = lcm * max(args.per_rank), "--per-rank: P x U per cell"
    elif args.global_batch is not None:
        if args.global_batch % lcm:
            raise ValueError(f"--global-batch {args.global_batch} is not a multiple of every P ({lcm})")
        batch, note = args.global_batch, "--global-batch"
    else:
        batch = -(-configured // lcm) * lcm
        note = ("the config's" if batch == configured
                else f"the config's {configured} rounded up to a multiple of every P")
    return Settings(ranks, sorted(set(args.densities)), algorithms, args.dense_steps, args.steps, batch,
                    sorted(set(args.windows)), args.timeout, args.log_every, args.checkpoint or ""), note


def main(argv=None) -> int:
    t_start = time.perf_counter()
    args = parse_args(argv)
    setup_process(Communicator(), "cpu", threads=1)  # one per simulated rank: the ranks' threads share the cores
    try:
        cfg = load_config(args.config, args.overrides)
        s, batch_note = settings_from(args, cfg)
        start = read_start(s.checkpoint, cfg) if s.checkpoint else None
    except (ValueError, OSError) as e:  # ConfigError and CheckpointError included
        print(f"selection_quality: {e}", file=sys.stderr)
        return 2
    numel = sum(p.numel() for p in build_model(cfg.model.name).parameters())
    bn = "synchronized BatchNorm" if cfg.model.sync_batchnorm else "per-rank BatchNorm"
    header = [
        "# Selection quality along a dense trajectory (bench/selection_quality.py)",
        "",
        f"command: {' '.join([Path(sys.executable).name, *sys.argv])}" if argv is None
        else f"arguments: {' '.join(argv)}",
        f"config: {args.config} {' '.join(args.overrides)}".rstrip(),
        f"model: {cfg.model.name} ({numel:,} parameters), {bn}; global batch {s.global_batch} ({batch_note}); "
        f"seed {cfg.seed}; SGD momentum {cfg.optim.momentum:g}, weight decay {cfg.optim.weight_decay:g}, "
        f"lr {cfg.optim.lr:g}, clip {cfg.optim.max_grad_norm:g}",
        (f"start: checkpoint {s.checkpoint}" if s.checkpoint else "start: a fresh model (the config's seed)"),
        f"steps: {s.dense_steps} dense, then {s.steps} with the compressors beside dense training; simulated P: "
        f"{' '.join(map(str, s.ranks))}; densities: {' '.join(f'{d:g}' for d in s.densities)}; "
        f"the model follows the dense mean gradient at P = {s.ranks[0]}",
        f"CPU: {cpu_model()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start; "
        f"1 torch thread per simulated rank",
    ]
    print("\n".join(header), flush=True)
    if args.seeds or args.per_rank:
        return over_trajectories(args, cfg, s, start, header, t_start)
    steps, seconds = run_bench(cfg, s, start=start)
    summary = summarise(steps)
    wall = time.perf_counter() - t_start
    parts = ", ".join(f"{name} {seconds[what + '_wall']:.0f} s (CPU {seconds[what + '_cpu']:.0f} s)" for what, name in
                      (("gradients", "per-rank gradients"), ("compressors", "compressors"), ("measures", "measures")))
    footer = [f"wall time: {wall:.0f} s ({wall / 60:.1f} min), CPU time {time.process_time():.0f} s (all threads): "
              f"{parts}; load average {os.getloadavg()[0]:.1f} at the end; skipped (non-finite) steps: "
              f"{seconds['skipped_steps']}",
              "",
              "Means over the sparse steps / the last step. entries updated: mean count in the update, in units of "
              "k = density x parameters; owed = ||sum of residuals / P|| / ||dense mean gradient||; share of local "
              "picks applied = applied / selected entries, mean over ranks; ranks per applied entry = applied entries "
              "summed over ranks / entries in the update; words = 4-byte words received per rank, mean over ranks "
              "(the oracle's: a dense allreduce and a broadcast of the indices)."]
    by_algorithm = steps.groupby("algorithm", sort=False)["cpu_seconds"].sum()
    footer.insert(1, "compressors' CPU seconds (all steps, P and densities; torch's kernels and the ranks' Python): "
                  + ", ".join(f"{label} {value:.0f}" for label, value in by_algorithm.items()))
    table = markdown_table(summary)
    print("\n" + table + "\n\n" + "\n".join(footer))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(header) + "\n\n" + table + "\n\n" + "\n".join(footer) + "\n")
        steps.to_csv(args.out.with_suffix(".csv"), index=False)
        plot(summary, args.out.with_suffix(".png"), s.densities)
        print(f"wrote {args.out}, {args.out.with_suffix('.png')} and {args.out.with_suffix('.csv')}")
    return 0


def over_trajectories(args, cfg, s: Settings, start, header: list[str], t_start: float) -> int:
    """--seeds / --per-rank: one run_bench per (global batch, seed), then the tables of bench/selection_intervals.py."""
    import selection_intervals as si  # beside this file

    seeds = args.seeds or [cfg.seed]
    if args.per_rank:
        batches: dict[int, list[int]] = {}
        for P in s.ranks:
            for u in args.per_rank:
                batches.setdefault(P * u, []).append(P)
    else:
        batches = {s.global_batch: s.ranks}
    frames = []
    for batch, ranks in sorted(batches.items()):
        for seed in seeds:
            print(f"trajectory: global batch {batch}, P {' '.join(map(str, ranks))}, seed {seed}", flush=True)
            steps, _ = run_bench(replace(cfg, seed=seed), replace(s, ranks=sorted(ranks), global_batch=batch),
                                 log=lambda *a, **k: None, start=start)
            frames.append(steps.assign(seed=seed, global_batch=batch))
    steps = pd.concat(frames, ignore_index=True)
    trajectories = si.per_trajectory(steps, ORACLE)
    parts = [si.over_seeds_markdown(si.over_seeds(trajectories))]
    if args.per_rank:
        for label in dict.fromkeys(trajectories["algorithm"]):
            if label not in (ORACLE, "dense"):
                for density in s.densities:
                    parts.append(si.grid_markdown(trajectories, label, density))
    wall = time.perf_counter() - t_start
    footer = (f"{len(frames)} trajectories ({len(batches)} global batches x {len(seeds)} seeds); wall time: "
              f"{wall:.0f} s ({wall / 60:.1f} min), CPU time {time.process_time():.0f} s (all threads); load average "
              f"{os.getloadavg()[0]:.1f} at the end. Each figure: its mean over a trajectory's sparse steps, then the "
              f"mean over trajectories with its 95% Student-t interval; the gap to the oracle is taken within each "
              f"trajectory.")
    text = "\n".join(header) + "\n\n" + "\n\n".join(parts) + "\n\n" + footer + "\n"
    print("\n" + text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        steps.to_csv(args.out.with_suffix(".csv"), index=False)
        print(f"wrote {args.out} and {args.out.with_suffix('.csv')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
