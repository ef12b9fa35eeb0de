"""Selection quality over several trajectories, with intervals: the tables of
`bench/selection_quality.py --seeds S ... [--per-rank U ...]`.

One trajectory of the selection bench moves by 0.015-0.03 in cosine from one setup to another, so a single one
decides nothing. Here every figure is first averaged over a trajectory's sparse steps, then over trajectories
(one per seed: its initial model, data order and masks) as a mean with its 95% Student-t interval
(sparse_asr/stats.py). The comparison that matters, an algorithm's gap to the oracle (the exact global top-k of
the ranks' summed acc: oracle's cos minus the algorithm's, at the same P, density and step), is paired within a
trajectory, which removes most of the trajectory-to-trajectory spread.

The grid (--per-rank U ...): every P of --ranks x utterances per rank U, each cell a global batch of P x U. Cells
of one global batch share a trajectory (the model follows that batch's dense mean gradient); cells are compared
along U (same P) and along P (same U) seed by seed, and a difference counts as resolved when its 95% interval
excludes 0.
"""
from __future__ import annotations

import math

import pandas as pd

from sparse_asr.stats import paired_interval

FIGURES = ["cos_update", "cos_step", "owed"]


def figures_of(frame: pd.DataFrame) -> list[str]:
    """FIGURES and the displacement figures over windows the bench wrote (cos_disp_W<W>, norm_disp_W<W>), by W."""
    sizes = sorted({int(c.removeprefix("cos_disp_W")) for c in frame.columns if c.startswith("cos_disp_W")})
    return FIGURES + [f"{what}_W{W}" for W in sizes for what in ("cos_disp", "norm_disp")]


def per_trajectory(steps: pd.DataFrame, oracle_label: str) -> pd.DataFrame:
    """Each figure's mean over the sparse steps (a displacement figure's: over the windows), per (seed, global batch,
    algorithm, P, density), and the gap to the oracle's cos_update (the rows of algorithm `oracle_label`) at the same
    seed, batch, P and density (NaN without an oracle row)."""
    keys = ["seed", "global_batch", "algorithm", "P", "density"]
    means = steps.groupby(keys, dropna=False, sort=False)[figures_of(steps)].mean().reset_index()
    oracle = means[means["algorithm"] == oracle_label].set_index(["seed", "global_batch", "P", "density"])["cos_update"]
    at = means.set_index(["seed", "global_batch", "P", "density"]).index
    means["gap"] = [oracle.get(key, math.nan) - value for key, value in zip(at, means["cos_update"])]
    return means


def interval_text(values: list[float], digits: int = 3) -> str:
    """'mean [low, high]' over the values (one value: just the mean, 'n=1')."""
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "-"
    i = paired_interval(values)
    if i.low is None:
        return f"{i.mean:.{digits}f} (n=1)"
    return f"{i.mean:.{digits}f} [{i.low:.{digits}f}, {i.high:.{digits}f}]"


def over_seeds(trajectories: pd.DataFrame) -> pd.DataFrame:
    """Per (global batch, algorithm, P, density): every figure and the gap to the oracle as 'mean [95% interval]'
    over the trajectories, and n (how many)."""
    rows = []
    keys = ["global_batch", "algorithm", "P", "density"]
    for key, group in trajectories.groupby(keys, dropna=False, sort=False):
        row = dict(zip(keys, key), n=len(group))
        for figure in [*figures_of(trajectories), "gap"]:
            row[figure] = interval_text(group[figure].tolist())
        rows.append(row)
    return pd.DataFrame(rows)


def over_seeds_markdown(table: pd.DataFrame) -> str:
    windows = [c for c in figures_of(table) if c not in FIGURES]
    titles = {c: f"{'cos' if c.startswith('cos') else 'norm ratio'} of the displacement over {c.split('_W')[1]} steps"
              for c in windows}
    lines = ["| global batch | algorithm | P | density | trajectories | cos(update, dense mean gradient) | "
             "cos(step, dense momentum SGD's step) | owed | gap to the oracle's cos |"
             + "".join(f" {titles[c]} |" for c in windows),
             "|---|---|---|---|---|---|---|---|---|" + "---|" * len(windows)]
    for _, r in table.iterrows():
        density = "-" if isinstance(r["density"], float) and math.isnan(r["density"]) else f"{r['density']:g}"
        lines.append(f"| {r['global_batch']} | {r['algorithm']} | {r['P']} | {density} | {r['n']} | "
                     f"{r['cos_update']} | {r['cos_step']} | {r['owed']} | {r['gap']} |"
                     + "".join(f" {r[c]} |" for c in windows))
    return "\n".join(lines)


def cell_gaps(trajectories: pd.DataFrame, algorithm: str, density: float) -> dict[tuple[int, int], dict[int, float]]:
    """(P, utterances per rank) -> seed -> the algorithm's gap to the oracle there."""
    rows = trajectories[(trajectories["algorithm"] == algorithm) & (trajectories["density"] == density)]
    cells: dict[tuple[int, int], dict[int, float]] = {}
    for _, r in rows.iterrows():
        cells.setdefault((int(r["P"]), int(r["global_batch"]) // int(r["P"])), {})[int(r["seed"])] = float(r["gap"])
    return cells


def grid_markdown(trajectories: pd.DataFrame, algorithm: str, density: float) -> str:
    """The grid of the algorithm's gap to the oracle (P rows x utterances per rank columns), then every pair of
    neighbouring cells compared seed by seed: the mean difference with its 95% interval, resolved or not."""
    cells = cell_gaps(trajectories, algorithm, density)
    ranks = sorted({P for P, _ in cells})
    per_rank = sorted({u for _, u in cells})
    lines = [f"{algorithm}'s gap to the oracle (oracle's cos(update, dense) minus its own), density {density:g}, "
             "mean [95% interval] over trajectories:", "",
             "| P \\ utterances per rank | " + " | ".join(str(u) for u in per_rank) + " |",
             "|---|" + "---|" * len(per_rank)]
    for P in ranks:
        row = [interval_text(list(cells[P, u].values())) if (P, u) in cells else "" for u in per_rank]
        lines.append(f"| {P} | " + " | ".join(row) + " |")
    lines += ["", "Neighbouring cells, paired by seed (second minus first; resolved: the interval excludes 0):", "",
              "| first | second | seeds | difference of the gaps | resolved |", "|---|---|---|---|---|"]
    pairs = [((P, a), (P, b)) for P in ranks for a, b in zip(per_rank, per_rank[1:])]
    pairs += [((a, u), (b, u)) for u in per_rank for a, b in zip(ranks, ranks[1:])]
    for first, second in pairs:
        if first not in cells or second not in cells:
            continue
        seeds = sorted(set(cells[first]) & set(cells[second]))
        if not seeds:
            continue
        differences = [cells[second][s] - cells[first][s] for s in seeds]
        i = paired_interval(differences)
        resolved = "n/a (one seed)" if i.low is None else ("yes" if i.low > 0 or i.high < 0 else "no")
        lines.append(f"| P={first[0]}, {first[1]}/rank | P={second[0]}, {second[1]}/rank | {len(seeds)} | "
                     f"{interval_text(differences)} | {resolved} |")
    return "\n".join(lines)
