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
its own shadow SGD momentum buffer; nothing they do feeds back into the model. The screen itself is the package's
sparse_asr/screening/; this file is its command line.

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
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from sparse_asr.comm import Communicator
from sparse_asr.compression import COMPRESSORS, DEFAULT_MEMORY, MEMORIES, memory_problem
from sparse_asr.models import build_model
from sparse_asr.screening import (ORACLE, Algorithm, Settings, markdown_table, parse_variant, read_start, run_bench,
                                  summarise)
from sparse_asr.screening import intervals as si
from sparse_asr.training.config import load_config
from sparse_asr.training.launch import setup_process
from sparse_asr.training.runtime import cpu_model


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
                        "(sparse_asr/screening/intervals.py)")
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
        if a.memory != DEFAULT_MEMORY and (problem := memory_problem(a.name, a.memory, 0, False)):
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
    """--seeds / --per-rank: one run_bench per (global batch, seed), then sparse_asr/screening/intervals.py's tables."""
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
