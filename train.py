"""Train a speech model with (sparse) data-parallel gradient exchange.

    python train.py --config configs/an4_cpu.yaml [key.sub=value ...]
    mpiexec -n 4 python train.py --config configs/an4_cpu.yaml compression.algorithm=oktopk compression.density=0.02
    python train.py --config configs/an4_cpu.yaml --resume runs/NAME/checkpoints/last.pt

config -> build_trainer (data, model, compressor, restored state) -> Trainer.fit(). Any exception on any rank ends the whole job.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

from sparse_asr.comm import Communicator
from sparse_asr.training.config import flatten, load_config, resolve_for_run, to_dict, to_yaml


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="YAML experiment config (see configs/)")
    parser.add_argument("--resume", default="", help="checkpoint to continue from (same as train.resume=PATH)")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides")
    return parser.parse_args(argv)


def load_dataset(manifest: str, limit: int, augment=None, seed: int = 0):
    """The manifest's utterances, or only its `limit` shortest (quick runs; 0 = all); `augment`
    (a data.audio.SpecAugment) for the training set only."""
    from sparse_asr.data.dataset import SpeechDataset
    from sparse_asr.data.manifest import read_manifest

    df = read_manifest(manifest)
    if limit:
        df = df.sort_values(["duration", "utt_id"], kind="stable").head(limit)
    return SpeechDataset(df, augment=augment, seed=seed)


def build_trainer(cfg, comm, resume: str = ""):
    """Everything train.py sets up before the loop, for a resolved config: logger, device, threads, seeds,
    data, model and the Trainer (restored from `resume` when given). Returns the Trainer."""
    # Heavy imports here, so that argument errors are instant.
    from sparse_asr.data.audio import SpecAugment
    from sparse_asr.fileio import atomic_write_text
    from sparse_asr.models import build_model
    from sparse_asr.training.checkpoint import load_training_state
    from sparse_asr.training.logging import RunLogger
    from sparse_asr.training.runtime import local_rank_and_size, pick_device, seed_everything, set_threads
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

    log = RunLogger(cfg.run_dir, enabled=comm.rank == 0, purge_step=state.progress.step if state else None)
    if comm.rank == 0:
        atomic_write_text(cfg.run_dir / "config.yaml", to_yaml(cfg))
    log.info(f"run {cfg.run_dir} on {comm.size} rank(s), device {device}, {threads} CPU thread(s) per rank\n"
             f"--- resolved config\n{to_yaml(cfg)}---")
    d = cfg.data
    augment = SpecAugment(d.freq_masks, d.freq_mask_width, d.time_masks, d.time_mask_width, d.time_mask_max_fraction)
    train_set = load_dataset(d.train_manifest, d.max_train_utterances, augment, seed=cfg.seed)
    dev_set = load_dataset(d.dev_manifest, d.max_eval_utterances)
    test_set = load_dataset(d.test_manifest, d.max_eval_utterances) if d.test_manifest else None
    log.info(f"data: {len(train_set)} train, {len(dev_set)} dev, {len(test_set) if test_set else 0} test utterances")
    model = build_model(cfg.model.name, sync_bn=comm if cfg.model.sync_batchnorm else None)
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

    cfg = load_config(args.config, args.overrides + ([f"train.resume={args.resume}"] if args.resume else []))
    if cfg.train.resume and not cfg.name:  # continue in the same run directory
        cfg = dataclasses.replace(cfg, name=load_checkpoint(cfg.train.resume)["config"]["name"])
    cfg = resolve_for_run(cfg, comm)
    trainer = build_trainer(cfg, comm, resume=cfg.train.resume)
    try:
        results = trainer.fit()
    finally:
        trainer.log.close()
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
