"""Reference for synchronized BatchNorm, computed another way: ONE process on the whole global batch,
with torch's own batch_norm applied to exactly the valid positions (gathered out of the padded maps,
normalised, scattered back). No communicator and none of SyncBatchNormFunction's arithmetic."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from sparse_asr.data.dataset import SpeechDataset, collate
from sparse_asr.data.manifest import read_manifest
from sparse_asr.models import build_model
from sparse_asr.models.sync_batchnorm import SyncBatchNorm


class ValidFramesBatchNorm(SyncBatchNorm):
    """torch's batch_norm over the valid positions only (padded outputs 0), in one process."""

    def __init__(self, num_features: int):
        super().__init__(num_features, comm=None)

    def forward(self, x, mask=None):
        if self.training:
            self.num_batches_tracked.add_(1)
        args = (self.running_mean, self.running_var, self.weight, self.bias, self.training, self.momentum, self.eps)
        if mask is None:
            return F.batch_norm(x, *args)
        keep = mask[:, 0, 0, :].bool()  # (B, T) of a (B, C, F, T) map
        channels_last = x.permute(0, 3, 2, 1)  # (B, T, F, C)
        frames = channels_last[keep]  # (valid steps, F, C)
        normed = F.batch_norm(frames.reshape(-1, x.size(1)), *args).reshape(frames.shape)
        out = torch.zeros_like(channels_last).index_put((keep.nonzero(as_tuple=True)), normed)
        return out.permute(0, 3, 2, 1)


def valid_frames_model(name: str, state: dict) -> nn.Module:
    """`name` with every BatchNorm a ValidFramesBatchNorm, loaded with `state` (a model state_dict)."""
    model = build_model(name)
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, nn.modules.batchnorm._BatchNorm):
                setattr(parent, child_name, ValidFramesBatchNorm(child.num_features))
    model.load_state_dict(state)
    return model


def randomize_batchnorms(model: nn.Module, seed: int) -> None:
    """Non-trivial affine parameters and running statistics, so a mistake with either shows."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                n = module.num_features
                module.running_mean.copy_(torch.randn(n, generator=generator))
                module.running_var.copy_(torch.rand(n, generator=generator) + 0.5)
                module.weight.copy_(torch.rand(n, generator=generator) + 0.5)
                module.bias.copy_(torch.randn(n, generator=generator))


def spread_utterances(manifest, size: int, max_seconds: float = 2.5) -> list:
    """`size` real utterances of `manifest` spread evenly over its durations up to `max_seconds` (so
    their lengths differ; short ones keep float64 runs fast), shortest first, as SpeechDataset items."""
    df = read_manifest(manifest).sort_values(["duration", "utt_id"], kind="stable")
    df = df[df["duration"] <= max_seconds]
    picked = df.iloc[np.linspace(0, len(df) - 1, size).round().astype(int)].reset_index(drop=True)
    dataset = SpeechDataset(picked)
    return [dataset[i] for i in range(len(dataset))]


def rank_share(items: list, rank: int, world_size: int) -> list:
    """Rank r's contiguous share of a global batch, as BucketingSampler gives it."""
    return [items[i] for i in np.array_split(np.arange(len(items)), world_size)[rank]]


def loss_and_gradient(model: nn.Module, items: list) -> tuple[float, torch.Tensor]:
    """The trainer's loss (CTC summed over the batch / batch size) and the flat gradient of all
    parameters, with the features in the model's dtype (float64 makes the comparisons tight)."""
    batch = collate(items)
    model.zero_grad(set_to_none=True)
    dtype = next(model.parameters()).dtype
    log_probs, out_lengths = model(batch.features.to(dtype), batch.feature_lengths)
    ctc = nn.CTCLoss(blank=0, reduction="sum", zero_infinity=True)
    loss = ctc(log_probs, batch.targets, out_lengths, batch.target_lengths) / len(batch)
    loss.backward()
    return loss.item(), torch.cat([p.grad.flatten() for p in model.parameters()])


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got - expected).norm() / expected.norm())


def batchnorm_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_buffers()}
