"""Communication volume of every registered compressor on realistic gradients, next to the paper's cost model.

    mpiexec -n P .venv/bin/python bench/comm_volume.py --numel 27569568 --density 0.02 --steps 64 \
        [--json out.json] [--algorithms dense topka ...] [--options KEY=VALUE ...]

--options are compression.options.* for every listed algorithm (e.g. `--algorithms powersgd --options
matrix_approximation_rank=4`); an algorithm that does not have one refuses it.

Every algorithm in compression.COMPRESSORS (Ok-Topk too once registered) runs `--steps` steps of
its real `step()` with error feedback, one algorithm after the other, on the same gradient
sequence. Per rank and step it records bytes sent/received, messages, selection and communication
seconds (the Communicator's application-level counters, DESIGN 3) and the global density; each
rank's means over the steps are then reduced over ranks (mean and max, by allreduce).
The default of 64 steps covers one full period of Ok-Topk's recomputations (thresholds every 32,
repartition every 64 steps), so its amortized volume is representative; fewer steps over-weight
step 0, where every algorithm with periodic recomputation does all of them.

The JSON records also hold each algorithm's own per-step figures (StepStats.extra) as extra_<name>_mean
and extra_<name>_max (means over steps; mean and max over ranks).

Synthetic gradients (no model is run): sparse_asr/compression/synthetic.py's GradientSource, 40 "layers" of
seeded sizes and scales, a component shared by all ranks and steps plus heavy-tailed per-rank noise.

Parameter shapes: when --numel is the parameter count of a model of sparse_asr.models (lstman4:
27,569,568) the compressors get that model's real shapes, else the synthetic layers as vectors. Only
per-tensor algorithms look at them: PowerSGD's volume follows from the shapes alone (a low-rank P and Q
per matrix, vectors sent whole), so its row means something only with a real model's shapes; on
synthetic vectors it sends everything uncompressed, like dense.

Closed forms: each algorithm's own `cost(n, k, P, shapes, options)` (4-byte words received per rank per step, k =
round(density * n), a pair = 2 words; see its file; PowerSGD's from the shapes, not k). The measured
column is words received per rank (mean over ranks; max over ranks in brackets); for gTopk the model
counts the root's receives and sends together. When onebit ran, the table ends with the Ok-Topk density whose words
received equal onebit's (by Ok-Topk's closed form, and by its measured words per k when it ran too).
"""
import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import yaml

from sparse_asr.comm import Communicator
from sparse_asr.compression import COMPRESSORS, build_compressor
from sparse_asr.compression.synthetic import LAYERS, GradientSource
from sparse_asr.models import model_with_numel
from sparse_asr.training.launch import setup_process

WORD = 4


def parameter_shapes(numel: int, source: GradientSource) -> tuple[list[torch.Size], str]:
    """(shapes, where they come from): a model's real parameter shapes when `numel` is its parameter count,
    else the synthetic layers as vectors (see the module docstring)."""
    model = model_with_numel(numel)
    if model is not None:
        name, shapes = model
        return shapes, f"{name}'s {len(shapes)} parameter tensors"
    return [torch.Size([n]) for n in source.layer_sizes], f"{LAYERS} synthetic layers as vectors"


def measure(comm, name, numel, density, steps, source, shapes, options, settle: int = 16) -> dict:
    """Run `steps` steps of one algorithm; return this rank's per-step means (and the global count's mean
    over the steps from `settle` on, past the cold start of thresholds that adapt)."""
    compressor = build_compressor(name, comm, numel, density, shapes=shapes, **options)
    from_stats = ("bytes_sent", "bytes_recv", "messages", "seconds_select", "seconds_comm", "selected_global",
                  "selected_local")
    sums = dict.fromkeys(from_stats + ("seconds_step", "meta_bytes_recv"), 0.0)
    peak_recv = 0
    settled = []
    comm.barrier()
    for step in range(steps):
        grad = source.gradient(step)
        meta_before = comm.counts("meta")
        t0 = time.perf_counter()
        stats = compressor.step(grad)
        sums["seconds_step"] += time.perf_counter() - t0
        sums["meta_bytes_recv"] += (comm.counts("meta") - meta_before).bytes_recv
        for key in from_stats:
            sums[key] += getattr(stats, key)
        for key, value in stats.extra.items():  # the algorithm's own figures, e.g. Ok-Topk's phases
            sums[f"extra_{key}"] = sums.get(f"extra_{key}", 0.0) + value
        peak_recv = max(peak_recv, stats.bytes_recv)
        if step >= settle:
            settled.append(stats.selected_global)
    del compressor
    means = {key: v / steps for key, v in sums.items()}
    means["bytes_recv_peak"] = peak_recv
    means["selected_global_settled"] = float(np.mean(settled)) if settled else float("nan")
    return means



