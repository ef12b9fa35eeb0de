"""SGD with momentum around the gradient exchange, the learning-rate schedule, and clipping.

Usually the exchange averages gradients and the optimizer does the rest: clip the synchronised gradient,
weight decay and momentum in torch's SGD. When the exchange's memory carries the momentum (DGC's momentum
correction, compression/memory.py), the optimizer has none, and what it would have added to the gradient
enters each rank's gradient before the exchange instead (DGC's local gradient clipping, then weight decay), so
that at density 1 the update is exactly dense momentum SGD's.

Schedule (deepspeech.pytorch style, which trains DeepSpeech2 on AN4 stably): linear warm-up over the
first `lr_warmup_steps` optimizer steps, then lr / lr_anneal**epoch, or with `lr_hold_epochs` = N the full lr
for N epochs and lr / lr_anneal**(epoch - N) after them. It depends only on (step, epoch),
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


class SGDStep:
    """The optimizer's part of a step: `before_exchange` on this rank's gradient, `after_exchange` on the
    synchronised update (clip, learning rate, SGD step)."""

    def __init__(self, params: list[torch.nn.Parameter], cfg: OptimConfig, world_size: int = 1,
                 momentum_in_exchange: bool = False):
        self.params, self.cfg, self.momentum_in_exchange = params, cfg, momentum_in_exchange
        self.world_size = world_size
        in_optimizer = not momentum_in_exchange
        self.optimizer = torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum if in_optimizer else 0.0,
                                         nesterov=cfg.nesterov and in_optimizer,
                                         weight_decay=cfg.weight_decay if in_optimizer else 0.0)

    def before_exchange(self, flat_grad: torch.Tensor) -> None:
        """With the momentum in the exchange: clip this rank's gradient, then add weight decay to it."""
        if self.momentum_in_exchange:
            local_terms_(flat_grad, [p.grad for p in self.params], [p.detach() for p in self.params], self.cfg,
                         self.world_size)

    def after_exchange(self, flat_grad: torch.Tensor, lr: float) -> float:
        """Clip the synchronised update (unless each rank's gradient was clipped), step; the norm before clipping."""
        norm = clip_grad_norm_(flat_grad, 0.0 if self.momentum_in_exchange else self.cfg.max_grad_norm)
        set_learning_rate(self.optimizer, lr)
        self.optimizer.step()
        return norm


def local_terms_(flat_grad: torch.Tensor, grads: list[torch.Tensor], params: list[torch.Tensor], cfg: OptimConfig,
                 world_size: int) -> None:
    """What the optimizer would add, on one rank's gradient before an exchange that carries the momentum (DGC):
    clip it (`flat_grad`; `grads` are views into it) at max_grad_norm x sqrt(P), then add weight_decay x params.
    Why sqrt(P): a rank's gradient is a mean over its own utterances, the synchronised one a mean of P of them, so
    with independent noise their norms differ by sqrt(P); DGC states the rule for a SUM over ranks as P^-1/2."""
    clip_grad_norm_(flat_grad, cfg.max_grad_norm * world_size ** 0.5)
    if cfg.weight_decay:
        torch._foreach_add_(grads, params, alpha=cfg.weight_decay)


def learning_rate(cfg: OptimConfig, step: int, epoch: int) -> float:
    """lr for optimizer step `step` (0-based) taken during epoch `epoch` (0-based)."""
    warm = min(1.0, (step + 1) / cfg.lr_warmup_steps) if cfg.lr_warmup_steps else 1.0
    return cfg.lr * warm / cfg.lr_anneal**max(0, epoch - cfg.lr_hold_epochs)


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
