"""Train a speech model with (sparse) data-parallel gradient exchange.

    python train.py --config configs/an4_cpu.yaml [key.sub=value ...]
    mpiexec -n 4 python train.py --config configs/an4_cpu.yaml compression.algorithm=oktopk compression.density=0.02
    python train.py --config configs/an4_cpu.yaml --resume runs/NAME/checkpoints/last.pt

config -> build_trainer (data, model, compressor, restored state) -> Trainer.fit(). Any exception on any rank ends the whole job.
Everything that can refuse a run (config, run directory, manifests, every audio file's header) is checked
before anything is written into the run directory, so a refused start leaves nothing behind.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time

from sparse_asr.comm import Communicator
from sparse_asr.training.config import ConfigError, flatten, load_config, resolve_for_run, to_dict, to_yaml


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="YAML experiment config (see configs/)")
    parser.add_argument("--resume", default="", help="checkpoint to continue from (same as train.resume=PATH)")
    parser.add_argument("--overwrite", action="store_true",
                        help="start afresh in a run directory that holds a previous run: its config.yaml, "
                             "metrics.jsonl, TensorBoard events and checkpoints/ are deleted first")
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
    from sparse_asr.training.checkpoint import load_training_state
    from sparse_asr.training.logging import RunLogger
    from sparse_asr.training.rundir import clear_previous_run
    from sparse_asr.training.runtime import (check_manifest_audio, local_rank_and_size, pick_device, seed_everything,
                                             set_threads)
    from sparse_asr.training.trainer import Trainer

    comm.cuda_aware = cfg.distributed.cuda_aware_mpi
    local_rank, local_size = local_rank_and_size(comm)
    device = pick_device(cfg.distributed.device, local_rank)
    threads = set_threads(cfg.train.threads, local_size)
    seed_everything(cfg.seed)
    state = load_training_state(comm, resume) if resume else None
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

    # Nothing was written before this line.
    removed = clear_previous_run(cfg.run_dir) if overwrite and comm.rank == 0 else []
    log = RunLogger(cfg.run_dir, enabled=comm.rank == 0, purge_step=state.progress.step if state else None)
    if comm.rank == 0:
        atomic_write_text(cfg.run_dir / "config.yaml", to_yaml(cfg))
    log.info(f"run {cfg.run_dir} on {comm.size} rank(s), device {device}, {threads} CPU thread(s) per rank\n"
             f"--- resolved config\n{to_yaml(cfg)}---")
    if removed:
        log.info(f"--overwrite: deleted the previous run's {', '.join(p.name for p in removed)} in {cfg.run_dir}")
    log.info(f"data: {len(train_set)} train, {len(dev_set)} dev, {len(test_set) if test_set else 0} test utterances; "
             f"audio of {checked} manifest rows checked in {seconds_checked:.2f} s on {comm.size} rank(s)")
    trainer = Trainer(cfg, comm, model, train_set, dev_set, test_set, device, log)
    if state is not None:
        trainer.load_training_state(state)
        old, new = flatten(state.config), flatten(to_dict(cfg))
        changed = [k for k, v in new.items() if old.get(k) != v]
        p = trainer.progress
        log.info(f"resumed from {resume}: optimizer step {p.step}, epoch {p.epoch}, batch {p.batch_in_epoch}"
                 + (f"; config keys changed since: {', '.join(changed)}" if changed else ""))
    return trainer


def run(args: argparse.Namespace, comm: Communicator) -> dict:
    from sparse_asr.training.checkpoint import load_checkpoint
    from sparse_asr.training.rundir import previous_run_message
    from sparse_asr.training.runtime import Watchdog

    cfg = load_config(args.config, args.overrides + ([f"train.resume={args.resume}"] if args.resume else []))
    if cfg.train.resume and not cfg.name:  # continue in the same run directory
        cfg = dataclasses.replace(cfg, name=load_checkpoint(cfg.train.resume)["config"]["name"])
    cfg = resolve_for_run(cfg, comm)
    if args.overwrite and cfg.train.resume:
        raise ConfigError("--overwrite starts the run afresh and --resume continues it: give one of them")
    if not cfg.train.resume and not args.overwrite:  # rank 0 looks (one filesystem), every rank refuses
        refusal = comm.bcast_object(previous_run_message(cfg.run_dir) if comm.rank == 0 else None)
        if refusal:
            raise FileExistsError(refusal)
    watchdog = Watchdog(comm, cfg.distributed.timeout_s) if cfg.distributed.timeout_s and comm.size > 1 else None
    trainer = build_trainer(cfg, comm, resume=cfg.train.resume, overwrite=args.overwrite)
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
