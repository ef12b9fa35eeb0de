"""Project each algorithm's communication and step time to P = 4 ... 256 GPUs with an alpha-beta model.

    .venv/bin/python bench/project_scaling.py [--measured bench/results/comm_volume_P*.json] [--density 0.02]
        [--options powersgd.matrix_approximation_rank=4 ...] [--out DIR]

Per algorithm and rank count P, the communication time per optimizer step is
    t_comm(P) = alpha * messages(P) + beta * bytes(P)
with the bytes and messages on the critical path of the slowest rank: what it receives (sends overlap
receives), except for gTopk, whose tree rounds are sequential, so the root's receives (merge) and sends
(broadcast) add up.
and the step time is t_compute(P) + t_selection + t_comm(P) (the trainer exchanges gradients after the
backward pass, without overlap). Speedup = dense step time / algorithm step time at the same P.

Volumes and message counts (per rank per step, application level as comm/communicator.py counts them):
each algorithm's own closed form, `Cost.typical` and `Cost.messages` of its `cost(n, k, P, shapes, options)`
(DESIGN 4 and Li & Hoefler, PPoPP'22, Table 1; see the algorithm's file), n = numel, k = round(density * n):
    dense      ring allreduce 2n(P-1)/P words; topka 2k(P-1); gaussiank 2k(P-1); gtopk 4k ceil(log2 P);
    topkdsa    reduce-scatter 2k(P-1)/P + allgather of the union of independent selections (dense past n/3);
    oktopk     split-reduce 2k(P-1)/P + balanced allgatherv 2k(P-1)/P = 4k(P-1)/P (bounds 2k..6k (P-1)/P);
    powersgd   ring allreduces of the low-rank factors and the uncompressed tensors, 2(P-1)/P words per entry:
               r(rows + cols) per matrix of lstman4's real shapes (when --numel is a registered model's
               parameter count), independent of the density; --options powersgd.matrix_approximation_rank=R.
Measured points (--measured: the JSON files of bench/comm_volume.py --json, one per P) replace the closed
form at their P: bytes_recv_max and messages_max (messages sent; for gTopk bytes_recv_max + bytes_sent_max
and 2 x messages_max, the root's receives and sends). In between and beyond, the closed form is scaled by
the measured/closed-form ratio, interpolated in log2 P between measured points and held at the nearest
one outside them. Without --measured: closed forms only.

Assumptions (flags; defaults stated in the output):
  alpha 2 us per message: Slingshot 11 MPI latency, order of magnitude.
  beta = 1 / 12.5 GB/s per rank: a Polaris node has 2 Slingshot NICs of 25 GB/s per direction, shared by
        its 4 ranks. Intra-node (NVLink) traffic is not modelled separately; neither is staging GPU buffers
        through host memory when MPI is not CUDA-aware.
  compute 20 ms + 1.5 ms per utterance per rank on an A100 (lstman4 fwd+bwd): NOT MEASURED. Back-of-envelope:
        lstman4 costs ~38M MACs per output frame (convs 10.9M + LSTMs 27.2M), AN4 train utterances average
        2.71 s = ~136 output frames, so fwd+bwd ~31 GFLOP per utterance; at ~20 TFLOP/s effective (TF32,
        small-batch cuDNN LSTM) that is ~1.5 ms per utterance, plus ~20 ms of step latency (136 steps x 5 LSTM
        layers of sequential kernels, forward and backward). Replace both with a GPU measurement
        (--compute-fixed-ms, --compute-per-utt-ms) when one is available.
  per-rank batch = global batch / P (at least 1: beyond P = global batch, each rank keeps 1 utterance).
  selection time (top-k / threshold on the GPU) is excluded unless given with --selection-ms ALGO=MS.

Ok-Topk's allgatherv with and without its `rebalance` option (a section of its own, when the measured Ok-Topk
records carry its per-step figures, as bench/comm_volume.py writes them): MPI allgathers a few MB with a ring,
whose P-1 steps each move one block over every link, so the largest block sets every step's time:
    plain       (P-1) (alpha + beta * max block)
    rebalanced  alpha * m + beta * moved  +  (P-1) (alpha + beta * mean block)
where max block / mean block is the measured imbalance of the owners' selections and m and moved are the
messages and bytes the busiest rank receives when the blocks are first re-cut to equal shares (measured too;
both interpolated in log2 P between measured P and held beyond them).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
import yaml

from sparse_asr.analysis.scaling import (IN_PAPER, LSTMAN4_NUMEL, WORD, Model, algorithms, allgather_table,
                                         load_allgather_shapes, load_measured, parameter_shapes, project)
from sparse_asr.compression import COMPRESSORS
from sparse_asr.figures import save_png

DEFAULT_RANKS = [4, 8, 16, 32, 64, 128, 256]


def pivot_markdown(df: pd.DataFrame, column: str, fmt: str) -> str:
    """P x algorithm table of one column; measured cells marked with *."""
    names = list(dict.fromkeys(df.algorithm))
    lines = ["| P | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for P in sorted(set(df.P)):
        cells = []
        for a in names:
            row = df[(df.algorithm == a) & (df.P == P)].iloc[0]
            cells.append(format(row[column], fmt) + ("*" if row.source == "measured" else ""))
        lines.append(f"| {P} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def trend_text(df: pd.DataFrame) -> str:
    """What the projection says about the ordering as P grows, next to the paper's reported trend."""
    lines = []
    by_P = {P: g.set_index("algorithm") for P, g in df.groupby("P")}
    Ps = sorted(by_P)
    paper = {P: g.drop(index=[a for a in g.index if a not in IN_PAPER]) for P, g in by_P.items()}
    fastest = {P: g["comm_ms"].idxmin() for P, g in paper.items()}
    lines.append("Lowest communication time per P among the paper's algorithms: "
                 + ", ".join(f"P={P}: {fastest[P]}" for P in Ps) + ".")
    if "oktopk" in df.algorithm.values:
        ahead = [P for P in Ps if fastest[P] == "oktopk"]
        if ahead and all(fastest[P] == "oktopk" for P in Ps if P >= ahead[0]):
            lines.append(f"Ok-Topk has the lowest communication time from P={ahead[0]} on, "
                         f"as the paper reports (Ok-Topk ahead of the baselines as P grows).")
        else:
            lines.append("Ok-Topk is NOT the fastest at every large P here, unlike the paper's trend; "
                         "check the measured volumes and the assumptions.")
        others = [a for a in paper[Ps[0]].index if a not in ("oktopk", "dense")]  # the paper's sparse baselines
        if others:
            lead = {P: min(by_P[P].loc[a, "comm_ms"] for a in others) / by_P[P].loc["oktopk", "comm_ms"] for P in Ps}
            lines.append(f"The next-best sparse scheme's communication time over Ok-Topk's: {lead[Ps[0]]:.2f}x at "
                         f"P={Ps[0]}, {lead[Ps[-1]]:.2f}x at P={Ps[-1]}.")
    if "oktopk" in df.algorithm.values and "powersgd" in df.algorithm.values:
        ratio = {P: by_P[P].loc["powersgd", "comm_ms"] / by_P[P].loc["oktopk", "comm_ms"] for P in Ps}
        lines.append(f"PowerSGD's communication time over Ok-Topk's (a low-rank scheme, not in the paper): "
                     f"{ratio[Ps[0]]:.2f}x at P={Ps[0]}, {ratio[Ps[-1]]:.2f}x at P={Ps[-1]}.")
    if "oktopk" in df.algorithm.values and "density" in df:
        ok = df[(df.algorithm == "oktopk") & (df.P > 1)]
        unit = WORD * ok.density * ok.numel * (ok.P - 1) / ok.P  # bytes of k(P-1)/P words
        ratio = ok.MB_per_step * 1e6 / unit
        lines.append(f"Ok-Topk receives {ratio.min():.2f} to {ratio.max():.2f} x k(P-1)/P words per rank "
                     f"(paper: between 2 and 6).")
    if "dense" in df.algorithm.values:
        for a in ("topka", "gaussiank"):
            if a in df.algorithm.values:
                worse = [P for P in Ps if by_P[P].loc[a, "comm_ms"] > by_P[P].loc["dense", "comm_ms"]]
                if worse:
                    lines.append(f"{a} communicates more than dense allreduce from P={worse[0]} on "
                                 f"(its 2k(P-1) words pass 2n(P-1)/P once P > 1/density).")
        largest = by_P[Ps[-1]]
        if "speedup_vs_dense" in largest:
            best = largest["speedup_vs_dense"].idxmax()
            lines.append(f"At P={Ps[-1]} the best step-time speedup over dense is {best} "
                         f"({largest.loc[best, 'speedup_vs_dense']:.2f}x); compute per step is "
                         f"{largest.loc[best, 'compute_ms']:.1f} ms of {largest.loc[best, 'step_ms']:.1f} ms.")
    return "\n".join(lines)


