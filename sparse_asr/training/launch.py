"""Starting a process and a run: the one path from a config to a running Trainer (DESIGN 8).

    setup_process   one rank's device, CPU threads and precision check (train.py, evaluate.py, the benches)
    start_run       everything before the training loop, in the order that lets it refuse a run without
                    writing anything: the checkpoint first, then the data (every audio header checked), the
                    model, the compressor (its warm-up length taken from the checkpoint), the checkpoint's fit
                    to them, and only then the run directory, the logger and the Trainer, each built once
    run_job         a whole training job: config (and resume) -> start_run -> Trainer.fit(), what train.py runs

Any exception on any rank ends the whole job (runtime.run_or_abort around run_job).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch

from sparse_asr.compression import Compressor, ErrorFeedback, build_compressor, warmup_steps
from sparse_asr.compression.memory import build_memory
from sparse_asr.data.audio import SpecAugment
from sparse_asr.data.dataset import BucketingSampler, SpeechDataset, TrainingData, feature_bytes
from sparse_asr.data.manifest import read_manifest
from sparse_asr.fileio import atomic_write_text
from sparse_asr.models import build_model
from sparse_asr.training.checkpoint import (CheckpointError, Located, TrainingState, check_state_fits,
                                            load_training_state, on_every_rank)
from sparse_asr.training.config import (Config, ConfigError, config_digest, default_run_name, flatten,
                                        resolve_world_size, to_dict, to_yaml)
from sparse_asr.training.provenance import append_provenance, provenance, summary
from sparse_asr.training.resume import config_for_run, drop_metrics_after
from sparse_asr.training.rundir import RunDirLock, clear_previous_run, previous_run_message
from sparse_asr.training.runlog import RunLogger
from sparse_asr.training.runtime import (Watchdog, check_manifest_audio, local_rank_and_size, pick_device,
                                         precision_problem, seed_everything, set_threads)
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
    comm.cuda_aware = cuda_aware
    local_rank, local_size = local_rank_and_size(comm)
    picked = pick_device(device, local_rank)
    if problem := precision_problem(precision, picked):
        raise ConfigError(problem)
    return Process(picked, set_threads(threads, local_size), local_rank, local_size)


def resolve_for_run(cfg: Config, comm) -> Config:
    """Record the real world size and global batch (resolve_world_size) and the run name (timestamp from
    rank 0), then check that every rank holds the identical resolved config."""
    cfg = resolve_world_size(cfg, comm.size)
    name = cfg.name
    if not name:
        timestamp = comm.bcast_object(time.strftime("%Y%m%d-%H%M%S") if comm.rank == 0 else None)
        name = default_run_name(cfg, comm.size, timestamp)
    cfg = replace(cfg, name=name)
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
    long = frames["train"][frames["train"]["duration"] > LONG_UTTERANCE_S]
    if len(long):  # memory and step time grow with the longest utterance of a batch
        said += (f"\nWARNING: {len(long)} training utterance(s) longer than {LONG_UTTERANCE_S:g} s (AN4's longest is "
                 f"about 10 s; memory and step time grow with length): " + ", ".join(
                     f"{frames['train'].attrs['manifest']}:{line} ({length:.0f} s)"
                     for line, length in zip(long["line"][:5], long["duration"][:5])))
    return data, said


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
    c = cfg.compression
    shapes = [p.shape for p in model.parameters() if p.requires_grad]
    numel = sum(s.numel() for s in shapes)
    memory = None  # error feedback, the compressor's default (and the only memory dense or PowerSGD take)
    if c.memory != ErrorFeedback.name:
        memory = build_memory(c.memory, numel, device, cfg.optim, c)
    return build_compressor(c.algorithm, comm, numel, c.density, device, shapes=shapes, warmup=warmup,
                            dense_1d=c.dense_1d, memory=memory, density_warmup_epochs=c.density_warmup_epochs,
                            **c.options)


def bare_trainer(cfg: Config, comm, model: torch.nn.Module, train: SpeechDataset, device) -> Trainer:
    """A Trainer for benches and tests that call train_step themselves: no dev or test set, no run directory
    (a disabled logger), the configured warm-up resolved as for a run of this data."""
    sampler = make_sampler(cfg, comm, train)
    warmup = configured_warmup(cfg, sampler)
    return Trainer(cfg, comm, model, make_compressor(cfg, comm, model, device, warmup),
                   TrainingData(train, None, None, sampler), device, RunLogger(cfg.run_dir, enabled=False))


def start_run(cfg: Config, comm, resume: str | Located | None = None, overwrite: bool = False) -> Trainer:
    """Collective: the Trainer of a resolved config, restored from the checkpoint `resume` when given. All
    that can refuse the run is checked on every rank before the run directory is touched (run_job holds
    its lock by then); `overwrite` deletes a previous run's files there first."""
    process = setup_process(comm, cfg.distributed.device, cfg.train.threads, cfg.train.precision,
                            cfg.distributed.cuda_aware_mpi)
    seed_everything(cfg.seed)
    state = load_training_state(comm, resume) if resume else None  # every file verified, on every rank
    if state is not None and state.config["model"]["name"] != cfg.model.name:
        raise ConfigError(f"checkpoint {resume} holds model {state.config['model']['name']!r}, "
                          f"the config asks for {cfg.model.name!r}")
    data, data_line = load_data(cfg, comm, process.device)
    model = build_model(cfg.model.name, sync_bn=comm if cfg.model.sync_batchnorm else None)
    unalignable = ctc_unalignable(data.train, model)
    # The warm-up length is fixed when a run starts ('auto' depends on train.epochs, which a resume may change).
    warmup = state.extra["warmup_steps"] if state is not None else configured_warmup(cfg, data.sampler)
    compressor = make_compressor(cfg, comm, model, process.device, warmup)
    if state is not None:  # refused on every rank if the checkpoint does not fit this run
        on_every_rank(comm, lambda: check_fits(state, model, compressor, resume))

    # Nothing was written before this line (but run_job's lock file).
    removed = clear_previous_run(cfg.run_dir) if overwrite and comm.rank == 0 else []
    dropped = None  # rows a crashed run wrote after the checkpoint, or a row it cut
    if state is not None and comm.rank == 0:
        dropped = drop_metrics_after(cfg.run_dir, state.extra["metrics_rows"])
    # TensorBoard readers drop the crashed run's events from step + 1 on; the checkpoint step's own points stay.
    log = RunLogger(cfg.run_dir, enabled=comm.rank == 0, purge_step=state.progress.step + 1 if state else None)
    record = provenance(comm.size, process.device) if comm.rank == 0 else None
    if comm.rank == 0:
        atomic_write_text(cfg.run_dir / "config.yaml", to_yaml(cfg))
        append_provenance(cfg.run_dir, record)  # which code, machine and libraries (one line per start)
    log.info(f"run {cfg.run_dir} on {comm.size} rank(s), device {process.device}, {process.threads} CPU thread(s) "
             f"per rank\n--- resolved config\n{to_yaml(cfg)}---")
    if record is not None:
        log.info(f"provenance: {summary(record)}")
    if dropped:
        log.info(dropped)
    if removed:
        log.info(f"--overwrite: deleted the previous run's {', '.join(p.name for p in removed)} in {cfg.run_dir}")
    log.info(data_line)
    if unalignable:  # CTC's zero_infinity turns their loss into 0: they would train nothing, silently
        log.warn(f"{len(unalignable)} training utterances have more labels than the model's output frames can "
                 f"align (CTC loss infinite, counted as 0: they teach nothing):\n" + "\n".join(unalignable))
    trainer = Trainer(cfg, comm, model, compressor, data, process.device, log)
    if state is not None:
        trainer.restore(state)
        p = trainer.progress
        log.info(f"resumed from {resume}: optimizer step {p.step}, epoch {p.epoch}, batch {p.batch_in_epoch}")
    return trainer


