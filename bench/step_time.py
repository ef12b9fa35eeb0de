"""Where the time of one real training step goes, per gradient-exchange algorithm.

    mpiexec -n P .venv/bin/python bench/step_time.py --model lstman4 \
        --algorithms dense topka topkdsa gtopk gaussiank oktopk --density 0.02 --global-batch 16 \
        --steps 5 --warmup 1 [--json out.json] [--config configs/x.yaml] [--set key.sub=value ...]

For every algorithm: the config is built by training.config (load_config + resolve_for_run, with
compression.warmup_steps=0 so the algorithm runs from the first step), then a fresh model (same seed,
so every algorithm starts from the same weights) and a fresh training.trainer.Trainer, and
`Trainer.train_step(batch)` -- the training step itself, nothing re-implemented -- runs
`--warmup` + `--steps` times; the warm-up steps are discarded (first-step allocations, and the
exact threshold/partition computations every sparse algorithm does on its first step).

The batch: one fixed global batch of real AN4 utterances, the same for every algorithm and step so the
rows are comparable: the train manifest sorted by duration and cut into global batches (the trainer's
BucketingSampler without shuffling), and the middle one taken (median length). Its features are
computed once before timing, so data loading is not in the figures (the trainer's DataLoader does it
in training). Rank r gets the r-th slice of it, as in training.

Per step and rank, train_step returns t_compute (zero grad + forward + loss + backward, device
synchronised), t_select and t_comm (the compressor's selection seconds and the Communicator's seconds
in its calls) and bytes received; total is the wall time of the whole train_step (device
synchronised), so other = total - compute - selection - communication >= 0 is the rest: the finite
check (an allreduce of one flag before the exchange: this is where a rank waits for slower ranks to
finish their backward), scattering the update, error-feedback bookkeeping, clipping and the SGD
step. Each rank's means over the measured steps are reduced over ranks (mean, and max in the JSON).

On CUDA the compressors' selection timers do not synchronise the device, so kernels they launch
may be counted in communication (which waits for them) instead of selection; total is exact.
Ok-Topk recomputes its thresholds exactly every 32 exchanges and repartitions every 64 (and on
exchanges 1, 2, 4, ..., 32 after a cold start); the output says how many measured steps did
which, since a short run weights them differently from a long one (--steps 128 is representative).
"""
import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

import numpy as np
import torch

from sparse_asr.comm import Communicator
from sparse_asr.compression import COMPRESSORS
from sparse_asr.data.dataset import BucketingSampler, SpeechDataset, collate
from sparse_asr.data.manifest import read_manifest
from sparse_asr.models import build_model
from sparse_asr.training.config import load_config
from sparse_asr.training.launch import bare_trainer, resolve_for_run, setup_process
from sparse_asr.training.runtime import cpu_model, run_or_abort, seed_everything

TIMES = ["t_compute", "t_select", "t_comm", "t_other", "t_step"]
FIGURES = TIMES + ["bytes_recv", "bytes_sent"]


