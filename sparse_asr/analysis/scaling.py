"""Each algorithm's communication and step time projected to P ranks with an alpha-beta model (the report and
its command line: scaling_report.py, bench/project_scaling.py; the model's assumptions: its --help).

Per algorithm and P, t_comm(P) = alpha * messages(P) + beta * bytes(P) for the bytes and messages on the critical
path of the slowest rank, from the algorithm's own closed form (`cost` of its class), or from measured records
(bench/comm_volume.py --json) where they exist, the closed form scaled by measured / closed form in between and
beyond; the step time adds compute and selection (no overlap). Ok-Topk's allgatherv is modelled plain and with its
rebalance option from the measured imbalance of its blocks."""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from sparse_asr.compression import COMPRESSORS
from sparse_asr.models import model_with_numel

# the Ok-Topk paper's algorithms: the trend text compares these (every other registered one is tabled beside them)
IN_PAPER = {"dense", "topka", "topkdsa", "gtopk", "gaussiank", "oktopk"}
LSTMAN4_NUMEL = 27_569_568  # DESIGN 5
WORD = 4  # bytes: a float32 value or an int32 index


def algorithms() -> list[str]:
    """Every registered algorithm in the registry's order (the tables' column order). The registry is the one
    list, read when asked: a compressor registered after this module was imported is projected too."""
    return list(COMPRESSORS)


def uses_density(algorithm: str) -> bool:
    """False for the algorithms whose volume ignores the density (tabled at density 1)."""
    return COMPRESSORS[algorithm].uses_density


@functools.lru_cache(maxsize=None)
def parameter_shapes(numel: int):
    """A registered model's parameter shapes when it has `numel` parameters, else None (one vector)."""
    model = model_with_numel(numel)
    return None if model is None else model[1]


def closed_form(algorithm: str, P: int, numel: int, density: float, options: dict | None = None) -> tuple[float, float]:
    """(bytes received, messages) by one rank in one step: the algorithm's own typical cost, with its
    compression.options (a dict; {} = the defaults)."""
    if algorithm not in COMPRESSORS:
        raise ValueError(f"unknown algorithm {algorithm!r}; known: {sorted(COMPRESSORS)}")
    if P <= 1:
        return 0.0, 0.0
    cls = COMPRESSORS[algorithm]
    cost = cls.cost(numel, max(1, round(density * numel)), P, parameter_shapes(numel),
                    cls.make_options(options))
    return cost.typical * WORD, float(cost.messages)


# ---------------------------------------------------------------------------------------- measured input
@dataclass
class Measured:
    algorithm: str
    P: int
    numel: int
    density: float
    bytes: float  # on the critical path, per step (the slowest rank's)
    messages: float  # on the critical path, per step
    options: dict  # the compression.options it ran with ({} = defaults)


def _field(record: dict, names: tuple[str, ...], where: str, required: bool = True):
    for name in names:
        if record.get(name) is not None:
            return record[name]
    if required:
        raise SystemExit(f"project_scaling: {where}: missing field (one of {', '.join(names)})")
    return None


