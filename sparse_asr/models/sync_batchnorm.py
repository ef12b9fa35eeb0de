"""Synchronized BatchNorm over the project's Communicator (`model.sync_batchnorm: true`).

With P data-parallel ranks a per-rank BatchNorm normalises with the statistics of its own share of
the global batch, which bends the averaged gradient away from the whole-batch one
(bench/bn_shards.py). SyncBatchNorm takes the statistics over the whole global batch instead, so
P ranks compute what one process computes on the whole global batch (as torch.nn.SyncBatchNorm,
but through our MPI Communicator, on CPU and CUDA tensors alike):

  forward (training): per channel, each rank takes the count n_r, mean m_r and squared deviations
      M2_r = sum (x - m_r)^2 of its VALID positions (`mask`; padding never counts, outputs 0), and ONE
      allreduce sums [n_r, n_r m_r, M2_r + n_r m_r^2] in float64, so mean = S1 / N and
      var = (S2 - N mean^2) / N lose nothing to cancellation. The running statistics get the
      unbiased variance with the GLOBAL count N (as nn.BatchNorm's), identically on every rank.
  backward: ONE allreduce sums sum(dy) and sum(dy * xhat) over every rank's valid positions, and
      dx = weight * invstd * (dy - sum(dy) / N - xhat * sum(dy * xhat) / N) (0 at padding): the
      gradient of the sum of all ranks' losses with respect to this rank's input. The weight and
      bias gradients stay local; the trainer's gradient average completes them like any other.
  eval: the running statistics, no communication (evaluation shards may hold different numbers
      of batches per rank).

Both allreduces are counted by the Communicator under the op name "syncbn".
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

COUNT_AS = "syncbn"  # the Communicator's per-op name for this traffic


def _reduce_dims(x: torch.Tensor) -> list[int]:
    return [0] + list(range(2, x.dim()))


def _per_channel(v: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """(C,) -> a view that broadcasts against x (B, C, ...)."""
    return v.view(1, -1, *([1] * (x.dim() - 2)))


class SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, mask, weight, bias, running_mean, running_var, eps, momentum, comm):
        dims = _reduce_dims(x)
        if mask is None:
            count = x.numel() // x.size(1)
            local_var, local_mean = torch.var_mean(x, dims, correction=0)
            local_m2 = local_var * count
        else:
            count = int(mask.expand(x.size(0), 1, *x.shape[2:]).sum().item())
            local_mean = (x * mask).sum(dims) / max(count, 1)
            local_m2 = ((x - _per_channel(local_mean, x)) * mask).pow(2).sum(dims)
        n = torch.full((1,), float(count), dtype=torch.float64, device=x.device)
        mean64 = local_mean.double()
        stats = torch.cat([n, n * mean64, local_m2.double() + n * mean64 * mean64])
        comm.allreduce_(stats, count_as=COUNT_AS)
        total = float(stats[0])
        if total <= 1:
            raise ValueError(f"SyncBatchNorm needs more than one value per channel over all ranks in training, "
                             f"got {total:g} (input {tuple(x.shape)} on this rank)")
        C = x.size(1)
        mean = stats[1:C + 1] / total
        var = ((stats[C + 1:] - total * mean * mean) / total).clamp_(min=0.0)
        running_mean.mul_(1 - momentum).add_((momentum * mean).to(running_mean.dtype))
        running_var.mul_(1 - momentum).add_((momentum * var * total / (total - 1)).to(running_var.dtype))
        mean, invstd = mean.to(x.dtype), torch.rsqrt(var + eps).to(x.dtype)
        ctx.save_for_backward(x, mask, weight, mean, invstd)
        ctx.total, ctx.comm = total, comm
        scale = weight * invstd
        y = x * _per_channel(scale, x) + _per_channel(bias - mean * scale, x)
        return y if mask is None else y * mask

    @staticmethod
    def backward(ctx, dy):
        x, mask, weight, mean, invstd = ctx.saved_tensors
        dims = _reduce_dims(x)
        if mask is not None:
            dy = dy * mask
        xhat = (x - _per_channel(mean, x)) * _per_channel(invstd, x)
        sum_dy = dy.sum(dims)
        sum_dy_xhat = (dy * xhat).sum(dims)
        sums = torch.cat([sum_dy, sum_dy_xhat])  # a copy: sum_dy and sum_dy_xhat stay this rank's share
        ctx.comm.allreduce_(sums, count_as=COUNT_AS)
        C = x.size(1)
        mean_dy, mean_dy_xhat = sums[:C] / ctx.total, sums[C:] / ctx.total
        dx = (dy - _per_channel(mean_dy, x) - xhat * _per_channel(mean_dy_xhat, x)) * _per_channel(weight * invstd, x)
        if mask is not None:
            dx = dx * mask
        return dx, None, sum_dy_xhat, sum_dy, None, None, None, None, None


class SyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm over (N, C) frames or (B, C, ...) maps with statistics of all ranks' valid positions.
    Same parameters and buffers as nn.BatchNorm1d/2d (checkpoints load into either).

    forward(x, mask=None): `mask` (broadcastable to x, size 1 on the channel dim, 1 = valid, 0 =
    padding) keeps padded positions out of the statistics; their outputs are 0."""

    def __init__(self, num_features: int, comm, eps: float = 1e-5, momentum: float | None = 0.1):
        super().__init__(num_features, eps, momentum, affine=True, track_running_stats=True)
        self.comm = comm

    def _check_input_dim(self, x):
        if x.dim() < 2 or x.size(1) != self.num_features:
            raise ValueError(f"SyncBatchNorm({self.num_features}) expects (N, {self.num_features}, ...), "
                             f"got {tuple(x.shape)}")

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        self._check_input_dim(x)
        if not self.training:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)
        self.num_batches_tracked.add_(1)
        momentum = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        if mask is not None:
            mask = mask.to(x.dtype)
        return SyncBatchNormFunction.apply(x, mask, self.weight, self.bias, self.running_mean, self.running_var,
                                           self.eps, momentum, self.comm)
