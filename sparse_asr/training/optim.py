"""SGD with momentum, the learning-rate schedule, and clipping of the synchronised gradient.

Schedule (deepspeech.pytorch style, which trains DeepSpeech2 on AN4 stably): linear warm-up over the
first `lr_warmup_steps` optimizer steps, then lr / lr_anneal**epoch. It depends only on (step, epoch),
so a resumed run needs nothing but those two numbers to continue the same curve.
"""
from __future__ import annotations

import torch

from sparse_asr.training.config import OptimConfig


def attach_flat_grad(params: list[torch.nn.Parameter]) -> torch.Tensor:
    """Allocate one flat float32 buffer and make every parameter's .grad a view into it."""
    flat = torch.zeros(sum(p.numel() for p in params), dtype=torch.float32, device=params[0].device)
    offset = 0
    for p in params:
        p.grad = flat[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    return flat


def build_optimizer(params, cfg: OptimConfig) -> torch.optim.SGD:
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov,
                           weight_decay=cfg.weight_decay)


def learning_rate(cfg: OptimConfig, step: int, epoch: int) -> float:
    """lr for optimizer step `step` (0-based) taken during epoch `epoch` (0-based)."""
    warm = min(1.0, (step + 1) / cfg.lr_warmup_steps) if cfg.lr_warmup_steps else 1.0
    return cfg.lr * warm / cfg.lr_anneal**epoch


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def clip_grad_norm_(flat_grad: torch.Tensor, max_norm: float) -> float:
    """Scale the (already synchronised) flat gradient to L2 norm <= max_norm; return the norm before.
    Every rank holds the same gradient, so every rank computes the same scale."""
    # float32 accumulation (PyTorch reduces pairwise): asking for float64 would first copy the whole
    # gradient to doubles, which dominated the step for lstman4 on CPU. Identical on every rank either way.
    norm = float(torch.linalg.vector_norm(flat_grad))
    if max_norm > 0 and norm > max_norm:
        flat_grad.mul_(max_norm / (norm + 1e-6))
    return norm
