"""A rank's memory around a gradient exchange (DESIGN 4): what it has computed but not yet sent, the part of a
sparse compressor that is swappable (`compression.memory`, in the manner of GRACE's `Memory`):

    acc = memory.accumulate(grad)      # before selection: the buffer to select from (held in place)
    ... exchange ...
    memory.applied_entries(indices)    # after it: exactly the entries this rank's values entered the update with

- `ErrorFeedback` ("residual", the default): acc = grad + residual; an applied entry leaves the residual.
- `MomentumCorrection` ("dgc", Lin et al., ICLR 2018, section 3.2): the rank accumulates VELOCITY, not gradient:
  u <- m u + g, v <- v + u (Nesterov: u <- m (u + g), v <- v + u + g), and the exchange selects from v; an
  applied entry leaves v and, with momentum factor masking, u too (so a sent entry's stale momentum does not
  keep pushing it). The optimizer then steps WITHOUT momentum (optim.SGDStep). At density 1 without masking
  the update is exactly dense momentum SGD's; masking at density 1 clears every velocity each step (plain SGD).
- `EF21Momentum` ("ef21", EF21-SGDM: Fatkhullin, Tyurin and Richtarik, "Momentum Provably Improves Error
  Feedback!", NeurIPS 2023): each rank keeps the momentum of its own gradient (v) and its estimate of it (h), and
  sends the compressed difference v - h; every rank holds the same global estimate, the mean of the ranks' h, and
  the model steps along that estimate, not along the sparse update. What a rank has not sent stays in its
  difference, never in a residual that grows. The optimizer steps without momentum, as with dgc.
- `LowPassResidual` ("lowpass", ScaleCom's memory: Chen et al., "ScaleCom: Scalable Sparsified Gradient
  Compression for Communication-Efficient Distributed Training", NeurIPS 2020): error feedback through a low-pass
  filter, m <- (1 - beta) m + beta (acc - sent), so a rank's memory follows its unsent mass slowly and the ranks'
  memories stay alike (what CLT-k's shared index set, chosen from one rank's memory, relies on). beta = 1 is error
  feedback. ScaleCom is `compression.algorithm=cltk compression.memory=lowpass`.

After the exchange the base class hands the averaged update to `memory.global_update(update)`, which may replace
it with what the model should step along (EF21's estimate); the others leave it as it is.

A memory's state is its own, saved under one key of the compressor's state (`memory`). Each is built from the
config's sections by its own `from_settings` (compression.build_exchange looks it up in MEMORIES), and says how
many of this rank's entries the last exchange applied whole (`applied_count`, for benches).
"""
from __future__ import annotations

import torch


class ErrorFeedback:
    """Error feedback: residual = acc minus exactly what the global update took from this rank. Shared by the
    sparse compressors and PowerSGD; acc lives in the residual buffer during a step (no n-long copy)."""

    name = "residual"
    carries_momentum = False

    def __init__(self, numel: int, device: torch.device):
        self.residual = torch.zeros(numel, dtype=torch.float32, device=device)
        self.applied_count: int | None = None  # entries the last exchange applied whole (None: none selected yet)

    @classmethod
    def from_settings(cls, numel: int, device, compression, optim) -> ErrorFeedback:
        """This memory for `numel` entries with its settings from the config's compression and optim sections."""
        return cls(numel, torch.device(device))

    def accumulate(self, grad: torch.Tensor) -> torch.Tensor:
        """residual += grad; returns the residual buffer, which now holds acc."""
        self.residual += grad
        return self.residual

    def applied_entries(self, indices: torch.Tensor) -> None:
        """These entries of acc went into the update whole: nothing of them is owed any more."""
        self.residual[indices.long()] = 0.0
        self.applied_count = indices.numel()

    def applied_update(self, update: torch.Tensor) -> None:
        """`update` (dense, e.g. a low-rank approximation of acc) was applied: the rest stays owed."""
        self.residual -= update

    def global_update(self, update: torch.Tensor) -> None:
        """The averaged update is what the model steps along: nothing to change."""

    @property
    def owed(self) -> torch.Tensor:
        """What this rank still owes the model (benches measure its mass)."""
        return self.residual

    def state_dict(self) -> dict:
        return {"residual": self.residual.detach().cpu().clone()}

    def load_state_dict(self, state: dict) -> None:
        copy_checked(self.residual, state["residual"], "residual")


