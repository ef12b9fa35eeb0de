"""Selection helpers shared by the sparse algorithms: exact top-k and threshold selection."""
import torch


def topk_indices(x: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k entries of largest magnitude (exact; order unspecified)."""
    k = min(k, x.numel())
    return torch.topk(x.abs(), k, sorted=False).indices


def threshold_indices(x: torch.Tensor, threshold: float) -> torch.Tensor:
    """Indices (sorted ascending) of the entries with |x| >= threshold."""
    return torch.nonzero(x.abs() >= threshold, as_tuple=False).flatten()
