"""Where the main job's time goes: one process training a config (configs/an4_cpu.yaml), phase by phase, per variant.

    .venv/bin/python bench/train_profile.py [--config configs/an4_cpu.yaml] [--steps 20] \
        [--variant NAME key.sub=value ...]...   (default variants: fp32, cached, bf16, bf16 cached, 1 thread)

For every variant: the config with the variant's overrides, a fresh model of the config's seed and the real
Trainer (training.launch.bare_trainer), the training set's second epoch (shuffled, SpecAugment on: what 24 of the
main job's 25 epochs are) read through the trainer's own loader. Timed per step: data (the loader's next batch:
audio, STFT, masks, padding), compute (forward + CTC + backward: train_step's own figure) and the rest of
train_step (finite check, exchange, clipping, SGD); then one dev evaluation. With data.cache_features every
utterance's features are computed once first ("cache fill", which the main job pays once, in its first epoch).

The estimate is what a run of the config would take: epochs x steps per epoch x (data + step) + epochs x dev
evaluation + one test evaluation (about 1.3 dev's: 130 utterances against 99) + the cache fill; start-up, logging
and checkpoints are not in it. Compare variants side by side in one run on a quiet machine.
"""
import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from sparse_asr.comm import Communicator
from sparse_asr.data.dataset import make_loader
from sparse_asr.models import build_model
from sparse_asr.training.config import load_config
from sparse_asr.training.evaluation import evaluate
from sparse_asr.training.launch import bare_trainer, load_data, resolve_for_run, setup_process
from sparse_asr.training.runtime import cpu_model, seed_everything

DEFAULT_VARIANTS = [["fp32"], ["cached", "data.cache_features=true"], ["bf16", "train.precision=bf16"],
                    ["bf16 cached", "train.precision=bf16", "data.cache_features=true"],
                    ["fp32 1 thread", "train.threads=1"]]


def profile(config: str, overrides: list[str], steps: int, comm) -> dict:
    cfg = resolve_for_run(load_config(config, overrides), comm)
    process = setup_process(comm, "cpu", cfg.train.threads, cfg.train.precision)
    seed_everything(cfg.seed)
    data, _ = load_data(cfg, comm, process.device)
    sets = [d for d in (data.train, data.dev, data.test) if d is not None]  # a config may have no test set
    test_utterances = len(data.test) if data.test is not None else 0
    fill = 0.0
    if cfg.data.cache_features:
        t0 = time.perf_counter()
        for dataset in sets:
            for i in range(len(dataset)):
                dataset[i]
        fill = time.perf_counter() - t0
    model = build_model(cfg.model.name, sync_bn=comm if cfg.model.sync_batchnorm else None)
    trainer = bare_trainer(cfg, comm, model, data.train, process.device)
    trainer.sampler.set_epoch(1)
    data.train.set_epoch(1)
    loader = iter(make_loader(data.train, trainer.sampler, cfg.data.num_workers))
    times = {"data": [], "compute": [], "rest": []}
    for i in range(steps + 1):  # the first step warms up allocators and kernels
        t0 = time.perf_counter()
        batch = next(loader)
        t1 = time.perf_counter()
        record = trainer.train_step(batch)
        t2 = time.perf_counter()
        if record is None:
            raise FloatingPointError(f"step {i} was skipped (non-finite loss or gradient)")
        if i:
            times["data"].append(t1 - t0)
            times["compute"].append(record.seconds_compute)
            times["rest"].append(t2 - t1 - record.seconds_compute)
    t0 = time.perf_counter()
    evaluate(trainer.model, data.dev, comm, process.device, cfg.train.eval_batch_size, cfg.data.num_workers)
    dev_s = time.perf_counter() - t0
    per_step = {k: statistics.mean(v) for k, v in times.items()}
    run_s = (cfg.train.epochs * trainer.steps_per_epoch * sum(per_step.values())
             + cfg.train.epochs * dev_s + dev_s * test_utterances / len(data.dev) + fill)
    return {**per_step, "step": sum(per_step.values()), "dev_eval": dev_s, "fill": fill, "run_min": run_s / 60,
            "threads": torch.get_num_threads(), "steps_per_epoch": trainer.steps_per_epoch,
            "epochs": cfg.train.epochs, "dev_utterances": len(data.dev), "test_utterances": test_utterances}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/an4_cpu.yaml")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per variant (after one discarded)")
    parser.add_argument("--variant", nargs="+", action="append", metavar="NAME [key.sub=value ...]",
                        help="a row: its name, then its overrides (repeat for more rows)")
    parser.add_argument("--json", type=Path, help="also write every row's unrounded figures here")
    args = parser.parse_args()
    comm = Communicator()
    if comm.size != 1:
        raise SystemExit("train_profile.py: one process (the main job's setting); run it without mpiexec -n P > 1")
    print(f"{cpu_model()}; {args.config}, {args.steps} steps of epoch 2 per variant; seconds per step")
    print("| variant | threads | data | compute | rest | step | dev eval s | cache fill s | run min (est.) |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows = []
    for name, *overrides in args.variant or DEFAULT_VARIANTS:
        r = profile(args.config, overrides, args.steps, comm)
        rows.append({"variant": name, "overrides": overrides, **r})
        print(f"| {name} | {r['threads']} | {r['data']:.3f} | {r['compute']:.3f} | {r['rest']:.3f} | {r['step']:.3f} "
              f"| {r['dev_eval']:.2f} | {r['fill']:.2f} | {r['run_min']:.2f} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu_model(), "config": args.config, "steps": args.steps, "rows": rows},
                                        indent=1))


if __name__ == "__main__":
    main()
