"""Starting a process and a run: the one path from a request to a running Trainer (DESIGN 8).

    setup_process   one rank's device, CPU threads and precision check (train.py, evaluate.py, the benches)
    plan_run        under the run directory's lock, once: fresh start or which checkpoint, the config resolved,
                    a previous run in the way; then prepare_run: the checkpoint's state and the data (every
                    audio header checked) loaded, the warm-up length fixed -> one frozen RunPlan (plan.py)
    start_run       the model, the exchange, the checkpoint's fit to them, and only then the run directory,
                    the logger and the Trainer, each built once from the plan
    run_job         a whole training job: request -> lock -> plan_run -> start_run -> Trainer.fit(), what
                    train.py runs

Any exception on any rank ends the whole job (runtime.run_or_abort around run_job).
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from sparse_asr.compression import COMPRESSORS, DEFAULT_MEMORY, Compressor, build_exchange, warmup_steps
from sparse_asr.data.audio import SpecAugment
from sparse_asr.data.dataset import BucketingSampler, SpeechDataset, TrainingData, feature_bytes
from sparse_asr.data.manifest import read_manifest
from sparse_asr.fileio import atomic_write_text
from sparse_asr.models import build_model
from sparse_asr.training.checkpoint import (CheckpointError, Located, TrainingState, check_state_fits,
                                            load_training_state, on_every_rank)
from sparse_asr.training.config import Config, ConfigError, config_digest, flatten, resolve_world_size, to_dict, to_yaml
from sparse_asr.training.plan import RunPlan, RunRequest, run_directory, run_name
from sparse_asr.training.provenance import append_provenance, provenance, summary
from sparse_asr.training.resume import drop_metrics_after, run_config
from sparse_asr.training.rundir import (RunDirLock, clear_previous_run, overwrite_problem, previous_run_message,
                                        run_paths_problem)
from sparse_asr.training.runlog import RunLogger
from sparse_asr.training.runtime import (Watchdog, check_manifest_audio, cuda_aware_problem, local_rank_and_size,
                                         pick_device, precision_problem, seed_everything, set_threads)
from sparse_asr.training.trainer import Trainer


@dataclass
class Process:
    device: torch.device
    threads: int  # torch CPU threads of this rank
    local_rank: int
    local_size: int  # ranks on this node


def setup_process(comm, device: str = "auto", threads: int = 0, precision: str = "fp32",
                  cuda_aware: bool = False) -> Process:
    """This rank's device (one GPU per rank by local rank), CPU threads (no oversubscription) and a refusal,
    naming the machine, of a precision it cannot run."""
    if problem := cuda_aware_problem(cuda_aware):
        raise ConfigError(problem)
    comm.cuda_aware = cuda_aware
    local_rank, local_size = local_rank_and_size(comm)
    picked = pick_device(device, local_rank)
    if problem := precision_problem(precision, picked):
        raise ConfigError(problem)
    return Process(picked, set_threads(threads, local_size), local_rank, local_size)


def resolve_for_run(cfg: Config, comm) -> Config:
    """Record the real world size and global batch (resolve_world_size) and the run name (timestamp from
    rank 0), then check that every rank holds the identical resolved config."""
    cfg = replace(resolve_world_size(cfg, comm.size), name=cfg.name or run_name(cfg, comm))
    check_same_on_all_ranks(cfg, comm)
    return cfg


def check_same_on_all_ranks(cfg: Config, comm) -> None:
    """Allgather a hash of the config; if any rank differs, every rank raises naming the keys."""
    digests = comm.allgather_object(config_digest(cfg))
    if len(set(digests)) == 1:
        return
    every = comm.allgather_object(flatten(to_dict(cfg)))
    lines = []
    for r, flat in enumerate(every):
        for key in sorted(set(flat) | set(every[0])):
            if flat.get(key) != every[0].get(key):
                lines.append(f"  {key}: rank 0 has {every[0].get(key)!r}, rank {r} has {flat.get(key)!r}")
    raise ConfigError("the configuration differs between ranks (every rank must run the same config):\n"
                      + "\n".join(lines))


LONG_UTTERANCE_S = 30  # a training utterance longer than this is named in a warning


def read_split(manifest: str, limit: int, problems: list[str]):
    """A manifest's utterances, or only its `limit` shortest (quick runs; 0 = all); bad rows go to `problems`."""
    df = read_manifest(manifest, problems)
    if limit:
        df = df.sort_values(["duration", "utt_id"], kind="stable").head(limit)
    return df


