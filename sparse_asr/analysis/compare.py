"""Compare training runs: TensorBoard event files + config.yaml -> PNG curves and a results table.

    .venv/bin/python scripts/compare_runs.py runs/A runs/B [...] --out results/compare

A run directory without event files is read from its metrics.jsonl (or metrics.jsonl.xz or .gz: the runs kept in
docs/results/), which holds the same scalars.

Writes, under --out:
  curves_vs_step.png, curves_vs_wall_time.png, curves_vs_bytes.png
      dev WER (dev/wer) and train loss (train/loss) against the optimizer step, against wall time
      (event wall_time minus the run's first event) and against the cumulative bytes each rank received
      (comm/cum_bytes_recv at the nearest logged step);
  results.csv, results.md
      one row per run: algorithm, density (for dense and PowerSGD, which ignore the configured one: the
      last logged comm/density), P, steps, final/best dev WER, final dev CER, test WER and
      CER, bytes received per rank (in all and per step: the gradient exchange), synchronized
      BatchNorm's bytes per step (comm/syncbn_bytes_recv), mean compute / selection / communication
      / step time. With --target-wer W (or --target-run NAME: W = that run's best dev WER x (1 +
      --target-slack), "reaches dense's WER within 5%" by default) three more columns: target_dev_wer,
      and step_at_target and bytes_at_target, the step of the first dev evaluation at WER <= W and
      the bytes each rank had received by then (empty: never reached). Runs named <label>-s<seed> (bench/
      accuracy.sh --seeds) with --target-run <label>: each run's target is that of the <label> run at its seed.
  paired.csv, paired.md (with --paired-against LABEL, e.g. dense)
      every other label against LABEL at the seeds both ran, for test WER, best dev WER, the last
      epoch's training loss (epoch/loss), the test loss (how well the model fits held-out data) and
      the step at which dev WER first fell below 0.8 (leaving CTC's blank plateau; a run that never
      did is named in `unpaired`): the difference per seed, absolute and relative to LABEL's value, the
      means with 95% Student-t intervals (n-1 degrees of freedom; none for one seed), and a verdict from
      the relative interval ("not resolved" when it holds both -5% and +5%; the rule: sparse_asr/stats.py).
      A seed that only one side ran, or a value one side never logged, is named in `unpaired`. Runs pair
      by their config's `seed`; a run's label is its name without the suffix -s<seed>. --label-by KEY
      appends @<KEY's last part>=<value> to every label (and name): with distributed.world_size, Ok-Topk at
      P = 1, 2 and 4 are the labels oktopk@world_size=1, =2 and =4, each paired with dense@world_size=4 or
      with one another.
  paired_curves_vs_step.png (with --paired-against)
      one colour per label: the mean over its seeds of dev WER and train loss at every step all its seeds
      logged, the 95% interval of that mean as a band, each seed as a faint line; the loss on a log scale,
      each seed's running mean over a 25th of its logged steps, the geometric mean over seeds.
  spread.csv, spread.md (with --spread)
      per label over its seeds: how many runs never left CTC's blank plateau (dev WER < 0.8; which seeds), the
      median step at which the others left it, and test WER's mean, sample standard deviation, min and max
      (a run still on the plateau without a test WER, e.g. one still training, is undecided, not counted);
      with --paired-against LABEL, Fisher's exact test (two-sided p) of each label's count on the plateau
      against LABEL's: whether a difference in that risk is shown at all.
A tag a run never logged leaves its cells empty (and its curve out of the plot), never NaN errors. Runs logged
before the dev set's rename (val/*) are read as dev/* (sparse_asr/training/runlog.py).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from sparse_asr.analysis.paired import paired_comparison, paired_frame, paired_markdown, spread_markdown, spread_rows
from sparse_asr.analysis.plots import plot, plot_paired
from sparse_asr.analysis.runs import label_by, load_run
from sparse_asr.analysis.table import markdown_table, run_targets, summarize


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", help="run directories (runs/<name>) holding event files and config.yaml")
    parser.add_argument("--out", required=True, help="directory for the plots and results.{csv,md}")
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--target-wer", type=float, help="dev WER whose first reaching step and bytes are tabled")
    target.add_argument("--target-run", help="the target is this run's best dev WER x (1 + --target-slack); a label "
                                             "(runs <label>-s<seed>): the one of each run's seed")
    parser.add_argument("--target-slack", type=float, default=0.05, help="relative slack of --target-run")
    parser.add_argument("--paired-against", metavar="LABEL",
                        help="also write paired.{csv,md}: every other label against LABEL, seed by seed")
    parser.add_argument("--label-by", metavar="KEY",
                        help="a config key (e.g. distributed.world_size) whose value each run's label carries "
                             "(oktopk@world_size=2): runs of one algorithm from different cells side by side")
    parser.add_argument("--spread", action="store_true",
                        help="also write spread.{csv,md}: per label, the runs left on CTC's plateau and test WER's "
                             "spread")
    args = parser.parse_args(argv)

    runs = [load_run(d) for d in args.run_dirs]
    if args.label_by is not None:
        for run in runs:
            label_by(run, args.label_by)
    names = [run.name for run in runs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SystemExit(f"compare_runs: runs with the same name would share a legend entry: {duplicates} (runs of "
                         f"different cells: --label-by the config key that tells them apart)")
    targets = [args.target_wer] * len(runs)
    if args.target_run is not None:
        targets = run_targets(runs, args.target_run, args.target_slack)
    paired = paired_comparison(runs, args.paired_against) if args.paired_against is not None else None
    spread = spread_rows(runs, args.paired_against) if args.spread else None
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    table = pd.DataFrame([summarize(run, target_wer) for run, target_wer in zip(runs, targets)])
    table.to_csv(out_dir / "results.csv", index=False)
    markdown = markdown_table(table)
    (out_dir / "results.md").write_text(markdown)
    written = [out_dir / "results.csv", out_dir / "results.md"]
    if paired is not None:
        rows, seeds = paired
        paired_frame(rows, seeds).to_csv(out_dir / "paired.csv", index=False)
        paired_md = paired_markdown(rows, seeds, args.paired_against)
        (out_dir / "paired.md").write_text(paired_md)
        written += [out_dir / "paired.csv", out_dir / "paired.md"]
        markdown += "\n" + paired_md
        for row in rows:
            if row["unpaired"]:
                print(f"compare_runs: warning: {row['run']} {row['metric']}: unpaired: {row['unpaired']}",
                      file=sys.stderr)
    if spread is not None:
        pd.DataFrame(spread).to_csv(out_dir / "spread.csv", index=False)
        spread_md = spread_markdown(spread, args.paired_against)
        (out_dir / "spread.md").write_text(spread_md)
        written += [out_dir / "spread.csv", out_dir / "spread.md"]
        markdown += "\n" + spread_md
    plots = plot(runs, out_dir)
    if paired is not None:
        plots.append(plot_paired(runs, out_dir))
    print(markdown)
    print("wrote", ", ".join(str(p) for p in [*written, *plots]))
    return 0
