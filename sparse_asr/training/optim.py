"""SGD with momentum around the gradient exchange, the learning-rate schedule, and clipping.

Usually the exchange averages gradients and the optimizer does the rest: clip the synchronised gradient,
weight decay and momentum in MomentumSGD (torch's SGD update without torch.optim's start-up). When the
exchange's memory carries the momentum (DGC's momentum correction, compression/memory.py), the optimizer has
none, and what it would have added to the gradient enters each rank's gradient before the exchange instead
(DGC's local gradient clipping, then weight decay), so that at density 1 the update is exactly dense momentum
SGD's.

Schedule (deepspeech.pytorch style, which trains DeepSpeech2 on AN4 stably): linear warm-up over the
first `lr_warmup_steps` optimizer steps, then lr / lr_anneal**epoch, or with `lr_hold_epochs` = N the full lr
for N epochs and lr / lr_anneal**(epoch - N) after them. It depends only on (step, epoch),
so a resumed run needs nothing but those two numbers to continue the same curve.
"""
from __future__ import annotations

from collections import defaultdict

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
        self.optimizer = MomentumSGD(params, lr=cfg.lr, momentum=cfg.momentum if in_optimizer else 0.0,
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


class MomentumSGD:
    """torch.optim.SGD's update (weight decay, momentum, Nesterov; dampening 0), its `state` and `param_groups`,
    and its state_dict format, so checkpoints interchange with torch's SGD. Ours because constructing any
    torch.optim optimizer imports torch._dynamo: about 2 s of start-up in every rank of every run (docs/results.md,
    "How is the test suite run"). The ops are torch's, in its order; tests/test_train.py checks the two agree."""

    def __init__(self, params: list[torch.nn.Parameter], lr: float, momentum: float = 0.0, nesterov: bool = False,
                 weight_decay: float = 0.0):
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise ValueError(f"SGD needs lr, momentum and weight_decay >= 0, got {lr}, {momentum}, {weight_decay}")
        if nesterov and momentum <= 0:
            raise ValueError("Nesterov momentum needs a momentum")
        self.params = list(params)
        self.param_groups = [{"lr": lr, "momentum": momentum, "dampening": 0, "weight_decay": weight_decay,
                              "nesterov": nesterov, "maximize": False, "foreach": None, "differentiable": False,
                              "fused": None, "params": self.params}]
        self.state: defaultdict[torch.Tensor, dict] = defaultdict(dict)

    @torch.no_grad()
    def step(self) -> None:
        group = self.param_groups[0]
        params = [p for p in self.params if p.grad is not None]
        grads = [p.grad for p in params]
        if group["weight_decay"]:
            grads = torch._foreach_add(grads, params, alpha=group["weight_decay"])
        momentum = group["momentum"]
        if momentum:
            buffers = [self.state[p].get("momentum_buffer") for p in params]
            if any(b is None for b in buffers):  # the first step: the buffer is the gradient
                buffers = [g.detach().clone() if b is None else b.mul_(momentum).add_(g)
                           for b, g in zip(buffers, grads)]
                for p, b in zip(params, buffers):
                    self.state[p]["momentum_buffer"] = b
            else:
                torch._foreach_mul_(buffers, momentum)
                torch._foreach_add_(buffers, grads)
            grads = torch._foreach_add(grads, buffers, alpha=momentum) if group["nesterov"] else buffers
        torch._foreach_add_(params, grads, alpha=-group["lr"])

    def state_dict(self) -> dict:
        """torch.optim.SGD's format: state by parameter index, the group's settings with the indices."""
        return {"state": {i: dict(self.state[p]) for i, p in enumerate(self.params) if self.state.get(p)},
                "param_groups": [{**{k: v for k, v in self.param_groups[0].items() if k != "params"},
                                  "params": list(range(len(self.params)))}]}

    def load_state_dict(self, state_dict: dict) -> None:
        """A state_dict of this optimizer or of torch.optim.SGD over the same parameters (its settings included)."""
        groups = state_dict["param_groups"]
        if len(groups) != 1 or len(groups[0]["params"]) != len(self.params):
            raise ValueError(f"the optimizer state has {[len(g['params']) for g in groups]} parameters in its "
                             f"groups, this model {len(self.params)} in one")
        if groups[0].get("dampening", 0) or groups[0].get("maximize", False):
            raise ValueError(f"the optimizer state asks for dampening {groups[0].get('dampening')} and maximize "
                             f"{groups[0].get('maximize')}; this SGD has neither")
        self.param_groups[0].update({k: v for k, v in groups[0].items() if k != "params"})
        self.state = defaultdict(dict)
        for i, s in state_dict["state"].items():
            p = self.params[int(i)]
            self.state[p] = {k: v.to(dtype=p.dtype, device=p.device) if torch.is_tensor(v) else v
                             for k, v in s.items()}


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


def set_learning_rate(optimizer: MomentumSGD, lr: float) -> None:
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