def load_data(cfg: Config, comm, device: torch.device = torch.device("cpu")) -> tuple[TrainingData, str]:
    """The run's datasets and its sampler, every audio header checked on the ranks together; and a line
    saying what was loaded. With data.cache_features the features are kept on `device` when they fit."""
    d = cfg.data
    problems = []  # every bad row of every manifest, named in one error with the audio's below
    frames = {"train": read_split(d.train_manifest, d.max_train_utterances, problems),
              "dev": read_split(d.dev_manifest, d.max_eval_utterances, problems)}
    if d.test_manifest:
        frames["test"] = read_split(d.test_manifest, d.max_eval_utterances, problems)
    if len(frames["dev"]) == 0 and not problems:
        raise ConfigError(f"data.dev_manifest {d.dev_manifest} holds no utterances: the dev set picks the best "
                          f"checkpoint and says when the run is done learning")
    t0 = time.perf_counter()
    checked = check_manifest_audio(comm, list(frames.values()), problems=problems)  # raises, listing all
    seconds = time.perf_counter() - t0
    if len(frames["train"]) < cfg.train.global_batch_size:
        raise ConfigError(f"data.train_manifest {d.train_manifest} gives {len(frames['train'])} utterances"
                          + (f" (data.max_train_utterances={d.max_train_utterances})" if d.max_train_utterances else "")
                          + f", fewer than one global batch (train.global_batch_size={cfg.train.global_batch_size})")
    augment = SpecAugment(d.freq_masks, d.freq_mask_width, d.time_masks, d.time_mask_width, d.time_mask_max_fraction)
    cache = d.cache_features
    train = SpeechDataset(frames["train"], augment=augment, seed=cfg.seed, cache=cache)
    data = TrainingData(train, SpeechDataset(frames["dev"], cache=cache),
                        SpeechDataset(frames["test"], cache=cache) if "test" in frames else None,
                        make_sampler(cfg, comm, train))
    cached = ""
    if cache:
        sets = [s for s in (data.train, data.dev, data.test) if s is not None]
        where, cached = cache_placement(sum(feature_bytes(s) for s in sets), device)
        for s in sets:
            s.cache_device = where
    said = (f"data: {len(data.train)} train, {len(data.dev)} dev, {len(data.test) if data.test else 0} test "
            f"utterances; audio of {checked} manifest rows checked in {seconds:.2f} s on {comm.size} rank(s){cached}")
    said += long_utterances(frames)
    return data, said


def long_utterances(frames: dict) -> str:
    """A warning naming the utterances of every set (train, dev, test) longer than LONG_UTTERANCE_S, or "": memory
    and step time grow with the longest utterance of a batch, in evaluation as in training."""
    out = ""
    for split, frame in frames.items():
        long = frame[frame["duration"] > LONG_UTTERANCE_S] if len(frame) else frame
        if len(long):
            what = "training" if split == "train" else split
            out += (f"\nWARNING: {len(long)} {what} utterance(s) longer than {LONG_UTTERANCE_S:g} s (AN4's longest is "
                    f"about 10 s; memory and step time grow with length): " + ", ".join(
                        f"{frame.attrs['manifest']}:{line} ({length:.0f} s)"
                        for line, length in zip(long["line"][:5], long["duration"][:5])))
    return out