def check_fits(state: TrainingState, model: torch.nn.Module, compressor: Compressor, resume: str) -> None:
    """A CheckpointError naming what differs when the checkpoint's model or compressor state has other keys or
    shapes than this run's (e.g. a dense checkpoint resumed with a sparse compressor: no residual)."""
    try:
        check_state_fits("model", model.state_dict(), {**state.model, **state.mine.buffers})
        check_state_fits("compressor", compressor.state_dict(), state.mine.compressor)
    except CheckpointError as e:
        raise CheckpointError(f"cannot resume from {resume}: {e}") from e


def run_job(comm, config: str | None, overrides: list[str], resume: str = "", overwrite: bool = False) -> dict:
    """Collective: a whole training job, as train.py's command line asks it; returns the last dev and test
    summaries. `resume`: a run or checkpoint directory, 'auto', or '' (then the config's train.resume)."""
    # Where the run lives, and every config error, before any file is touched (no collective yet).
    cfg, _, _ = config_for_run(config, overrides, resume, comm.size)
    # From the first collective on, a rank that stops (a stalled node) ends the job instead of hanging it.
    watchdog = Watchdog(comm, cfg.distributed.timeout_s) if cfg.distributed.timeout_s and comm.size > 1 else None
    lock = None
    try:
        cfg = resolve_for_run(cfg, comm)  # the run's name (a timestamp from rank 0 if none was given)
        lock = RunDirLock(cfg.run_dir, comm)
        lock.acquire()
        # What to do (fresh start, which checkpoint, a previous run in the way) is decided under the lock: a
        # chained job that was slow to start must see what the job before it left, not what was there earlier.
        locked_dir = cfg.run_dir
        cfg, checkpoint, notes = config_for_run(config, [*overrides, f"name={cfg.name}"], resume, comm.size)
        cfg = resolve_for_run(cfg, comm)
        if cfg.run_dir.resolve() != locked_dir.resolve():
            raise CheckpointError(f"the run moved from {locked_dir} to {cfg.run_dir} while this job started")
        if overwrite and checkpoint and cfg.train.resume != "auto":
            raise ConfigError("--overwrite starts the run afresh and --resume continues it: give one of them")
        overwrite = overwrite and not checkpoint  # with --resume auto: only when there is nothing to continue
        if not checkpoint and not overwrite:  # rank 0 looks (one filesystem), every rank refuses
            refusal = comm.bcast_object(previous_run_message(cfg.run_dir) if comm.rank == 0 else None)
            if refusal:
                raise FileExistsError(refusal)
        trainer = start_run(cfg, comm, resume=checkpoint, overwrite=overwrite)
        for note in notes:
            trainer.log.info(note)
        try:
            results = trainer.fit()
        finally:
            trainer.log.close()
    finally:
        if lock is not None:
            lock.release()
        if watchdog is not None:
            watchdog.stop()
    trainer.log.info(f"done: {cfg.run_dir}" + "".join(f"  {split} {k} {v:.4f}" for split, summary in results.items()
                                                     for k, v in summary.items()))
    return results