def fixed_batch(dataset: SpeechDataset, global_batch: int, rank: int, size: int):
    """The median-length global batch of the duration-sorted manifest: (its dataset indices, this
    rank's share as a collated Batch)."""
    sampler = BucketingSampler(dataset.durations, global_batch, rank, size, shuffle=False, drop_last=True)
    batches = sampler.global_batches()
    chosen = batches[len(batches) // 2]
    share = np.array_split(chosen, size)[rank]
    return chosen, collate([dataset[int(i)] for i in share])


def scheduled_recomputations(compressor) -> dict[str, bool]:
    """For Ok-Topk: which periodic exact computations the next exchange does (empty for the others)."""
    if not hasattr(compressor, "_repartition_due"):
        return {}
    return {"repartition": compressor._repartition_due(),
            "exact_local_threshold": compressor._due(compressor.local_threshold_interval),
            "exact_global_threshold": compressor._due(compressor.global_threshold_interval)}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(cfg, comm, dataset, batch, device, steps: int, warmup: int) -> tuple[dict, dict, int]:
    """Fresh model and Trainer, `warmup` + `steps` train_steps; this rank's means over the measured
    steps, the count of Ok-Topk's periodic recomputations among them, and the parameter count."""
    seed_everything(cfg.seed)
    model = build_model(cfg.model.name, sync_bn=comm if cfg.model.sync_batchnorm else None)
    trainer = bare_trainer(cfg, comm, model, dataset, device)  # (its constructor broadcasts rank 0's model)
    sums, recomputed = dict.fromkeys(FIGURES, 0.0), {}
    comm.barrier()
    for i in range(warmup + steps):
        due = scheduled_recomputations(trainer.compressor)
        t0 = time.perf_counter()
        record = trainer.train_step(batch)
        sync(device)
        t_step = time.perf_counter() - t0
        if record is None:
            raise FloatingPointError(f"{cfg.compression.algorithm}: step {i} was skipped (non-finite loss or gradient)")
        if i < warmup:
            continue
        st = record.stats
        figures = {"t_compute": record.seconds_compute, "t_select": st.seconds_select, "t_comm": st.seconds_comm,
                   "t_step": t_step, "bytes_recv": st.bytes_recv, "bytes_sent": st.bytes_sent}
        figures["t_other"] = t_step - figures["t_compute"] - figures["t_select"] - figures["t_comm"]
        for key in FIGURES:
            sums[key] += figures[key]
        for key, done in due.items():
            recomputed[key] = recomputed.get(key, 0) + int(done)
    return {k: v / steps for k, v in sums.items()}, recomputed, trainer.flat_grad.numel()



def header(machine: dict, batch: dict, args, P: int) -> str:
    lines = [
        f"# Step time per algorithm: {args.model}, P = {P}, density {args.density}, "
        f"{args.steps} measured steps after {args.warmup} discarded",
        f"machine: {machine['host']}, {machine['cpu_model']}, {machine['cpus']} CPUs "
        f"({machine['usable_cpus']} usable), "
        f"{machine['ranks_per_node']} rank(s) on this node x {machine['threads_per_rank']} torch thread(s), "
        f"device {machine['device']}, torch {machine['torch']}; 1-min load average at the start "
        f"{machine['load_average_1min']:.2f}"
        + (" (above the core count: other processes compete for the cores)"
           if machine["load_average_1min"] > machine["usable_cpus"] else ""),
        f"batch: global {batch['global_batch']} ({batch['per_rank']} per rank), the same real AN4 utterances "
        f"for every row: mean {batch['mean_seconds']:.2f} s (min {batch['min_seconds']:.2f}, max "
        f"{batch['max_seconds']:.2f}); features precomputed (data loading not timed)",
    ]
    if machine["oversubscribed"]:
        lines.append(f"NOTE: {machine['ranks_per_node']} ranks x {machine['threads_per_rank']} threads share "
                     f"{machine['usable_cpus']} cores: ranks wait for a core, so compute is inflated, and the "
                     "time ranks wait for each other (in 'other' and communication) too.")
    return "\n".join(lines)


def table(rows: list[dict]) -> str:
    lines = ["| algorithm | P | model | parameters | compute s/step [max rank] | selection s/step "
             "| communication s/step | other s/step | total s/step [max rank] | (comm+sel)/compute | recv bytes/step "
             "| threads/rank | device |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['algorithm']} | {r['P']} | {r['model']} | {r['parameters']:,} | {r['t_compute_mean']:.4f} "
            f"[{r['t_compute_max']:.4f}] "
            f"| {r['t_select_mean']:.4f} | {r['t_comm_mean']:.4f} | {r['t_other_mean']:.4f} "
            f"| {r['t_step_mean']:.4f} [{r['t_step_max']:.4f}] | {r['comm_select_pct_of_compute']:.1f}% "
            f"| {r['bytes_recv_mean']:,.0f} | {r['threads_per_rank']} | {r['device']} |")
    lines += ["", "Times are means over ranks of each rank's mean over the measured steps. other = the rest of "
              "train_step: the finite check, where ranks wait for the slowest backward (so other grows with "
              "compute max - mean), update scatter, residual bookkeeping, clipping, SGD. recv bytes: "
              "application-level bytes received per rank per step (DESIGN 3), mean over ranks."]
    notes = [f"{r['algorithm']}: of {r['steps']} measured steps, "
             + ", ".join(f"{v} did the {k.replace('_', ' ')}" for k, v in r["recomputed"].items())
             + " (a long run: exact thresholds 1 in 32, repartition 1 in 64; a short run weights them differently)"
             for r in rows if r["recomputed"]]
    return "\n".join(lines + notes)


def run(args, comm) -> list[dict]:
    base = [f"model.name={args.model}", f"compression.density={args.density}", "compression.warmup_steps=0",
            f"train.global_batch_size={args.global_batch}", f"data.train_manifest={args.manifest}",
            "name=step_time", *args.set]
    configs = {a: resolve_for_run(load_config(args.config, base + [f"compression.algorithm={a}"]), comm)
               for a in args.algorithms}
    first = configs[args.algorithms[0]]
    process = setup_process(comm, first.distributed.device, first.train.threads, first.train.precision)
    device, threads, local_size = process.device, process.threads, process.local_size
    dataset = SpeechDataset(read_manifest(first.data.train_manifest))
    chosen, batch = fixed_batch(dataset, args.global_batch, comm.rank, comm.size)
    batch = batch.to(device)
    seconds = dataset.durations[chosen]
    usable = len(os.sched_getaffinity(0))
    device_name = str(device) + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
    machine = {"host": socket.gethostname(), "cpu_model": cpu_model(), "cpus": os.cpu_count(), "usable_cpus": usable,
               "ranks_per_node": local_size, "threads_per_rank": threads, "device": device_name,
               "torch": torch.__version__, "load_average_1min": os.getloadavg()[0],
               "oversubscribed": device.type == "cpu" and local_size * threads > usable}
    batch_info = {"global_batch": args.global_batch, "per_rank": args.global_batch // comm.size,
                  "mean_seconds": float(seconds.mean()), "min_seconds": float(seconds.min()),
                  "max_seconds": float(seconds.max()), "utterances": [dataset.utt_ids[int(i)] for i in chosen]}
    if comm.rank == 0:
        print(header(machine, batch_info, args, comm.size), flush=True)
    rows = []
    for algorithm, cfg in configs.items():
        mine, recomputed, numel = measure(cfg, comm, dataset, batch, device, args.steps, args.warmup)
        figures = comm.mean_and_max(mine)
        rows.append({"algorithm": algorithm, "P": comm.size, "model": args.model, "parameters": numel,
                     "density": None if algorithm == "dense" else args.density, "steps": args.steps,
                     "warmup": args.warmup, "threads_per_rank": threads, "device": device_name,
                     "precision": cfg.train.precision, **figures,
                     "comm_select_pct_of_compute": 100.0 * (figures["t_comm_mean"] + figures["t_select_mean"])
                     / figures["t_compute_mean"],
                     "recomputed": recomputed})
        if comm.rank == 0:
            print(f"# {algorithm}: {figures['t_step_mean']:.3f} s/step", file=sys.stderr, flush=True)
    if comm.rank == 0:
        print("\n" + table(rows), flush=True)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({"machine": machine, "batch": batch_info, "rows": rows}, indent=1))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="lstman4", help="a key of models.MODELS")
    parser.add_argument("--algorithms", nargs="+", default=list(COMPRESSORS), help="keys of compression.COMPRESSORS")
    parser.add_argument("--density", type=float, default=0.02)
    parser.add_argument("--global-batch", type=int, default=16, help="utterances per step, summed over ranks")
    parser.add_argument("--steps", type=int, default=5, help="measured steps per algorithm")
    parser.add_argument("--warmup", type=int, default=1, help="steps per algorithm run first and discarded")
    parser.add_argument("--manifest", default="manifests/an4_train.csv", help="where the batch comes from")
    parser.add_argument("--config", default=None, help="YAML config to start from (default: built-in defaults)")
    parser.add_argument("--set", nargs="*", default=[], metavar="key.sub=value", help="more config overrides")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here (rank 0)")
    args = parser.parse_args(argv)
    unknown = [a for a in args.algorithms if a not in COMPRESSORS]
    if unknown:
        parser.error(f"unknown algorithms {unknown}; known: {sorted(COMPRESSORS)}")
    if len(set(args.algorithms)) != len(args.algorithms):
        parser.error("--algorithms lists an algorithm twice")
    if args.steps < 1 or args.warmup < 0 or args.global_batch < 1:
        parser.error("--steps and --global-batch must be >= 1, --warmup >= 0")
    comm = Communicator()
    run_or_abort(comm, run, args, comm)


if __name__ == "__main__":
    main()