def cache_placement(nbytes: int, device: torch.device) -> tuple[torch.device, str]:
    """Where data.cache_features keeps the features, and why: on the GPU when they take at most 1/8 of its
    free memory (several runs may share it, and the model needs the rest), else in host memory."""
    gb = f"{nbytes / 1e9:.2f} GB"
    if device.type != "cuda":
        return torch.device("cpu"), f"; features cached in host memory after their first use ({gb})"
    free, _ = torch.cuda.mem_get_info(device)
    if nbytes <= free / 8:
        return device, f"; features cached on {device} after their first use ({gb}): batches padded and masked there"
    return torch.device("cpu"), (f"; features cached in host memory ({gb}: more than 1/8 of the {free / 1e9:.1f} GB "
                                 f"free on {device})")


def ctc_unalignable(dataset: SpeechDataset, model: torch.nn.Module) -> list[str]:
    """'manifest:line (utt_id): L labels, F frames' for every utterance CTC cannot align: it needs one output
    frame per label plus one blank between repeated labels, and the model's convolutions shorten time."""
    f = dataset.features
    frames = model.output_lengths(torch.as_tensor([f.num_frames(round(d * f.sample_rate)) for d in dataset.durations]))
    lines = dataset.lines
    out = []
    for i, target in enumerate(dataset.targets):
        needed = len(target) + int((target[1:] == target[:-1]).sum())
        if needed > int(frames[i]):
            out.append(f"  {dataset.source}:{lines[i]} ({dataset.utt_ids[i]}): {len(target)} labels need {needed} "
                       f"frames, the model gives {int(frames[i])}")
    return out


def make_sampler(cfg: Config, comm, train: SpeechDataset) -> BucketingSampler:
    return BucketingSampler(train.durations, cfg.train.global_batch_size, comm.rank, comm.size, seed=cfg.seed,
                            shuffle=True, drop_last=True, sorted_epochs=cfg.train.sorted_epochs)


def configured_warmup(cfg: Config, sampler: BucketingSampler) -> int:
    """compression.warmup_steps for a run of this sampler's epochs ('auto' depends on the run's length)."""
    return warmup_steps(cfg.compression.warmup_steps, sampler.batches_per_epoch * cfg.train.epochs)


def make_compressor(cfg: Config, comm, model: torch.nn.Module, device, warmup: int) -> Compressor:
    """The configured gradient exchange for the model's trainable parameters, behind `warmup` dense steps."""
    shapes = [p.shape for p in model.parameters() if p.requires_grad]
    return build_exchange(cfg.compression, cfg.optim, comm, shapes, device, warmup=warmup)


def bare_trainer(cfg: Config, comm, model: torch.nn.Module, train: SpeechDataset, device) -> Trainer:
    """A Trainer for benches and tests that call train_step themselves: no dev or test set, no run directory
    (a disabled logger), the configured warm-up resolved as for a run of this data."""
    sampler = make_sampler(cfg, comm, train)
    warmup = configured_warmup(cfg, sampler)
    return Trainer(cfg, comm, model, make_compressor(cfg, comm, model, device, warmup),
                   TrainingData(train, None, None, sampler), device, RunLogger(cfg.run_dir, enabled=False))


def plan_run(request: RunRequest, run_dir: Path, comm) -> RunPlan:
    """Collective, under `run_dir`'s lock (run_job holds it): everything the lock protects decided once, on what
    the directory holds now (a chained job that was slow to start must see what the job before it left, not what
    was there earlier): fresh start or which checkpoint, the config resolved (and the same on every rank), a
    previous run in the way. Then prepare_run. Nothing is written."""
    cfg, checkpoint, notes = run_config(request, comm.size)  # resolved for this job's ranks
    cfg = replace(cfg, name=cfg.name or run_dir.name)  # a fresh run without a name: the one its directory got
    check_same_on_all_ranks(cfg, comm)
    if cfg.run_dir.resolve() != run_dir.resolve():
        raise CheckpointError(f"the run moved from {run_dir} to {cfg.run_dir} while this job started")
    overwrite = request.overwrite and not checkpoint  # with --resume auto: only when there is nothing to continue
    # rank 0 looks (one filesystem), every rank refuses: a path the run would write that is not safe to write,
    # a previous run in the way, or one --overwrite cannot prove is this run
    refusal = None
    if comm.rank == 0:
        refusal = run_paths_problem(cfg.run_dir)
        if refusal is None and not checkpoint:
            refusal = overwrite_problem(cfg.run_dir, cfg.name) if overwrite else previous_run_message(cfg.run_dir)
    refusal = comm.bcast_object(refusal)
    if refusal:
        raise FileExistsError(refusal)
    return prepare_run(cfg, comm, checkpoint, overwrite, notes)