def load_measured(path: str | Path) -> list[Measured]:
    """The records of one bench/comm_volume.py --json file ({"records": [...]}; a bare list also works).
    Each record: algorithm, P, numel, density, bytes_recv_max, bytes_sent_max (gTopk), messages_max."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SystemExit(f"project_scaling: cannot read {path}: {e}") from None
    if isinstance(data, dict):
        data = data.get("records")
    if not isinstance(data, list):
        raise SystemExit(f"project_scaling: {path}: expected {{'records': [...]}} as bench/comm_volume.py "
                         "--json writes")
    out = []
    for i, rec in enumerate(data):
        where = f"{path} record {i}"
        if not isinstance(rec, dict):
            raise SystemExit(f"project_scaling: {where}: not an object")
        algorithm = str(_field(rec, ("algorithm",), where))
        if algorithm not in COMPRESSORS:
            raise SystemExit(f"project_scaling: {where}: unknown algorithm {algorithm!r}; known: {algorithms()}")
        nbytes = float(_field(rec, ("bytes_recv_max",), where))
        messages = float(_field(rec, ("messages_max",), where))
        if algorithm == "gtopk":  # sequential tree rounds: the root's receives and sends add up
            nbytes += float(_field(rec, ("bytes_sent_max",), where))
            messages *= 2
        out.append(Measured(
            algorithm=algorithm,
            P=int(_field(rec, ("P",), where)),
            numel=int(_field(rec, ("numel",), where)),
            density=float(_field(rec, ("density",), where)) if uses_density(algorithm) else 1.0,
            bytes=nbytes,
            messages=messages,
            options=dict(rec.get("options") or {}),
        ))
    return out


def pick_points(measured: list[Measured], algorithm: str, density: float, options: dict) -> dict[int, Measured]:
    """One measured point per P for `algorithm` with these options: the one whose density is closest."""
    points: dict[int, Measured] = {}
    for m in measured:
        if m.algorithm != algorithm or m.P <= 1 or m.options != options:  # P = 1 communicates nothing
            continue
        if m.P not in points or abs(m.density - density) < abs(points[m.P].density - density):
            points[m.P] = m
    return points


def calibration_ratio(points: dict[int, Measured], P: int) -> tuple[float, float]:
    """measured / closed form for bytes and messages at P: exact at measured P, interpolated in log2 P
    between them, the nearest measured one's outside."""
    Ps = sorted(points)
    ratios = []
    for p in Ps:
        m = points[p]
        cf_bytes, cf_msgs = closed_form(m.algorithm, p, m.numel, m.density, m.options)
        ratios.append((m.bytes / cf_bytes if cf_bytes else 1.0, m.messages / cf_msgs if cf_msgs else 1.0))
    x = np.log2(Ps)
    at = math.log2(P)
    return (float(np.interp(at, x, [r[0] for r in ratios])), float(np.interp(at, x, [r[1] for r in ratios])))


# ---------------------------------------------------------------------------------------- Ok-Topk's allgatherv
@dataclass
class AllgatherShape:
    """Ok-Topk's allgather at one measured P, per step (means over the measured steps)."""

    P: int
    pairs_over_k: float  # selected pairs allgathered (the global count) / k
    imbalance: float  # largest owner's block / mean block
    moved_over_block: float  # pairs the busiest rank receives when the blocks are re-cut to equal shares / mean block
    moved_messages: float  # messages it receives for that


def load_allgather_shapes(paths: list[str]) -> list[AllgatherShape]:
    """Ok-Topk records of bench/comm_volume.py --json files that carry its per-step figures."""
    shapes = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        for rec in data.get("records", []) if isinstance(data, dict) else data:
            if rec.get("algorithm") == "oktopk" and rec.get("extra_allgather_imbalance_before_mean") is not None:
                P, pairs = int(rec["P"]), float(rec["extra_global_count_mean"])
                shapes.append(AllgatherShape(P=P, pairs_over_k=pairs / float(rec["k"]),
                                             imbalance=float(rec["extra_allgather_imbalance_before_mean"]),
                                             moved_over_block=float(rec["extra_rebalance_pairs_in_max"]) / (pairs / P),
                                             moved_messages=float(rec["extra_rebalance_messages_in_max"])))
    return shapes


def allgatherv_ms(P: int, pairs: float, imbalance: float, moved_pairs: float, moved_messages: float,
                  model: "Model", rebalance: bool, pair_bytes: int = 2 * WORD) -> float:
    """Ring allgatherv of `pairs` pairs from P owners (see the module docstring)."""
    if P <= 1:
        return 0.0
    block = pairs / P * (1.0 if rebalance else imbalance)
    seconds = (P - 1) * (model.alpha_s + model.beta_s_per_byte * pair_bytes * block)
    if rebalance:
        seconds += model.alpha_s * moved_messages + model.beta_s_per_byte * pair_bytes * moved_pairs
    return 1e3 * seconds


