"""Train a speech model with (sparse) data-parallel gradient exchange.

    python train.py --config configs/an4_cpu.yaml [key.sub=value ...]
    mpiexec -n 4 python train.py --config configs/an4_cpu.yaml compression.algorithm=oktopk compression.density=0.02
    python train.py --resume runs/NAME [train.epochs=40 ...]         (its own config; safe keys may change)
    python train.py --config configs/an4_cpu.yaml name=NAME --resume auto     (chained batch jobs)

config -> build_trainer (data, model, compressor, restored state) -> Trainer.fit(). Any exception on any rank ends the whole job.
Everything that can refuse a run (config, run directory, manifests, every audio file's header) is checked
before anything is written into the run directory, so a refused start leaves nothing behind.
"""
from __future__ import annotations

import argparse
import sys
import time

from sparse_asr.comm import Communicator
from sparse_asr.training.config import ConfigError, flatten, resolve_for_run, to_dict, to_yaml


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="YAML experiment config (see configs/); optional with --resume RUN_DIR")
    parser.add_argument("--resume", default="", help="run directory or checkpoint directory to continue (its own "
                        "config; same as train.resume=PATH); 'auto': continue the named run if it has a "
                        "checkpoint, else start it")
    parser.add_argument("--overwrite", action="store_true",
                        help="start afresh in a run directory that holds a previous run: its config.yaml, "
                             "metrics.jsonl, TensorBoard events and checkpoints/ are deleted first (with "
                             "--resume auto: only when there is no checkpoint to continue)")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides")
    return parser.parse_args(argv)


def load_manifest(manifest: str, limit: int):
    """The manifest's utterances, or only its `limit` shortest (quick runs; 0 = all)."""
    from sparse_asr.data.manifest import read_manifest

    df = read_manifest(manifest)
    if limit:
        df = df.sort_values(["duration", "utt_id"], kind="stable").head(limit)
    return df