def settings_line(cfg: Config, world_size: int) -> str:
    """The settings a reader checks first, in one line; the whole resolved config is the run's config.yaml."""
    c = cfg.compression
    exchange = f"{c.algorithm} at density {c.density:g}" if COMPRESSORS[c.algorithm].uses_density else c.algorithm
    if c.memory != DEFAULT_MEMORY:
        exchange += f", memory {c.memory}"
    batch = cfg.train.global_batch_size or cfg.train.batch_per_rank * world_size
    return (f"config: model {cfg.model.name}, {exchange}, global batch {batch}, lr {cfg.optim.lr:g}, "
            f"{cfg.train.epochs} epochs, seed {cfg.seed}")


def prepare_run(cfg: Config, comm, checkpoint: str | Located | None = None, overwrite: bool = False,
                notes: Sequence[str] = ()) -> RunPlan:
    """Collective: the plan of a resolved config: this rank's process set up, the checkpoint's state loaded (every
    file verified, on every rank), the data loaded (every audio header checked) and the warm-up length fixed.
    Whatever refuses the run here refuses it before anything is written."""
    process = setup_process(comm, cfg.distributed.device, cfg.train.threads, cfg.train.precision,
                            cfg.distributed.cuda_aware_mpi)
    seed_everything(cfg.seed)
    state = load_training_state(comm, checkpoint) if checkpoint else None
    if state is not None and state.config["model"]["name"] != cfg.model.name:
        raise ConfigError(f"checkpoint {checkpoint} holds model {state.config['model']['name']!r}, "
                          f"the config asks for {cfg.model.name!r}")
    data, data_line = load_data(cfg, comm, process.device)
    # The warm-up length is fixed when a run starts ('auto' depends on train.epochs, which a resume may change).
    warmup = state.extra["warmup_steps"] if state is not None else configured_warmup(cfg, data.sampler)
    return RunPlan(cfg, process, data, data_line, warmup, checkpoint or None, state, overwrite, tuple(notes))


