"""Checkpoint time and size: this project's sharded checkpoints against the single gathered file they
replaced, for a model with a per-rank Ok-Topk state (residual, thresholds, boundaries).

    .venv/bin/mpiexec -n 8 .venv/bin/python bench/checkpoint_io.py [--model lstman4] [--repeats 3] [--out DIR]
                                                                   [--json FILE]

sharded:   save_training_state (each rank writes rank{r}.pt, rank 0 shared.pt and the manifest) and
           load_training_state (every file verified against its SHA-256).
gathered:  what the code did before: every rank's RankState pickled to rank 0 through comm.gather_object,
           one torch.save of everything by rank 0 (atomic, fsync); loading: every rank torch.load()s the
           one file memory-mapped and takes its entry. Marking it best copied the file; a link now.
The state is real: the model's and SGD momentum's tensors, and each rank's own Ok-Topk state with a
random (incompressible) residual. Saves of the two kinds alternate, `--repeats` times each (median
reported), so both see the same machine load. Prints a Markdown report (rank 0).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pickle
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from sparse_asr.comm import Communicator
from sparse_asr.compression import build_compressor
from sparse_asr.fileio import atomic_write
from sparse_asr.models import build_model
from sparse_asr.training.checkpoint import (Progress, RankState, TrainingState, load_training_state, point_link,
                                            rng_state, save_training_state)
from sparse_asr.training.config import load_config, to_dict
from sparse_asr.training.launch import setup_process
from sparse_asr.training.optim import SGDStep
from sparse_asr.training.runtime import run_or_abort


def training_state(comm, model_name: str, density: float) -> TrainingState:
    torch.manual_seed(0)
    model = build_model(model_name)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = SGDStep(params, load_config(None).optim).optimizer
    for p in params:  # the momentum buffers an SGD step would have made
        optimizer.state[p]["momentum_buffer"] = torch.randn_like(p)
    numel = sum(p.numel() for p in params)
    compressor = build_compressor("oktopk", comm, numel, density, shapes=[p.shape for p in params])
    torch.manual_seed(1 + comm.rank)  # each rank's residual is its own
    compressor.residual.normal_()
    buffers = {k: v.clone() for k, v in model.named_buffers() if v.is_floating_point()}
    mine = RankState(compressor=compressor.state_dict(), rng=rng_state(), buffers=buffers,
                     meter={"cum_bytes_recv": 0.0, "epoch_window": {"sums": {}, "counts": {}, "steps": 0}})
    config = to_dict(load_config(None, [f"model.name={model_name}", "compression.algorithm=oktopk"]))
    return TrainingState(config=config, model=model.state_dict(), optimizer=optimizer.state_dict(),
                         progress=Progress(step=1), mine=mine, extra={"warmup_steps": 0, "metrics_rows": 0})


def save_gathered(comm, path: Path, state: TrainingState) -> int:
    """The old save_checkpoint: every rank's own part gathered (pickled) to rank 0, one torch.save there.
    Returns the bytes this rank's part pickles to (what it sends)."""
    mine = dataclasses.asdict(state.mine)
    ranks = comm.gather_object(mine, root=0)
    if comm.rank == 0:
        atomic_write(path, lambda f: torch.save({
            "format_version": 2, "world_size": comm.size, "config": state.config, "model": state.model,
            "optimizer": state.optimizer, "progress": dataclasses.asdict(state.progress), "extra": state.extra,
            "ranks": ranks}, f))
    comm.barrier()
    return len(pickle.dumps(mine, protocol=pickle.HIGHEST_PROTOCOL))


def load_gathered(comm, path: Path) -> float:
    """The old load: the one file memory-mapped, this rank's entry and the shared parts read."""
    ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    return read_all([ckpt["model"], ckpt["optimizer"], ckpt["ranks"][comm.rank]])


def load_sharded(comm, run_dir: Path) -> float:
    state = load_training_state(comm, run_dir)
    return read_all([state.model, state.optimizer, dataclasses.asdict(state.mine)])