def plot(df: pd.DataFrame, path: Path, title: str) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    styles = {"gaussiank": "--", "topkdsa": "-."}  # gaussiank's closed form equals topka's: keep both visible
    for a, g in df.groupby("algorithm", sort=False):
        g = g.sort_values("P")
        style = styles.get(a, "-")
        line, = axes[0].plot(g.P, g.comm_ms, "o" + style, label=a, markersize=4)
        measured = g[g.source == "measured"]
        if len(measured):
            axes[0].plot(measured.P, measured.comm_ms, "s", color=line.get_color(), markersize=9,
                         markerfacecolor="none")
        if "speedup_vs_dense" in g:
            axes[1].plot(g.P, g.speedup_vs_dense, "o" + style, label=a, markersize=4, color=line.get_color())
    axes[0].set_yscale("log")
    axes[0].set_ylabel("communication per rank per step (ms)")
    has_measured = (df.source == "measured").any()
    axes[0].set_title("alpha-beta model" + (" (squares: measured volumes)" if has_measured else ", closed forms only"))
    axes[1].axhline(1.0, color="gray", linewidth=0.8)
    axes[1].set_ylabel("step-time speedup over dense")
    axes[1].set_title(title)
    ticks = sorted(set(df.P))
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(P) for P in ticks])
        ax.set_xlabel("ranks (GPUs) P")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)


