"""What the quantized exchanges (half.py, onebit.py, randomk.py, qsgd.py) share: the owner-chunk exchange of a
reduce-scatter + allgather done by hand, and generators seeded per step.

Owner chunks: the vector is cut into P contiguous chunks, chunk j = [j n // P, (j + 1) n // P) owned by rank j.
`to_owners` sends each rank's part j to rank j by point to point (what arrives is exactly what is counted, and no
size exchange is needed: every size follows from n and P); the owner reduces what arrived in rank order, once,
and `from_owners` allgathers the owners' results, so every rank gets the same bits. Used where MPI cannot do the
reduction itself (a half-precision sum, a sign-and-scale re-compression).
"""
from __future__ import annotations

import numpy as np
import torch

OWNER_TAG = 7  # point-to-point tag of the owner exchange (the others use the default tag 0)


def owner_bounds(numel: int, P: int) -> list[int]:
    """Chunk j is [bounds[j], bounds[j + 1])."""
    return [j * numel // P for j in range(P + 1)]


def to_owners(comm, parts: list[torch.Tensor], sizes: list[int]) -> list[torch.Tensor]:
    """Send parts[j] (1-D) to rank j; returns the part every rank sent this rank, in rank order (this rank's own
    part uncopied). `sizes[q]` is the length of rank q's part for this rank (known to all: no size exchange)."""
    rank = comm.rank
    received = [parts[rank] if q == rank else torch.empty(sizes[q], dtype=parts[rank].dtype, device=parts[rank].device)
                for q in range(comm.size)]
    requests = []
    for q in range(comm.size):
        if q != rank and sizes[q]:
            requests.append(comm.irecv(received[q], source=q, tag=OWNER_TAG))
    for j in range(comm.size):
        if j != rank and parts[j].numel():
            requests.append(comm.isend(parts[j].contiguous(), dest=j, tag=OWNER_TAG))
    comm.waitall(requests)
    return received


def from_owners(comm, mine: torch.Tensor, counts: list[int]) -> list[torch.Tensor]:
    """Every owner's result (counts[j] elements from rank j), in rank order, by one allgatherv."""
    gathered, _ = comm.allgatherv(mine.contiguous(), counts=counts)
    return list(torch.split(gathered, counts))


def step_generator(device: torch.device, *keys: int) -> torch.Generator:
    """A generator seeded from `keys` (e.g. (seed, step) or (seed, rank, step)) through numpy's SeedSequence, so
    that nearby keys give unrelated streams: a step's draws follow from its keys alone, and a resume that
    restores the step counter continues the same draws."""
    seed = int(np.random.SeedSequence([int(k) for k in keys]).generate_state(1, np.uint64)[0])
    return torch.Generator(device=device).manual_seed(seed)


def float_bytes(value: torch.Tensor) -> torch.Tensor:
    """A float32 scalar as 4 uint8 (to travel in one message with packed bits)."""
    return value.to(torch.float32).reshape(1).view(torch.uint8)


def bytes_float(raw: torch.Tensor) -> torch.Tensor:
    """The float32 scalar of 4 bytes (a copy: the bytes may sit at any offset)."""
    return raw.clone().view(torch.float32)[0]