class RankMomentum:
    """The part of a memory that carries the optimizer's momentum (dgc, ef21): u, the momentum of this rank's
    gradient, in the optimizer's form (heavy ball u <- m u + g, the step u; Nesterov u <- m (u + g), the step u + g).
    The optimizer then steps without momentum."""

    carries_momentum = True

    def __init__(self, numel: int, device: torch.device, momentum: float, nesterov: bool = False):
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"{self.name} memory: momentum must be in [0, 1), got {momentum}")
        self.momentum, self.nesterov = momentum, nesterov
        self.u = torch.zeros(numel, dtype=torch.float32, device=device)
        self.applied_count: int | None = None  # entries the last exchange applied whole (None: none selected yet)

    def advance(self, grad: torch.Tensor) -> None:
        """u advanced by `grad` (the step is u, plus grad with Nesterov)."""
        if self.nesterov:
            self.u.add_(grad).mul_(self.momentum)
        else:
            self.u.mul_(self.momentum).add_(grad)

    def applied_update(self, update: torch.Tensor) -> None:
        raise ValueError(f"{self.name} memory: only a selection (a sparse compressor) can say which entries were sent")

    def start_from(self, buffer: torch.Tensor) -> None:
        """u as after momentum SGD with this momentum buffer (Nesterov's form holds momentum x buffer): benches that
        start a memory mid-trajectory call it; what else the memory holds starts empty."""
        self.u.copy_(buffer * self.momentum if self.nesterov else buffer)


class MomentumCorrection(RankMomentum):
    """DGC's momentum correction with optional momentum factor masking (see the module docstring). At density 1
    without masking it is momentum SGD, so start_from is the state momentum SGD leaves."""

    name = "dgc"

    def __init__(self, numel: int, device: torch.device, momentum: float, nesterov: bool = False,
                 masking: bool = True):
        super().__init__(numel, device, momentum, nesterov)
        self.masking = masking
        self.v = torch.zeros(numel, dtype=torch.float32, device=device)  # velocity accumulated, not yet sent

    @classmethod
    def from_settings(cls, numel: int, device, compression, optim) -> MomentumCorrection:
        """The optimizer's momentum and Nesterov setting (carried here instead), compression.momentum_masking."""
        return cls(numel, torch.device(device), optim.momentum, optim.nesterov, compression.momentum_masking)

    def accumulate(self, grad: torch.Tensor) -> torch.Tensor:
        """u and v advanced by `grad`; returns v (selected from, in place)."""
        self.advance(grad)
        self.v.add_(self.u)
        if self.nesterov:
            self.v.add_(grad)
        return self.v

    def applied_entries(self, indices: torch.Tensor) -> None:
        self.applied_count = indices.numel()
        indices = indices.long()
        self.v[indices] = 0.0
        if self.masking:
            self.u[indices] = 0.0

    def global_update(self, update: torch.Tensor) -> None:
        """The averaged velocity is the step: nothing to change."""

    @property
    def owed(self) -> torch.Tensor:
        return self.v

    def state_dict(self) -> dict:
        return {"momentum": self.u.detach().cpu().clone(), "velocity": self.v.detach().cpu().clone()}

    def load_state_dict(self, state: dict) -> None:
        copy_checked(self.u, state["momentum"], "momentum")
        copy_checked(self.v, state["velocity"], "velocity")


