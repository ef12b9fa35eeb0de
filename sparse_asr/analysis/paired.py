"""Runs paired by seed: every label against a baseline label at the seeds both ran (the difference per seed and
its mean with a 95% Student-t interval and verdict, sparse_asr/stats.py), the spread of a label's seeds (CTC's
blank plateau, test WER), and the mean over seeds of a curve with its interval (the paired picture's bands).

Runs of two algorithms at the same seeds share the batches, the initial weights and the masks, so a difference
is taken seed by seed. A run's label is its name without -s<seed> (runs.run_label); pairing never guesses: a run
without a seed, or two runs of one label at one seed, is an error naming them."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from sparse_asr.analysis.runs import Curve, Run, run_label, run_seed
from sparse_asr.stats import MARGIN_PCT, fisher_exact_two_sided, paired_interval, verdict

# CTC's blank plateau: dev WER stays ~1 (mostly blanks) for a long and variable stretch, and when a run leaves
# it decides much of where a short CPU run ends (docs/results.md): the step of the first dev WER below this.
PLATEAU_EXIT_WER = 0.8
# dev evaluations averaged by the "mean dev WER of the last N" paired metric (one evaluation an epoch)
LAST_DEV_EVALS = 5


def plateau_exit_step(curve: Curve) -> float:
    """The step of the first dev evaluation with WER < PLATEAU_EXIT_WER (inf: never)."""
    below = np.flatnonzero(curve.values < PLATEAU_EXIT_WER)
    return float(curve.steps[below[0]]) if below.size else math.inf


# (column, what paired.md calls it, the tag, the value of a run's curve of that tag): lower is better for all.
# The test loss beside the training loss tells a worse fit of the training data from a worse model.
PAIRED_METRICS = [
    ("test_wer", "test WER", "test/wer", lambda curve: curve.last()),
    ("best_dev_wer", "best dev WER", "dev/wer", lambda curve: float(np.min(curve.values))),
    # the dev set has 267 words: the mean over the last epochs is a steadier read-out of where a run ended
    ("last5_dev_wer", f"mean dev WER of the last {LAST_DEV_EVALS}", "dev/wer",
     lambda curve: float(np.mean(curve.values[-LAST_DEV_EVALS:]))),
    ("last_epoch_loss", "last-epoch loss", "epoch/loss", lambda curve: curve.last()),
    ("test_loss", "test loss", "test/loss", lambda curve: curve.last()),
    ("plateau_exit_step", f"step of the first dev WER < {PLATEAU_EXIT_WER:g}", "dev/wer", plateau_exit_step),
]


def runs_by_label_and_seed(runs: list[Run]) -> dict[str, dict[int, Run]]:
    """label -> seed -> run, in the order the runs were given; a run without a seed, or two runs of one
    label at one seed, is an error naming them (pairing must never guess)."""
    groups: dict[str, dict[int, Run]] = {}
    for run in runs:
        seed = run_seed(run)
        if seed is None:
            raise SystemExit(f"compare_runs: runs are paired by their config's seed, and {run.path / 'config.yaml'} "
                             f"has none (seed: {run.config_value('seed')!r})")
        label = run_label(run)
        other = groups.setdefault(label, {}).get(seed)
        if other is not None:
            raise SystemExit(f"compare_runs: {other.path} and {run.path} are both {label!r} at seed {seed}: "
                             f"cannot pair them (give one of them)")
        groups[label][seed] = run
    return groups


def paired_comparison(runs: list[Run], baseline: str) -> tuple[list[dict], list[int]]:
    """Every label but `baseline`, metric by metric, against `baseline` at the same seeds: the difference
    d_s = run - baseline and the relative one r_s = 100 d_s / baseline for each seed s both have, the mean
    of each with its 95% Student-t interval (sparse_asr.stats.paired_interval: n-1 degrees of freedom,
    none for one seed), and the verdict of the relative interval (sparse_asr.stats.verdict). A seed
    that only one side has, or where one side logged no value, is named in `unpaired`, never dropped
    silently. Returns (rows, every seed seen)."""
    groups = runs_by_label_and_seed(runs)
    if baseline not in groups:
        raise SystemExit(f"compare_runs: --paired-against {baseline!r} is not among the run labels {sorted(groups)} "
                         f"(a label is a run's name without -s<seed>)")
    all_seeds = sorted({seed for group in groups.values() for seed in group})
    base = groups[baseline]
    rows = []
    for label, group in groups.items():
        if label == baseline:
            continue
        for column, _, tag, read in PAIRED_METRICS:
            row = {"run": label, "baseline": baseline, "metric": column}
            diffs, rels, unpaired, zero_baseline = [], [], [], False
            for seed in sorted(set(group) | set(base)):
                if seed not in group or seed not in base:
                    unpaired.append(f"s{seed}: no {label if seed not in group else baseline} run")
                    continue
                missing = [r.name for r in (group[seed], base[seed]) if tag not in r.curves]
                if missing:
                    unpaired.append(f"s{seed}: {', '.join(missing)} logged no {tag}")
                    continue
                value, reference = read(group[seed].curves[tag]), read(base[seed].curves[tag])
                if not (math.isfinite(value) and math.isfinite(reference)):
                    unpaired.append(f"s{seed}: no finite {column} ({value} vs {reference})")
                    continue
                diff = value - reference
                rel = 100.0 * diff / reference if reference else None
                zero_baseline |= rel is None
                row.update({f"value_s{seed}": value, f"baseline_s{seed}": reference, f"diff_s{seed}": diff,
                            f"rel_pct_s{seed}": rel})
                diffs.append(diff)
                rels.append(rel)
            row["n"] = len(diffs)
            row["unpaired"] = "; ".join(unpaired)
            absolute = paired_interval(diffs) if diffs else None
            # a baseline of 0 has no relative difference: no relative interval, no verdict
            relative = paired_interval(rels) if rels and not zero_baseline else None
            row.update(mean_diff=absolute and absolute.mean, diff_low=absolute and absolute.low,
                       diff_high=absolute and absolute.high, mean_rel_pct=relative and relative.mean,
                       rel_low_pct=relative and relative.low, rel_high_pct=relative and relative.high)
            row["verdict"] = (verdict(relative) if relative else
                              "n/a (no pair)" if not diffs else "n/a (baseline 0)")
            rows.append(row)
    return rows, all_seeds


PAIRED_COLUMNS = ["run", "baseline", "metric", "n", "mean_diff", "diff_low", "diff_high", "mean_rel_pct", "rel_low_pct",
                  "rel_high_pct", "verdict", "unpaired"]


def paired_frame(rows: list[dict], seeds: list[int]) -> pd.DataFrame:
    """paired.csv: the fixed columns, then value, baseline, diff and rel_pct of each seed."""
    per_seed = [f"{what}_s{seed}" for seed in seeds for what in ("value", "baseline", "diff", "rel_pct")]
    return pd.DataFrame(rows, columns=PAIRED_COLUMNS + per_seed)


def paired_markdown(rows: list[dict], seeds: list[int], baseline: str) -> str:
    def signed(x) -> str:
        return "n/a" if x is None else f"{x:+.4g}"

    def pct(x) -> str:
        return "n/a" if x is None else f"{x:+.1f}%"

    def interval(mean, low, high, fmt) -> str:
        return "" if mean is None else fmt(mean) + ("" if low is None else f" [{fmt(low)}, {fmt(high)}]")

    titles = {column: title for column, title, _, _ in PAIRED_METRICS}
    m = f"{MARGIN_PCT:g}%"
    lines = [
        f"Paired by seed against {baseline}: for each seed both ran, difference = run - {baseline} and relative = "
        f"100 x difference / {baseline}'s value (lower is better for every metric); the mean of the n paired "
        f"differences with its 95% Student-t interval (n-1 degrees of freedom; n/a for one seed). Verdict, from "
        f"the interval of the relative difference: worse / better = it excludes 0 (\"by > {m}\": it also excludes "
        f"the {m} on that side; \"by < {m}\": it stays within {m}); not resolved = it holds both -{m} and +{m}; "
        f"within ±{m} = it holds 0 and lies inside ±{m}; not worse by {m} / not better by {m} = it holds 0 "
        f"and only one of ±{m}. Ends count as inside.",
        "",
        f"| run | metric | n | per seed: difference (relative) | mean run / {baseline} | mean difference [95% CI] "
        "| mean relative [95% CI] | verdict | unpaired |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        paired = [s for s in seeds if row.get(f"diff_s{s}") is not None]
        per_seed = "; ".join(f"s{s} {signed(row[f'diff_s{s}'])} ({pct(row[f'rel_pct_s{s}'])})" for s in paired)
        means = "" if not paired else " / ".join(
            f"{np.mean([row[f'{what}_s{s}'] for s in paired]):.4g}" for what in ("value", "baseline"))
        lines.append(" | ".join([
            f"| {row['run']}", titles[row["metric"]], str(row["n"]), per_seed, means,
            interval(row["mean_diff"], row["diff_low"], row["diff_high"], signed),
            interval(row["mean_rel_pct"], row["rel_low_pct"], row["rel_high_pct"], pct),
            row["verdict"], row["unpaired"]]) + " |")
    return "\n".join(lines) + "\n"


def spread_rows(runs: list[Run], baseline: str | None = None) -> list[dict]:
    """--spread: per label over its seeds (each seed once), how many runs never left CTC's blank plateau (no dev
    WER < PLATEAU_EXIT_WER; which seeds) and the spread of test WER: mean, sample standard deviation (n-1), min and
    max over the runs that logged one; the median step at which the others left the plateau. A run still on the
    plateau that logged no test WER has not ended (or had no test set): it is undecided, not counted as stuck.
    With a baseline label, each other label's count on the plateau is set against the baseline's by Fisher's
    exact test (two-sided p over the decided runs: is one label's risk of staying there shown to differ?)."""
    rows = []
    for label, group in runs_by_label_and_seed(runs).items():
        exits = {seed: plateau_exit_step(run.curves["dev/wer"])
                 for seed, run in group.items() if "dev/wer" in run.curves}
        never_left = [seed for seed, step in exits.items() if math.isinf(step)]
        stuck = [seed for seed in never_left if "test/wer" in group[seed].curves]
        undecided = [seed for seed in never_left if seed not in stuck]
        left = [step for step in exits.values() if math.isfinite(step)]
        test = [run.curves["test/wer"].last() for run in group.values() if "test/wer" in run.curves]
        rows.append({"label": label, "n": len(group), "seeds": " ".join(str(s) for s in sorted(group)),
                     "on_plateau": len(stuck), "on_plateau_seeds": " ".join(str(s) for s in sorted(stuck)),
                     "undecided_seeds": " ".join(str(s) for s in sorted(undecided)),
                     "median_exit_step": float(np.median(left)) if left else None, "n_test": len(test),
                     "test_wer_mean": float(np.mean(test)) if test else None,
                     "test_wer_sd": float(np.std(test, ddof=1)) if len(test) > 1 else None,
                     "test_wer_min": min(test, default=None), "test_wer_max": max(test, default=None),
                     "decided": len(stuck) + len(left)})
    base = next((r for r in rows if r["label"] == baseline), None)
    for r in rows:
        compared = base is not None and r is not base and r["decided"] and base["decided"]
        r["plateau_fisher_p"] = (fisher_exact_two_sided(r["on_plateau"], r["decided"], base["on_plateau"],
                                                        base["decided"]) if compared else None)
    return rows


def spread_markdown(rows: list[dict], baseline: str | None = None) -> str:
    def num(x, digits=4) -> str:
        return "" if x is None else f"{x:.{digits}g}"

    lines = [f"Per label over its seeds: runs that never left CTC's blank plateau (no dev WER < {PLATEAU_EXIT_WER:g}), "
             "the median step at which the others left it, and test WER's mean, sample standard deviation (n-1), "
             "min and max. A run still on the plateau with no test WER (not ended) is undecided, not counted."
             + (f" Fisher p: Fisher's exact test (two-sided) of the label's count on the plateau against {baseline}'s."
                if baseline else ""), "",
             "| label | seeds | on the plateau (seeds) | median exit step | test WER mean | sd | min | max |"
             + (f" plateau vs {baseline}: Fisher p |" if baseline else ""),
             "|---|---|---|---|---|---|---|---|" + ("---|" if baseline else "")]
    for r in rows:
        stuck = f"{r['on_plateau']} of {r['n']}" + (f" ({r['on_plateau_seeds']})" if r["on_plateau"] else "")
        if r["undecided_seeds"]:
            stuck += f"; undecided: {r['undecided_seeds']}"
        lines.append(f"| {r['label']} | {r['seeds']} | {stuck} | {num(r['median_exit_step'])} | "
                     f"{num(r['test_wer_mean'])} | {num(r['test_wer_sd'])} | {num(r['test_wer_min'])} | "
                     f"{num(r['test_wer_max'])} |" + (f" {num(r['plateau_fisher_p'], 2)} |" if baseline else ""))
    return "\n".join(lines) + "\n"


def running_mean(values: np.ndarray, window: int) -> np.ndarray:
    """Each point the mean of the `window` points ending at it (fewer at the start)."""
    sums = np.concatenate([[0.0], np.cumsum(values, dtype=float)])
    end = np.arange(1, len(values) + 1)
    start = np.maximum(0, end - window)
    return (sums[end] - sums[start]) / (end - start)


def seed_band(runs_by_seed: dict[int, Run], tag: str, window: int = 1, log: bool = False) -> dict | None:
    """Over the seeds of one label: the steps every seed logged `tag` at, each seed's values there (one row per
    seed; with window > 1 each seed's running mean over that many points), and per step the mean with its 95%
    Student-t interval (sparse_asr/stats.py; low/high None for one seed). log=True takes mean and interval of
    the logarithms (a geometric mean, a band that stays positive on a log axis). None when no step is shared."""
    curves = [run.curves[tag] for run in runs_by_seed.values() if tag in run.curves]
    if not curves:
        return None
    steps = curves[0].steps
    for curve in curves[1:]:
        steps = np.intersect1d(steps, curve.steps)
    if not steps.size:
        return None
    values = np.stack([running_mean(curve.values[np.searchsorted(curve.steps, steps)], window) for curve in curves])
    if log and np.any(values <= 0):
        raise SystemExit(f"compare_runs: {tag} has values <= 0: no log-scale band")
    scaled = np.log(values) if log else values
    intervals = [paired_interval([float(v) for v in column]) for column in scaled.T]
    back = np.exp if log else (lambda x: x)
    ends = [(None, None) if i.low is None else (float(back(i.low)), float(back(i.high))) for i in intervals]
    return {"steps": steps, "values": values, "mean": back(np.array([i.mean for i in intervals])),
            "low": [low for low, _ in ends], "high": [high for _, high in ends]}
