"""A screen's table: per (algorithm, P, density) the mean over the sparse steps and the last step's value."""
from __future__ import annotations

import math

import pandas as pd


def summarise(steps: pd.DataFrame) -> pd.DataFrame:
    """Per (algorithm, P, density): the mean over the sparse steps and the last step's value."""
    keys = ["algorithm", "P", "density"]
    order = {label: i for i, label in enumerate(dict.fromkeys(steps["algorithm"]))}
    grouped = steps.groupby(keys, dropna=False, sort=False)
    figures = ["cos_update", "along", "cos_momentum", "cos_step", "owed", "applied", "contributors", "words",
               "update_entries", "k", *window_columns(steps)]
    summary = grouped[figures].mean().add_suffix("_mean").join(grouped[figures].last().add_suffix("_last"))
    summary["steps"] = grouped.size()
    summary = summary.reset_index()
    summary["order"] = summary["algorithm"].map(order)
    return summary.sort_values(["order", "density", "P"], na_position="first").drop(columns="order")


def window_columns(steps: pd.DataFrame) -> list[str]:
    """The displacement figures present (cos_disp_W<W>, norm_disp_W<W>), by W."""
    sizes = sorted({int(c.removeprefix("cos_disp_W")) for c in steps.columns if c.startswith("cos_disp_W")})
    return [f"{what}_W{W}" for W in sizes for what in ("cos_disp", "norm_disp")]


def markdown_table(summary: pd.DataFrame) -> str:
    def pair(row, name, digits):
        return f"{row[name + '_mean']:.{digits}f} / {row[name + '_last']:.{digits}f}"

    sizes = sorted({int(c.removeprefix("cos_disp_W").removesuffix("_mean")) for c in summary.columns
                    if c.startswith("cos_disp_W") and c.endswith("_mean")})
    lines = ["| algorithm | P | density | entries updated | cos(update, dense mean gradient) mean / last | "
             "along dense mean / last | cos(momentum, dense momentum) mean / last | "
             "cos(step, dense momentum SGD's step) mean / last | owed mean / last | "
             "share of local picks applied | ranks per applied entry | words received per rank |"
             + "".join(f" displacement over {W} steps: cos / norm ratio |" for W in sizes),
             "|---|---|---|---|---|---|---|---|---|---|---|---|" + "---|" * len(sizes)]
    for _, row in summary.iterrows():
        density = "-" if math.isnan(row["density"]) else f"{row['density']:g}"
        entries = "-" if math.isnan(row["density"]) else f"{row['update_entries_mean'] / row['k_mean']:.2f} k"
        applied = "-" if math.isnan(row["applied_mean"]) else f"{row['applied_mean']:.2f}"
        contributors = "-" if math.isnan(row["contributors_mean"]) else f"{row['contributors_mean']:.2f} of {row['P']}"
        momentum = "-" if math.isnan(row["cos_momentum_mean"]) else pair(row, "cos_momentum", 3)
        lines.append(f"| {row['algorithm']} | {row['P']} | {density} | {entries} | {pair(row, 'cos_update', 3)} | "
                     f"{pair(row, 'along', 3)} | "
                     f"{momentum} | {pair(row, 'cos_step', 3)} | {pair(row, 'owed', 2)} | {applied} | {contributors} | "
                     f"{row['words_mean']:,.0f} |"
                     + "".join(f" {displacement(row, W)} |" for W in sizes))
    return "\n".join(lines)


def displacement(row, W: int) -> str:
    """'cos / norm ratio' of the displacement over W steps, the mean over the run's windows ('-': no full window)."""
    cos, ratio = row[f"cos_disp_W{W}_mean"], row[f"norm_disp_W{W}_mean"]
    return "-" if math.isnan(cos) else f"{cos:.3f} / {ratio:.3f}"