def allgather_table(shapes: list[AllgatherShape], ranks: list[int], numel: int, density: float, model: "Model") -> str:
    """Plain vs rebalanced allgatherv per P of k = density * numel pairs times the measured ratios: the
    measured shape at its P, interpolated in log2 P between measured P, held beyond them."""
    shapes = sorted(shapes, key=lambda sh: sh.P)
    x = np.log2([sh.P for sh in shapes])
    k = max(1, round(density * numel))

    def at(P: int, values: list[float]) -> float:
        return float(np.interp(math.log2(P), x, values))

    lines = ["| P | source | pairs / k | imbalance (max / mean block) | moved pairs / mean block | plain ms "
             "| rebalanced ms | rebalance shortens it |", "|---|---|---|---|---|---|---|---|"]
    for P in sorted(set(ranks) | {sh.P for sh in shapes}):
        if P < 2:
            continue
        source = ("measured" if any(sh.P == P for sh in shapes) else
                  "interpolated" if shapes[0].P < P < shapes[-1].P else "held")
        pairs = k * at(P, [sh.pairs_over_k for sh in shapes])
        imbalance = at(P, [sh.imbalance for sh in shapes])
        moved = pairs / P * at(P, [sh.moved_over_block for sh in shapes])
        messages = at(P, [sh.moved_messages for sh in shapes])
        plain = allgatherv_ms(P, pairs, imbalance, moved, messages, model, rebalance=False)
        rebalanced = allgatherv_ms(P, pairs, imbalance, moved, messages, model, rebalance=True)
        lines.append(f"| {P} | {source} | {pairs / k:.3f} | {imbalance:.3f} | {moved / (pairs / P):.3f} | {plain:.3f} "
                     f"| {rebalanced:.3f} | {'yes' if rebalanced < plain else 'no'} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------- model
@dataclass
class Model:
    alpha_s: float  # seconds per message
    beta_s_per_byte: float
    compute_fixed_ms: float
    compute_per_utt_ms: float
    global_batch: int
    selection_ms: dict[str, float]

    def compute_ms(self, P: int) -> float:
        return self.compute_fixed_ms + self.compute_per_utt_ms * max(self.global_batch / P, 1.0)


def project(algorithms: list[str], ranks: list[int], numel: int, density: float, measured: list[Measured],
            model: Model, options: dict[str, dict] | None = None) -> pd.DataFrame:
    """options: compression.options per algorithm (missing = its defaults)."""
    rows = []
    for algorithm in algorithms:
        d = density if uses_density(algorithm) else 1.0
        own = (options or {}).get(algorithm, {})
        points = pick_points(measured, algorithm, d, own)
        for P in ranks:
            nbytes, messages = closed_form(algorithm, P, numel, d, own)
            if P in points and points[P].numel == numel and points[P].density == d:
                nbytes, messages, source = points[P].bytes, points[P].messages, "measured"
            elif points:
                rb, rm = calibration_ratio(points, P)
                nbytes, messages, source = nbytes * rb, messages * rm, "calibrated"
            else:
                source = "closed form"
            comm_ms = 1e3 * (model.alpha_s * messages + model.beta_s_per_byte * nbytes)
            compute_ms = model.compute_ms(P)
            selection_ms = model.selection_ms.get(algorithm, 0.0)
            rows.append({"algorithm": algorithm, "P": P, "numel": numel, "density": d, "source": source,
                         "MB_per_step": nbytes / 1e6,
                         "messages": messages, "comm_ms": comm_ms, "compute_ms": compute_ms,
                         "selection_ms": selection_ms, "step_ms": compute_ms + selection_ms + comm_ms})
    df = pd.DataFrame(rows)
    if "dense" in algorithms:
        dense_step = df[df.algorithm == "dense"].set_index("P")["step_ms"]
        df["speedup_vs_dense"] = dense_step.loc[df.P].to_numpy() / df.step_ms.to_numpy()
    return df
