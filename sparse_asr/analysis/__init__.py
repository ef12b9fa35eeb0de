"""Reading finished runs and comparing them (what scripts/compare_runs.py and scripts/keep_runs.py run), and the
projection of the exchanges to many ranks (what bench/project_scaling.py runs):
  runs.py     a run directory's scalars (TensorBoard events or metrics.jsonl) and config
  table.py    one row per run: final and best WER, bytes, times, the step reaching a target WER
  paired.py   runs paired by seed: per-seed differences, intervals and verdicts (stats.py), the plateau spread
  plots.py    the curves against step, wall time and bytes, and the paired mean-over-seeds picture
  compare.py  compare_runs' command line
  keep.py     keep_runs: finished runs made small enough to commit
  scaling.py  each exchange's communication and step time at P ranks, an alpha-beta model; scaling_report.py
              its tables, plot and command line"""