def parse_algorithm_options(items: list[str]) -> dict[str, dict]:
    """ALGO.KEY=VALUE items -> {algorithm: {key: value}}, each checked against the algorithm's Options."""
    out: dict[str, dict] = {}
    for item in items:
        target, sep, value = item.partition("=")
        name, dot, key = target.partition(".")
        if not sep or not dot or name not in COMPRESSORS:
            raise SystemExit(f"project_scaling: --options {item!r}: expected ALGO.KEY=VALUE with ALGO in "
                             f"{algorithms()}")
        out.setdefault(name, {})[key] = yaml.safe_load(value)
    for name, options in out.items():
        try:
            COMPRESSORS[name].make_options(options)
        except ValueError as e:
            raise SystemExit(f"project_scaling: --options: {e}") from None
    return out


def parse_selection(items: list[str]) -> dict[str, float]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or name not in COMPRESSORS:
            raise SystemExit(f"project_scaling: --selection-ms {item!r}: expected ALGO=MS with ALGO in {algorithms()}")
        try:
            out[name] = float(value)
        except ValueError:
            raise SystemExit(f"project_scaling: --selection-ms {item!r}: {value!r} is not a number") from None
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measured", nargs="*", default=[], help="JSON files from bench/comm_volume.py --json")
    parser.add_argument("--algorithms", nargs="+", default=algorithms(), choices=algorithms())
    parser.add_argument("--ranks", nargs="+", type=int, default=DEFAULT_RANKS,
                        help="P values to project (measured P values are added)")
    parser.add_argument("--numel", type=int, default=LSTMAN4_NUMEL, help="gradient entries (default: lstman4)")
    parser.add_argument("--density", type=float, default=0.02)
    parser.add_argument("--alpha-us", type=float, default=2.0, help="seconds per message, in microseconds")
    parser.add_argument("--bandwidth-gbs", type=float, default=12.5, help="per-rank bandwidth, GB/s (beta = 1/this)")
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--compute-fixed-ms", type=float, default=20.0, help="assumed, not measured: see --help")
    parser.add_argument("--compute-per-utt-ms", type=float, default=1.5, help="assumed, not measured: see --help")
    parser.add_argument("--selection-ms", nargs="*", default=[], metavar="ALGO=MS")
    parser.add_argument("--options", nargs="*", default=[], metavar="ALGO.KEY=VALUE",
                        help="compression.options of one algorithm, e.g. powersgd.matrix_approximation_rank=4")
    parser.add_argument("--out", default="bench/results/scaling", help="directory for scaling.{md,csv,png}")
    args = parser.parse_args(argv)
    if not 0 < args.density <= 1:
        raise SystemExit(f"project_scaling: --density must be in (0, 1], got {args.density}")
    if min(args.ranks) < 1 or args.numel < 1 or args.global_batch < 1 or args.bandwidth_gbs <= 0 or args.alpha_us < 0:
        raise SystemExit("project_scaling: --ranks, --numel, --global-batch and --bandwidth-gbs must be positive")

    measured = [m for path in args.measured for m in load_measured(path)]
    ranks = sorted(set(args.ranks) | {m.P for m in measured if m.P > 1 and m.algorithm in args.algorithms})
    model = Model(args.alpha_us * 1e-6, 1.0 / (args.bandwidth_gbs * 1e9), args.compute_fixed_ms,
                  args.compute_per_utt_ms, args.global_batch, parse_selection(args.selection_ms))
    options = parse_algorithm_options(args.options)
    df = project(args.algorithms, ranks, args.numel, args.density, measured, model, options)

    source = (f"measured volumes from {', '.join(args.measured)} ({len(measured)} records) where available, "
              f"calibrated closed forms elsewhere" if measured else
              "closed forms only (no --measured input: nothing here was measured)")
    header = (f"# Projected step time: n = {args.numel:,} gradient entries, density {args.density}, global batch "
              f"{args.global_batch}\n\nSource: {source}.\nAssumptions: alpha {args.alpha_us} us/message, "
              f"beta 1/({args.bandwidth_gbs} GB/s) per rank, compute {args.compute_fixed_ms} ms + "
              f"{args.compute_per_utt_ms} ms x utterances per rank (ASSUMED A100 figure, not measured), "
              f"selection {'excluded' if not model.selection_ms else model.selection_ms}.\n"
              f"Per-rank batch = {args.global_batch}/P, at least 1 (weak scaling beyond P = {args.global_batch}). "
              f"* = measured point.\n")
    if "powersgd" in args.algorithms:
        shapes = parameter_shapes(args.numel)
        tensors = f"{len(shapes)} parameter tensors" if shapes else "one vector (no registered model has this size)"
        header += (f"PowerSGD: options {options.get('powersgd') or 'defaults'}, {tensors}"
                   f"; its volume ignores the density.\n")
    sections = [header, "## Communication per step (ms)\n", pivot_markdown(df, "comm_ms", ".2f"),
                "## Step time (ms)\n", pivot_markdown(df, "step_ms", ".1f")]
    if "speedup_vs_dense" in df:
        sections += ["## Speedup over dense (step time)\n", pivot_markdown(df, "speedup_vs_dense", ".2f")]
    sections += ["## Volume per step on the critical path (MB: received by the busiest rank; gTopk: the root's "
                 "received + sent)\n", pivot_markdown(df, "MB_per_step", ".2f"),
                 "## Messages per step on the critical path\n", pivot_markdown(df, "messages", ".1f"),
                 "## Trend\n", trend_text(df) + "\n"]
    shapes = load_allgather_shapes(args.measured) if "oktopk" in args.algorithms else []
    if shapes:
        sections += ["## Ok-Topk's allgatherv: plain vs rebalanced (ring model, measured block imbalance)\n",
                     allgather_table(shapes, ranks, args.numel, args.density, model)]
    text = "\n".join(sections)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "scaling.md").write_text(text)
    df.to_csv(out / "scaling.csv", index=False)
    plot(df, out / "scaling.png", f"density {args.density}, global batch {args.global_batch}")
    print(text)
    print(f"wrote {out / 'scaling.md'}, {out / 'scaling.csv'}, {out / 'scaling.png'}")
    return 0
