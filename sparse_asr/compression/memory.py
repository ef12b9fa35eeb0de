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

A memory's state is its own, saved under one key of the compressor's state (`memory`).
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

    def accumulate(self, grad: torch.Tensor) -> torch.Tensor:
        """residual += grad; returns the residual buffer, which now holds acc."""
        self.residual += grad
        return self.residual

    def applied_entries(self, indices: torch.Tensor) -> None:
        """These entries of acc went into the update whole: nothing of them is owed any more."""
        self.residual[indices.long()] = 0.0

    def applied_update(self, update: torch.Tensor) -> None:
        """`update` (dense, e.g. a low-rank approximation of acc) was applied: the rest stays owed."""
        self.residual -= update

    @property
    def owed(self) -> torch.Tensor:
        """What this rank still owes the model (benches measure its mass)."""
        return self.residual

    def state_dict(self) -> dict:
        return {"residual": self.residual.detach().cpu().clone()}

    def load_state_dict(self, state: dict) -> None:
        copy_checked(self.residual, state["residual"], "residual")


class MomentumCorrection:
    """DGC's momentum correction with optional momentum factor masking (see the module docstring)."""

    name = "dgc"
    carries_momentum = True

    def __init__(self, numel: int, device: torch.device, momentum: float, nesterov: bool = False,
                 masking: bool = True):
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"dgc memory: momentum must be in [0, 1), got {momentum}")
        self.momentum, self.nesterov, self.masking = momentum, nesterov, masking
        self.u = torch.zeros(numel, dtype=torch.float32, device=device)  # momentum
        self.v = torch.zeros(numel, dtype=torch.float32, device=device)  # velocity accumulated, not yet sent

    def accumulate(self, grad: torch.Tensor) -> torch.Tensor:
        """u and v advanced by `grad`; returns v (selected from, in place)."""
        if self.nesterov:
            self.u.add_(grad).mul_(self.momentum)
            self.v.add_(self.u).add_(grad)
        else:
            self.u.mul_(self.momentum).add_(grad)
            self.v.add_(self.u)
        return self.v

    def applied_entries(self, indices: torch.Tensor) -> None:
        indices = indices.long()
        self.v[indices] = 0.0
        if self.masking:
            self.u[indices] = 0.0

    def applied_update(self, update: torch.Tensor) -> None:
        raise ValueError("dgc memory: only a selection (a sparse compressor) can say which entries were sent")

    @property
    def owed(self) -> torch.Tensor:
        return self.v

    def state_dict(self) -> dict:
        return {"momentum": self.u.detach().cpu().clone(), "velocity": self.v.detach().cpu().clone()}

    def load_state_dict(self, state: dict) -> None:
        copy_checked(self.u, state["momentum"], "momentum")
        copy_checked(self.v, state["velocity"], "velocity")


MEMORIES = {ErrorFeedback.name: ErrorFeedback, MomentumCorrection.name: MomentumCorrection}


def copy_checked(mine: torch.Tensor, saved: torch.Tensor, what: str) -> None:
    """A checkpoint's tensor into this run's, refused (naming it) when the model or the rank's share differs."""
    if saved.shape != mine.shape:
        raise ValueError(f"checkpoint {what} has {saved.numel()} entries, this model and rank need {mine.numel()}")
    mine.copy_(saved)
