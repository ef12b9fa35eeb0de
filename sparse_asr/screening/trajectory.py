"""One screen trajectory: the model trains densely as the config says while every exchange runs beside it on the
same per-rank gradients, from a fresh model or a training checkpoint."""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

import pandas as pd
import torch

from sparse_asr.compression.base import all_finite
from sparse_asr.models import build_model
from sparse_asr.screening.gradients import ShardGradients, flat_momentum, global_batches, load_training_set, mean
from sparse_asr.screening.measures import Displacements, ShadowMomentum, measure
from sparse_asr.screening.ranks import Algorithm, SimulatedRanks
from sparse_asr.training.checkpoint import load_shared
from sparse_asr.training.optim import SGDStep, attach_flat_grad, clip_grad_norm_, learning_rate, set_learning_rate


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
