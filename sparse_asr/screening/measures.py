"""What a screen measures of each exchange's step against dense training's (the figures of bench/selection_quality.py's
docstring): cosines computed in float32 pairwise sums, the shadow momentum, and displacements over windows."""
from __future__ import annotations

import math

import numpy as np
import torch

from sparse_asr.screening.ranks import WORD, Run, RunStep
from sparse_asr.training.optim import clip_grad_norm_


def dot(a: torch.Tensor, b: torch.Tensor) -> float:
    """a . b by torch's float32 sum, which adds pairwise: ~1e-8 relative error at lstman4_small's size,
    where torch.dot (1e-5) and linalg.vector_norm (1e-4) are far off, and without a float64 copy."""
    return float((a * b).sum())


def norm(a: torch.Tensor) -> float:
    return math.sqrt(dot(a, a))


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """cos(a, b), 0 when either is zero."""
    norms = norm(a) * norm(b)
    return dot(a, b) / norms if norms > 0 else 0.0


class ShadowMomentum:
    """torch.optim.SGD's momentum buffer for a stream of updates: buf = momentum * buf + d, where d is the
    update clipped as the trainer clips it, plus weight_decay * params (dampening 0, as configured); and the
    step SGD takes from it (buf, or with Nesterov d + momentum * buf)."""

    def __init__(self, buffer: torch.Tensor, optim_cfg):
        self.buffer = buffer.clone()
        self.cfg = optim_cfg

    def add(self, update: torch.Tensor, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the buffer, the step) after this update."""
        d = update.clone()
        clip_grad_norm_(d, self.cfg.max_grad_norm)
        if self.cfg.weight_decay:
            d.add_(params, alpha=self.cfg.weight_decay)
        self.buffer.mul_(self.cfg.momentum).add_(d)
        return self.buffer, d.add_(self.buffer, alpha=self.cfg.momentum) if self.cfg.nesterov else self.buffer


def measure(run: Run, result: RunStep, reference: torch.Tensor, reference_momentum: tuple[torch.Tensor, torch.Tensor],
            params: torch.Tensor) -> tuple[dict, torch.Tensor]:
    """One step's figures for one run (module docstring), and the step it makes the model take."""
    P = len(run.compressors)
    residuals = [c.owed for c in run.compressors]
    owed = 0.0
    if residuals[0] is not None:
        total = residuals[0].clone()
        for residual in residuals[1:]:
            total += residual
        owed = norm(total) / P / norm(reference)
    cos_update = cosine(result.update, reference)
    reference_sq = dot(reference, reference)
    along = dot(result.update, reference) / reference_sq if reference_sq > 0 else 0.0
    dense_buffer, dense_step = reference_momentum
    if run.momentum is not None:
        buffer, step = run.momentum.add(result.update, params)
        cos_momentum = cosine(buffer, dense_buffer)
    else:  # +dgc, +ef21: the update is the step (the momentum lives in the ranks' memories)
        step, cos_momentum = result.update, math.nan
    applied = result.applied
    selected = [s.selected_local for s in result.stats]
    share = contributors = math.nan
    if applied[0] is not None:
        share = float(np.mean([a / s for a, s in zip(applied, selected) if s > 0])) if any(selected) else math.nan
        updated = result.stats[0].selected_global
        contributors = sum(applied) / updated if updated else math.nan
    return {"algorithm": run.algorithm.label, "P": P, "density": run.density if run.density is not None else math.nan,
            "cos_update": cos_update, "along": along, "cos_momentum": cos_momentum,
            "cos_step": cosine(step, dense_step), "owed": owed,
            "applied": share, "contributors": contributors,
            "words": float(np.mean([s.bytes_recv for s in result.stats])) / WORD,
            "update_entries": result.stats[0].selected_global, "k": result.stats[0].k,
            "cpu_seconds": result.cpu_seconds}, step


class Displacements:
    """Where the model goes over consecutive windows of W sparse steps: per key (a run, or dense) the sum of
    lr x step since its window began. Every sparse step: `add` each key's step, then `window_end()` counts the
    step and names the W whose window it ends; their `figures` are read, then `restart(W)`."""

    def __init__(self, sizes: list[int]):
        self.sizes, self.sums, self.steps = sorted(set(sizes)), {}, 0

    def add(self, key, lr: float, step: torch.Tensor) -> None:
        for W in self.sizes:
            if (key, W) in self.sums:
                self.sums[key, W].add_(step, alpha=lr)
            else:
                self.sums[key, W] = step * lr

    def window_end(self) -> list[int]:
        self.steps += 1
        return [W for W in self.sizes if self.steps % W == 0]

    def figures(self, key, dense_key, W: int) -> dict:
        """cos(key's displacement, dense's) and ||key's|| / ||dense's|| over the window of W just ended."""
        mine, dense = self.sums[key, W], self.sums[dense_key, W]
        dense_norm = norm(dense)
        return {f"cos_disp_W{W}": cosine(mine, dense),
                f"norm_disp_W{W}": norm(mine) / dense_norm if dense_norm else 0.0}

    def restart(self, W: int) -> None:
        for key in [key for key in self.sums if key[1] == W]:
            del self.sums[key]