class EF21Momentum(RankMomentum):
    """EF21-SGDM (see the module docstring). Per rank: u, the momentum of its gradient in the optimizer's form
    (heavy ball u <- m u + g, step v = u; Nesterov u <- m (u + g), v = u + g: the same buffers as dgc's, so at
    density 1 the step is exactly dense momentum SGD's), and h, its estimate of v; the exchange selects from
    d = v - h, and h takes exactly the applied entries of d. On every rank alike: the global estimate e <- e + the
    averaged update, which is the mean of the ranks' h whenever each rank's applied values are exactly its d there.
    The paper's momentum v <- (1 - eta) v + eta g is this heavy-ball buffer times eta at lr / eta."""

    name = "ef21"

    def __init__(self, numel: int, device: torch.device, momentum: float, nesterov: bool = False):
        super().__init__(numel, device, momentum, nesterov)
        self.h = torch.zeros(numel, dtype=torch.float32, device=device)  # this rank's estimate of its v
        self.estimate = torch.zeros(numel, dtype=torch.float32, device=device)  # the ranks' mean h, on every rank
        self.difference = torch.zeros(numel, dtype=torch.float32, device=device)  # v - h: selected from, then owed

    @classmethod
    def from_settings(cls, numel: int, device, compression, optim) -> EF21Momentum:
        """The optimizer's momentum and Nesterov setting (carried here instead)."""
        return cls(numel, torch.device(device), optim.momentum, optim.nesterov)

    def accumulate(self, grad: torch.Tensor) -> torch.Tensor:
        """u advanced by `grad`; returns d = v - h (selected from, in place)."""
        self.advance(grad)
        if self.nesterov:
            torch.add(self.u, grad, out=self.difference)
        else:
            self.difference.copy_(self.u)
        return self.difference.sub_(self.h)

    def applied_entries(self, indices: torch.Tensor) -> None:
        self.applied_count = indices.numel()
        indices = indices.long()
        self.h[indices] += self.difference[indices]
        self.difference[indices] = 0.0

    def global_update(self, update: torch.Tensor) -> None:
        """The averaged applied differences move the global estimate; the model steps along the estimate."""
        self.estimate += update
        update.copy_(self.estimate)

    @property
    def owed(self) -> torch.Tensor:
        """v - h after the exchange: what this rank's estimate still lacks."""
        return self.difference

    def state_dict(self) -> dict:
        return {"momentum": self.u.detach().cpu().clone(), "estimate_rank": self.h.detach().cpu().clone(),
                "estimate_global": self.estimate.detach().cpu().clone(),
                "difference": self.difference.detach().cpu().clone()}

    def load_state_dict(self, state: dict) -> None:
        copy_checked(self.u, state["momentum"], "momentum")
        copy_checked(self.h, state["estimate_rank"], "rank estimate")
        copy_checked(self.estimate, state["estimate_global"], "global estimate")
        copy_checked(self.difference, state["difference"], "difference")


class LowPassResidual(ErrorFeedback):
    """ScaleCom's low-pass filtered error feedback (see the module docstring): with m the memory before the step and
    g the gradient, acc = m + g is selected from, and afterwards m <- (1 - beta) m + beta (acc - sent), where sent is
    acc at the applied entries (0 elsewhere). beta = 1 is ErrorFeedback, bit for bit. The residual, its state and
    what it owes are error feedback's."""

    name = "lowpass"

    def __init__(self, numel: int, device: torch.device, beta: float):
        if not 0.0 < beta <= 1.0:
            raise ValueError(f"lowpass memory: beta must be in (0, 1], got {beta}")
        super().__init__(numel, device)  # the residual: m, and acc during a step
        self.beta = beta
        self.grad = torch.zeros(numel, dtype=torch.float32, device=device)  # this step's g: m = acc - g

    @classmethod
    def from_settings(cls, numel: int, device, compression, optim) -> LowPassResidual:
        """compression.lowpass_beta."""
        return cls(numel, torch.device(device), compression.lowpass_beta)

    def accumulate(self, grad: torch.Tensor) -> torch.Tensor:
        self.grad.copy_(grad)
        return super().accumulate(grad)

    def applied_entries(self, indices: torch.Tensor) -> None:
        """m <- acc - (1 - beta) g where nothing was sent, (1 - beta) (acc - g) where acc was sent whole."""
        self.applied_count = indices.numel()
        indices = indices.long()
        before = self.residual[indices] - self.grad[indices]
        self.residual.sub_(self.grad, alpha=1.0 - self.beta)
        self.residual[indices] = (1.0 - self.beta) * before

    def applied_update(self, update: torch.Tensor) -> None:
        """`update` (dense) was sent: m <- acc - beta update - (1 - beta) g."""
        self.residual.sub_(update, alpha=self.beta).sub_(self.grad, alpha=1.0 - self.beta)


MEMORIES = {cls.name: cls for cls in (ErrorFeedback, MomentumCorrection, EF21Momentum, LowPassResidual)}
DEFAULT_MEMORY = ErrorFeedback.name  # what a selection keeps when the config names no other memory



def copy_checked(mine: torch.Tensor, saved: torch.Tensor, what: str) -> None:
    """A checkpoint's tensor into this run's, refused (naming it) when the model or the rank's share differs."""
    if saved.shape != mine.shape:
        raise ValueError(f"checkpoint {what} has {saved.numel()} entries, this model and rank need {mine.numel()}")
    mine.copy_(saved)