def start_run(plan: RunPlan, comm) -> Trainer:
    """Collective: the Trainer of a plan, restored from its checkpoint's state when it continues one. The
    checkpoint's fit to the model and the exchange is checked on every rank before the run directory is touched;
    a plan with `overwrite` deletes a previous run's files there first."""
    cfg, state, process, data = plan.config, plan.state, plan.process, plan.data
    model = build_model(cfg.model.name, sync_bn=comm if cfg.model.sync_batchnorm else None)
    unalignable = ctc_unalignable(data.train, model)
    compressor = make_compressor(cfg, comm, model, process.device, plan.warmup_steps)
    if state is not None:  # refused on every rank if the checkpoint does not fit this run
        on_every_rank(comm, lambda: check_fits(state, model, compressor, plan.checkpoint))

    # Nothing was written before this line (but run_job's lock file).
    cleared, removed = clear_previous_run(cfg.run_dir) if plan.overwrite and comm.rank == 0 else (None, [])
    dropped = None  # rows a crashed run wrote after the checkpoint, or a row it cut
    if state is not None and comm.rank == 0:
        dropped = drop_metrics_after(cfg.run_dir, state.extra["metrics_rows"])
    record = provenance(comm.size, process.device) if comm.rank == 0 else None
    if comm.rank == 0:  # config.yaml first: the run's files then always say which run they are (--overwrite)
        atomic_write_text(cfg.run_dir / "config.yaml", to_yaml(cfg))
    # TensorBoard readers drop the crashed run's events from step + 1 on; the checkpoint step's own points stay.
    log = RunLogger(cfg.run_dir, enabled=comm.rank == 0, purge_step=state.progress.step + 1 if state else None)
    if comm.rank == 0:
        append_provenance(cfg.run_dir, record)  # which code, machine and libraries (one line per start)
    log.info(f"run {cfg.run_dir} on {comm.size} rank(s), device {process.device}, {process.threads} CPU thread(s) "
             f"per rank\n{settings_line(cfg, comm.size)} (every setting: {cfg.run_dir / 'config.yaml'})")
    if record is not None:
        log.info(f"provenance: {summary(record)}")
    if dropped:
        log.info(dropped)
    if removed:
        log.info(f"--overwrite: deleted the previous run's {', '.join(p.name for p in removed)} in {cleared}")
    log.info(plan.data_line)
    if unalignable:  # CTC's zero_infinity turns their loss into 0: they would train nothing, silently
        log.warn(f"{len(unalignable)} training utterances have more labels than the model's output frames can "
                 f"align (CTC loss infinite, counted as 0: they teach nothing):\n" + "\n".join(unalignable))
    trainer = Trainer(cfg, comm, model, compressor, data, process.device, log)
    if state is not None:
        trainer.restore(state)
        p = trainer.progress
        log.info(f"resumed from {plan.checkpoint}: optimizer step {p.step}, epoch {p.epoch}, batch {p.batch_in_epoch}")
    for note in plan.notes:
        log.info(note)
    return trainer


def check_fits(state: TrainingState, model: torch.nn.Module, compressor: Compressor, resume: str) -> None:
    """A CheckpointError naming what differs when the checkpoint's model or compressor state has other keys or
    shapes than this run's (e.g. a dense checkpoint resumed with a sparse compressor: no residual)."""
    try:
        check_state_fits("model", model.state_dict(), {**state.model, **state.mine.buffers})
        check_state_fits("compressor", compressor.state_dict(), state.mine.compressor)
    except CheckpointError as e:
        raise CheckpointError(f"cannot resume from {resume}: {e}") from e


def run_job(comm, request: RunRequest) -> dict:
    """Collective: a whole training job, as train.py's command line asks it (`request`, parsed once); returns the
    last dev and test summaries."""
    # From the first collective on, a rank that stops (a stalled node) ends the job instead of hanging it.
    watchdog = watch(comm, request.timeout_s)
    lock = None
    try:
        run_dir = run_directory(request, comm)
        lock = RunDirLock(run_dir, comm)
        lock.acquire()
        plan = plan_run(request, run_dir, comm)
        if plan.config.distributed.timeout_s != request.timeout_s:  # a resumed run's own, known only now
            watchdog = watch(comm, plan.config.distributed.timeout_s, replacing=watchdog)
        trainer = start_run(plan, comm)
        try:
            results = trainer.fit()
        finally:
            trainer.log.close()
    finally:
        if lock is not None:
            lock.release()
        if watchdog is not None:
            watchdog.stop()
    beam = plan.config.train.eval_decoder == "beam"
    decoders = "greedy decoding" + ("; beam_*: the beam + lexicon + LM" if beam else "")
    trainer.log.info(f"done: {plan.run_dir}" + "".join(f"  {split} {k} {v:.4f}" for split, summary in results.items()
                                                      for k, v in summary.items()) + f"  ({decoders})")
    return results


def watch(comm, timeout_s: float, replacing: Watchdog | None = None) -> Watchdog | None:
    """A Watchdog of distributed.timeout_s (None when off, or on one rank), stopping the one it replaces."""
    if replacing is not None:
        replacing.stop()
    return Watchdog(comm, timeout_s) if timeout_s and comm.size > 1 else None