def build_trainer(cfg, comm, resume: str = "", overwrite: bool = False):
    """Everything train.py sets up before the loop, for a resolved config: device, threads, seeds, data
    (every audio header checked), model, logger and the Trainer (restored from `resume` when given). All
    that can refuse the run is checked before the run directory is written; `overwrite` deletes a previous
    run's files there first. Returns the Trainer."""
    # Heavy imports here, so that argument errors are instant.
    from sparse_asr.data.audio import SpecAugment
    from sparse_asr.data.dataset import SpeechDataset
    from sparse_asr.fileio import atomic_write_text
    from sparse_asr.models import build_model
    from sparse_asr.training.checkpoint import CheckpointError, load_training_state, on_every_rank
    from sparse_asr.training.logging import RunLogger
    from sparse_asr.training.resume import LOCATION_KEYS, drop_metrics_after
    from sparse_asr.training.rundir import clear_previous_run
    from sparse_asr.training.runtime import (check_manifest_audio, local_rank_and_size, pick_device,
                                             precision_problem, seed_everything, set_threads)
    from sparse_asr.training.trainer import Trainer

    comm.cuda_aware = cfg.distributed.cuda_aware_mpi
    local_rank, local_size = local_rank_and_size(comm)
    device = pick_device(cfg.distributed.device, local_rank)
    if problem := precision_problem(cfg.train.precision, device):
        raise ConfigError(problem)
    threads = set_threads(cfg.train.threads, local_size)
    seed_everything(cfg.seed)
    state = load_training_state(comm, resume) if resume else None  # every file verified, on every rank
    if state is not None and state.config["model"]["name"] != cfg.model.name:
        raise ValueError(f"checkpoint {resume} holds model {state.config['model']['name']!r}, "
                         f"the config asks for {cfg.model.name!r}")

    d = cfg.data
    frames = {"train": load_manifest(d.train_manifest, d.max_train_utterances),
              "dev": load_manifest(d.dev_manifest, d.max_eval_utterances)}
    if d.test_manifest:
        frames["test"] = load_manifest(d.test_manifest, d.max_eval_utterances)
    if len(frames["train"]) < cfg.train.global_batch_size:
        raise ConfigError(f"data.train_manifest {d.train_manifest} gives {len(frames['train'])} utterances"
                          + (f" (data.max_train_utterances={d.max_train_utterances})" if d.max_train_utterances else "")
                          + f", fewer than one global batch (train.global_batch_size={cfg.train.global_batch_size})")
    augment = SpecAugment(d.freq_masks, d.freq_mask_width, d.time_masks, d.time_mask_width, d.time_mask_max_fraction)
    train_set = SpeechDataset(frames["train"], augment=augment, seed=cfg.seed)
    dev_set = SpeechDataset(frames["dev"])
    test_set = SpeechDataset(frames["test"]) if "test" in frames else None
    t0 = time.perf_counter()
    checked = check_manifest_audio(comm, list(frames.values()))
    seconds_checked = time.perf_counter() - t0
    model = build_model(cfg.model.name, sync_bn=comm if cfg.model.sync_batchnorm else None)
    trainer = Trainer(cfg, comm, model, train_set, dev_set, test_set, device, RunLogger(cfg.run_dir, enabled=False))
    if state is not None:  # refused on every rank if the checkpoint does not fit this run (shapes, compressor)
        try:
            on_every_rank(comm, lambda: trainer.load_training_state(state))
        except (ValueError, RuntimeError, KeyError) as e:
            raise CheckpointError(f"cannot resume from {resume}: {e}") from e

    # Nothing was written before this line.
    removed = clear_previous_run(cfg.run_dir) if overwrite and comm.rank == 0 else []
    if state is not None and comm.rank == 0:
        drop_metrics_after(cfg.run_dir, state.extra["metrics_rows"])  # rows a crashed run wrote after the checkpoint
    # TensorBoard readers drop the crashed run's events from step + 1 on; the checkpoint step's own points stay.
    log = trainer.log = RunLogger(cfg.run_dir, enabled=comm.rank == 0,
                                  purge_step=state.progress.step + 1 if state else None)
    if comm.rank == 0:
        atomic_write_text(cfg.run_dir / "config.yaml", to_yaml(cfg))
    log.info(f"run {cfg.run_dir} on {comm.size} rank(s), device {device}, {threads} CPU thread(s) per rank\n"
             f"--- resolved config\n{to_yaml(cfg)}---")
    if removed:
        log.info(f"--overwrite: deleted the previous run's {', '.join(p.name for p in removed)} in {cfg.run_dir}")
    log.info(f"data: {len(train_set)} train, {len(dev_set)} dev, {len(test_set) if test_set else 0} test utterances; "
             f"audio of {checked} manifest rows checked in {seconds_checked:.2f} s on {comm.size} rank(s)")
    if state is not None:
        old, new = flatten(state.config), flatten(to_dict(cfg))
        changed = [k for k, v in new.items() if old.get(k) != v and k not in LOCATION_KEYS]
        p = trainer.progress
        log.info(f"resumed from {resume}: optimizer step {p.step}, epoch {p.epoch}, batch {p.batch_in_epoch}"
                 + (f"; config keys changed since: {', '.join(changed)}" if changed else ""))
    return trainer


def run(args: argparse.Namespace, comm: Communicator) -> dict:
    from sparse_asr.training.resume import config_for_run
    from sparse_asr.training.rundir import previous_run_message
    from sparse_asr.training.runtime import Watchdog

    cfg, checkpoint = config_for_run(args.config, args.overrides, args.resume, comm.size)
    cfg = resolve_for_run(cfg, comm)
    if args.overwrite and checkpoint and cfg.train.resume != "auto":
        raise ConfigError("--overwrite starts the run afresh and --resume continues it: give one of them")
    overwrite = args.overwrite and not checkpoint  # with --resume auto: only when there is nothing to continue
    if not checkpoint and not overwrite:  # rank 0 looks (one filesystem), every rank refuses
        refusal = comm.bcast_object(previous_run_message(cfg.run_dir) if comm.rank == 0 else None)
        if refusal:
            raise FileExistsError(refusal)
    watchdog = Watchdog(comm, cfg.distributed.timeout_s) if cfg.distributed.timeout_s and comm.size > 1 else None
    trainer = build_trainer(cfg, comm, resume=checkpoint, overwrite=overwrite)
    try:
        results = trainer.fit()
    finally:
        trainer.log.close()
        if watchdog is not None:
            watchdog.stop()
    trainer.log.info(f"done: {cfg.run_dir}" + "".join(f"  {split} {k} {v:.4f}" for split, summary in results.items()
                                                     for k, v in summary.items()))
    return results


def main(argv=None) -> int:
    args = parse_args(argv)
    comm = Communicator()
    from sparse_asr.training.runtime import run_or_abort

    run_or_abort(comm, run, args, comm)
    return 0


if __name__ == "__main__":
    sys.exit(main())
