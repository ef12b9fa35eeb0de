"""Checkpoint averaging as ESPnet does it (average_nbest_models): the element-wise mean of the model parameters and
BatchNorm running statistics of a run's N best checkpoints by dev WER, or of its N newest.

The dev WER of a checkpoint is the one the run logged at the checkpoint's step (metrics.jsonl); a checkpoint
taken where no dev score was logged (mid-epoch) is not ranked. Integer buffers (BatchNorm's num_batches_tracked,
a counter, not a statistic) are taken from the newest checkpoint. Every file is read through load_shared: its
SHA-256 checked against the index, tensors only.
"""
from __future__ import annotations

from pathlib import Path

import torch

from sparse_asr.training.checkpoint import CheckpointError, complete_checkpoints, load_shared, step_of

BY = ("dev", "last")


def dev_wers(run_dir: str | Path) -> dict[int, float]:
    """{step: dev WER} of every dev evaluation a run logged (the last one logged at a step wins)."""
    from sparse_asr.training.runlog import metrics_path, read_metrics

    if metrics_path(run_dir) is None:
        return {}
    return {int(row["step"]): float(row["dev/wer"]) for row in read_metrics(run_dir)
            if row.get("kind") == "dev" and "dev/wer" in row}


def choose_checkpoints(run_dir: str | Path, n: int, by: str = "dev") -> list[tuple[Path, float | None]]:
    """The n checkpoints to average, with their dev WER: the n lowest dev WERs (ties: the newer), or the n newest;
    fewer than n is an error naming what is there (training keeps train.keep_best_checkpoints best)."""
    if by not in BY:
        raise ValueError(f"average by {by!r}: must be one of {', '.join(BY)}")
    checkpoints = complete_checkpoints(Path(run_dir) / "checkpoints")
    if not checkpoints:
        raise CheckpointError(f"{run_dir} has no finished checkpoints to average (give a run directory)")
    scores = dev_wers(run_dir)
    if by == "last":
        chosen = checkpoints[-n:]
    else:
        ranked = sorted((c for c in checkpoints if step_of(c) in scores), key=lambda c: (scores[step_of(c)],
                                                                                         -step_of(c)))
        chosen = ranked[:n]
    if len(chosen) < n:
        have = ", ".join(f"{c.name}" + (f" (dev WER {scores[step_of(c)]:.4f})" if step_of(c) in scores else "")
                         for c in checkpoints)
        raise CheckpointError(f"{run_dir}: {n} checkpoints to average by {by}, but only {len(chosen)} qualify: {have}")
    return [(c, scores.get(step_of(c))) for c in chosen]


def average_states(states: list[dict]) -> dict:
    """The element-wise mean of floating-point entries of `states` (model state dicts of one architecture, oldest
    first); other entries from the last."""
    if not states:
        raise ValueError("nothing to average")
    keys = set(states[0])
    for state in states[1:]:
        if set(state) != keys or any(state[k].shape != states[0][k].shape for k in keys):
            raise CheckpointError("the checkpoints to average are of different models")
    out = {}
    for key, last in states[-1].items():
        if last.is_floating_point():
            total = torch.zeros_like(last, dtype=torch.float64)
            for state in states:
                total += state[key].to(torch.float64)
            out[key] = (total / len(states)).to(last.dtype)
        else:
            out[key] = last.clone()
    return out


def averaged_model(run_dir: str | Path, n: int, by: str = "dev") -> tuple[dict, dict, list[tuple[Path, float | None]]]:
    """(averaged model state, the newest chosen checkpoint's shared part, the chosen checkpoints)."""
    chosen = sorted(choose_checkpoints(run_dir, n, by), key=lambda pair: step_of(pair[0]))
    shared_parts = [load_shared(path)[1] for path, _ in chosen]
    return average_states([s["model"] for s in shared_parts]), shared_parts[-1], chosen
