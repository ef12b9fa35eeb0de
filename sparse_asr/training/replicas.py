"""Keeping the data-parallel replicas identical: rank 0's state everywhere at the start, averaged
BatchNorm statistics at epoch ends, and a cheap check that the replicas still agree."""
from __future__ import annotations

import torch

from sparse_asr.training.optim import MomentumSGD


def broadcast_state(comm, model: torch.nn.Module, optimizer: MomentumSGD) -> None:
    """Rank 0's model and optimizer state everywhere, so all replicas start identical."""
    for t in model.state_dict().values():
        comm.bcast_(t, root=0)
    for state in optimizer.state.values():
        for t in state.values():
            if torch.is_tensor(t):
                comm.bcast_(t, root=0)


def average_buffers(comm, model: torch.nn.Module) -> None:
    """BatchNorm running statistics are computed from each rank's own data: average them (at epoch
    ends) so every replica evaluates and checkpoints the same model."""
    for buf in model.buffers():
        if buf.is_floating_point():
            comm.allreduce_(buf)
            buf /= comm.size


def check_replicas(comm, params: list[torch.Tensor], step: int) -> None:
    """Cheap checksum of all parameters, compared over ranks; replicas must be bit-identical."""
    with torch.no_grad():
        sums = torch.stack([torch.stack([p.double().sum(), p.double().abs().sum()]) for p in params]).sum(0)
    table = comm.gather_rows(sums.cpu())
    spread = (table.max(0).values - table.min(0).values).max().item()
    if spread != 0.0:
        raise RuntimeError(f"replicas differ at optimizer step {step}: parameter checksums per rank "
                           f"{table[:, 0].tolist()} (max - min = {spread:.3e})")