def read_all(obj) -> float:
    """Touch every tensor (memory-mapped files are read lazily; a resume copies them all into the model,
    optimizer and compressor)."""
    if torch.is_tensor(obj):
        return float(obj.double().sum()) if obj.is_floating_point() else 0.0
    if isinstance(obj, dict):
        return sum(read_all(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(read_all(v) for v in obj)
    return 0.0


def timed(comm, action) -> float:
    """Wall seconds of a collective action: from a common start to the last rank's end."""
    comm.barrier()
    t0 = time.perf_counter()
    action()
    mine = time.perf_counter() - t0
    return max(comm.allgather_object(mine))


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="lstman4")
    parser.add_argument("--density", type=float, default=0.02)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, help="a new directory for the checkpoints, kept afterwards "
                        "(default: a private temporary directory, deleted at the end)")
    parser.add_argument("--json", type=Path, help="also write the measurements here")
    args = parser.parse_args(argv)
    comm = Communicator()
    run_or_abort(comm, run, args, comm)
    return 0


def run(args, comm) -> None:
    setup_process(comm, "cpu", threads=1)
    out = comm.bcast_object(make_out_dir(args.out) if comm.rank == 0 else None)
    if isinstance(out, str):  # rank 0's error, raised on every rank
        raise SystemExit(f"checkpoint_io.py: error: {out}")
    try:
        measure(args, comm, out)
    finally:
        comm.barrier()
        if comm.rank == 0 and args.out is None:
            shutil.rmtree(out)


def make_out_dir(out: Path | None) -> Path | str:
    """A directory no one else controls: a new private temporary one, or `out` created anew (never an
    existing path or a planted symlink, which mkdir refuses). Returns the error message if it cannot."""
    if out is None:
        return Path(tempfile.mkdtemp(prefix="checkpoint_io-"))
    try:
        out.mkdir(mode=0o700)
    except OSError as e:
        return f"--out {out} must be a new directory: {e.strerror}"
    return out