def table(records: list[dict], P: int, numel: int, density: float, steps: int, shapes_from: str) -> str:
    k = max(1, int(round(density * numel)))
    lines = [
        f"Communication per rank per step: n = {numel:,} ({shapes_from}), density = {density}, k = {k:,}, P = {P}, "
        f"{steps} steps (words = 4 bytes; recv = mean over ranks [max over ranks]; model from Li & Hoefler "
        f"PPoPP'22 Table 1, PowerSGD's from the shapes)",
        "",
        "| algorithm | recv words [max] | sent words | model words | formula | recv/model | messages | density "
        "| global / k from step 16 | select s | comm s | step s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        low, high = r["model_words_low"], r["model_words_high"]
        model = "n/a" if low is None else f"{low:,.0f}" if low == high else f"{low:,.0f} .. {high:,.0f}"
        ratio = "n/a" if not high else f"{r['bytes_recv_max'] / WORD / high:.3f}"
        settled = r["selected_global_settled_mean"] / k
        settled = "n/a" if settled != settled else f"{settled:.3f}"  # NaN: 16 steps or fewer
        lines.append(
            f"| {r['algorithm']} | {r['bytes_recv_mean'] / WORD:,.0f} [{r['bytes_recv_max'] / WORD:,.0f}] "
            f"| {r['bytes_sent_mean'] / WORD:,.0f} | {model} | {r['formula']} | {ratio} | {r['messages']:.1f} "
            f"| {r['selected_density']:.5f} | {settled} | {r['seconds_select_mean']:.3f} "
            f"| {r['seconds_comm_mean']:.3f} | {r['seconds_step_mean']:.3f} |"
        )
    lines += ["", "recv/model: the busiest rank's received words over the model's (upper) value. gtopk's model "
              "counts the root's receives and sends along the critical path, so its root receives exactly half."]
    if any(r["algorithm"] == "powersgd" for r in records):
        lines += ["powersgd: density = entries sent per rank (P and Q of every compressed matrix, vectors whole) / n, "
                  "i.e. 1 / its compression rate; its update itself is dense."]
    if records and records[0]["options"]:
        lines += [f"compression.options: {records[0]['options']}"]
    lines += equal_words_density(records, P, numel, k)
    return "\n".join(lines)


def equal_words_density(records: list[dict], P: int, numel: int, k: int) -> list[str]:
    """The Ok-Topk density whose words received equal the 1-bit exchange's (measured, mean over ranks): from
    Ok-Topk's measured words per selected entry when it ran here, and from its closed form 4k(P-1)/P."""
    by_name = {r["algorithm"]: r for r in records}
    if "onebit" not in by_name or P < 2:
        return []
    words = by_name["onebit"]["bytes_recv_mean"] / WORD
    closed = words * P / (4 * (P - 1)) / numel
    line = f"Ok-Topk at onebit's {words:,.0f} words received: density {closed:.5f} by its closed form 4k(P-1)/P"
    if "oktopk" in by_name and by_name["oktopk"]["bytes_recv_mean"] > 0:
        per_k = by_name["oktopk"]["bytes_recv_mean"] / WORD / k
        line += f", {words / per_k / numel:.5f} by its measured {per_k:.3f} words per k here"
    return ["", line]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--numel", type=int, default=27569568, help="gradient length (lstman4: 27,569,568)")
    parser.add_argument("--density", type=float, default=0.02)
    parser.add_argument("--steps", type=int, default=64, help="steps per algorithm (64 covers Ok-Topk's periods)")
    parser.add_argument("--algorithms", nargs="+", default=None, help=f"default: all of {sorted(COMPRESSORS)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="write the records here (rank 0)")
    parser.add_argument("--options", nargs="+", default=[], metavar="KEY=VALUE",
                        help="compression.options.* for every listed algorithm")
    args = parser.parse_args()
    algorithms = args.algorithms or list(COMPRESSORS)
    unknown = [a for a in algorithms if a not in COMPRESSORS]
    if unknown:
        parser.error(f"unknown algorithms {unknown}; known: {sorted(COMPRESSORS)}")
    if any("=" not in item for item in args.options):
        parser.error(f"--options takes KEY=VALUE items, got {args.options}")
    options = {key: yaml.safe_load(value) for key, _, value in (item.partition("=") for item in args.options)}
    for name in algorithms:
        try:
            COMPRESSORS[name].make_options(options)
        except ValueError as e:
            parser.error(str(e))
    if args.steps < 1 or args.numel < 1:
        parser.error("--steps and --numel must be positive")

    comm = Communicator()
    setup_process(comm, "cpu", threads=1)
    P = comm.size
    source = GradientSource(args.numel, comm.rank, args.seed)
    shapes, shapes_from = parameter_shapes(args.numel, source)
    k = max(1, int(round(args.density * args.numel)))
    records = []
    for name in algorithms:
        mine = measure(comm, name, args.numel, args.density, args.steps, source, shapes, options)
        figures = comm.mean_and_max(mine)
        cost = COMPRESSORS[name].cost(args.numel, k, P, shapes, COMPRESSORS[name].make_options(options))
        records.append({
            "algorithm": name, "P": P, "numel": args.numel, "density": args.density, "k": k, "steps": args.steps,
            "options": options,
            **figures,
            "messages": figures["messages_mean"],
            "selected_density": figures["selected_global_mean"] / args.numel,
            "model_words_low": cost.low, "model_words_high": cost.high, "formula": cost.formula,
        })
        if comm.rank == 0:
            print(f"# {name}: done ({figures['seconds_step_mean']:.2f} s/step)", file=sys.stderr, flush=True)
    if comm.rank == 0:
        print(table(records, P, args.numel, args.density, args.steps, shapes_from), flush=True)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            config = {"P": P, "numel": args.numel, "density": args.density, "k": k, "steps": args.steps,
                      "seed": args.seed, "shapes": shapes_from}
            args.json.write_text(json.dumps({"config": config, "records": records}, indent=1))


if __name__ == "__main__":
    main()
