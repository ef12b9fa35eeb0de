"""The selection screen: how closely each gradient exchange's update follows dense training's, against the number
of ranks P, measured on simulated ranks beside a dense trajectory (bench/selection_quality.py is its command line,
bench/screen_vs_training.py sets it beside the trained cells).

    ranks.py       the simulated ranks, each exchange built as a run builds it, the oracle, --variant rows
    gradients.py   per-rank gradients of the config's training set, cut as the trainer's sampler cuts it
    measures.py    cosines, the shadow momentum, displacements over windows of steps
    trajectory.py  one trajectory: dense training with every exchange beside it (run_bench)
    tables.py      the per-trajectory table; intervals.py: over trajectories (seeds) with 95% intervals
    vs_training.py the screen beside the trained cells' paired verdicts
"""
from sparse_asr.screening.gradients import (ShardGradients, flat_momentum, global_batches, load_training_set, mean,
                                            shards)
from sparse_asr.screening.measures import Displacements, ShadowMomentum, cosine, dot, measure, norm
from sparse_asr.screening.ranks import (ORACLE, WORD, Algorithm, Oracle, Run, RunStep, SimulatedRanks,
                                        parse_variant)
from sparse_asr.screening.tables import markdown_table, summarise, window_columns
from sparse_asr.screening.trajectory import Settings, read_start, run_bench, start_from

__all__ = ["ORACLE", "WORD", "Algorithm", "Displacements", "Oracle", "Run", "RunStep", "Settings", "ShadowMomentum",
           "ShardGradients", "SimulatedRanks", "cosine", "dot", "flat_momentum", "global_batches", "load_training_set",
           "markdown_table", "mean", "measure", "norm", "parse_variant", "read_start", "run_bench", "shards",
           "start_from", "summarise", "window_columns"]