def measure(args, comm, out: Path) -> None:
    P = comm.size
    sharded_dir, gathered_file = out / "checkpoints", out / "gathered" / "last.pt"
    state = training_state(comm, args.model, args.density)
    numel = state.mine.compressor["memory"]["residual"].numel()

    # Sharded first and alone, for rank 0's peak memory; then both kinds alternating, for the times.
    times = {"sharded save": [], "sharded load": [], "gathered save": [], "gathered load": []}
    times["sharded save"].append(timed(comm, lambda: save_training_state(comm, sharded_dir, state, keep=1)))
    times["sharded load"].append(timed(comm, lambda: load_sharded(comm, out)))
    rss_sharded = peak_rss_gb()
    pickled = 0
    for repeat in range(args.repeats):
        if repeat:
            state.progress.step = repeat + 1
            times["sharded save"].append(timed(comm, lambda: save_training_state(comm, sharded_dir, state, keep=1)))
            times["sharded load"].append(timed(comm, lambda: load_sharded(comm, out)))
        times["gathered save"].append(timed(comm, lambda: save_gathered(comm, gathered_file, state)))
        times["gathered load"].append(timed(comm, lambda: load_gathered(comm, gathered_file)))
        pickled = len(pickle.dumps(dataclasses.asdict(state.mine), protocol=pickle.HIGHEST_PROTOCOL))
    rss_gathered = peak_rss_gb()

    def mark_best_by_copy():
        if comm.rank == 0:
            with open(gathered_file, "rb") as src:
                atomic_write(gathered_file.with_name("best.pt"), lambda f: shutil.copyfileobj(src, f))

    def mark_best_by_link():
        if comm.rank == 0:
            point_link(sharded_dir, "best", os.readlink(sharded_dir / "last"))

    best_copy, best_link = timed(comm, mark_best_by_copy), timed(comm, mark_best_by_link)
    rss = comm.gather_object((rss_sharded, rss_gathered))
    if comm.rank != 0:
        return

    last = sharded_dir / os.readlink(sharded_dir / "last")
    shard = (last / "rank0.pt").stat().st_size
    shared = (last / "shared.pt").stat().st_size
    sharded_total = sum(f.stat().st_size for f in last.iterdir())
    gathered = gathered_file.stat().st_size
    median = {k: statistics.median(v) for k, v in times.items()}
    if args.json:
        args.json.write_text(json.dumps({
            "P": P, "model": args.model, "parameters": numel, "seconds": times, "best_by_copy": best_copy,
            "best_by_link": best_link, "bytes": {"shard": shard, "shared": shared, "sharded_total": sharded_total,
                                                 "gathered": gathered, "pickled_per_rank": pickled},
            "peak_rss_gb": rss}, indent=1))
    gb = 1e9
    print(f"# Checkpoint I/O: {args.model} ({numel / 1e6:.1f}M parameters), Ok-Topk state, P = {P}\n")
    print(f"`mpiexec -n {P} bench/checkpoint_io.py --model {args.model} --repeats {args.repeats}`: {P} ranks, "
          f"1 torch thread each, on {os.cpu_count()} cores (oversubscribed), load average "
          f"{os.getloadavg()[0]:.1f} at the end; files under {out} (one local disk). Median of "
          f"{len(times['sharded save'])} (sharded) and {len(times['gathered save'])} (gathered) alternating saves; "
          f"every file fsynced.\n")
    print("| | sharded (rank{r}.pt + shared.pt + manifest) | gathered (one file via rank 0) |")
    print("|---|---|---|")
    print(f"| save, s | {median['sharded save']:.2f} | {median['gathered save']:.2f} |")
    print(f"| load (every rank reads model, optimizer and its own state), s | {median['sharded load']:.2f} "
          f"(files SHA-256 verified) | {median['gathered load']:.2f} (not verified) |")
    print(f"| mark best, s | {best_link:.4f} (a link) | {best_copy:.2f} (a copy: {gathered / gb:.2f} GB more) |")
    print(f"| bytes on disk | {sharded_total / gb:.3f} GB: {P} x {shard / 1e6:.1f} MB + {shared / 1e6:.1f} MB | "
          f"{gathered / gb:.3f} GB |")
    print(f"| largest file one rank writes | {(shard + shared) / 1e6:.0f} MB (rank 0) | {gathered / 1e6:.0f} MB |")
    print(f"| MPI payload | a (name, size, SHA-256) string per file | {P - 1} x {pickled / 1e6:.1f} MB pickled into "
          f"rank 0 ({(P - 1) * pickled / gb:.2f} GB) |")
    others = rss[1:] or rss
    print(f"| peak RSS, rank 0 / largest other rank | {rss[0][0]:.2f} / {max(r[0] for r in others):.2f} GB | "
          f"{rss[0][1]:.2f} / {max(r[1] for r in others):.2f} GB |")
    print()
    print("Projection (bytes from the measured file sizes; per rank: the residual is the whole flat gradient):\n")
    print("| P | sharded: per rank / rank 0 / total | gathered: one file, all through rank 0 | gathered: pickled into "
          "rank 0 | best |")
    print("|---|---|---|---|---|")
    per_rank_gathered = (gathered - shared) / P  # each rank's entry in the one file
    for p in sorted({P, 32, 64}):
        total, one_file = p * shard + shared, p * per_rank_gathered + shared
        print(f"| {p} | {shard / 1e6:.0f} MB / {(shard + shared) / 1e6:.0f} MB / {total / gb:.2f} GB | "
              f"{one_file / gb:.2f} GB | {(p - 1) * pickled / gb:.2f} GB | a link vs a copy of "
              f"{one_file / gb:.2f} GB |")


if __name__ == "__main__":
    sys.exit(main())
