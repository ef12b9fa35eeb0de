"""The per-rank gradients a screen feeds its simulated ranks: the config's training set in the trainer's batch order,
cut as the trainer's sampler cuts it, computed for several P at once."""
from __future__ import annotations

import torch

from sparse_asr.comm import ThreadGroup
from sparse_asr.data.audio import SpecAugment
from sparse_asr.data.dataset import BucketingSampler, SpeechDataset, collate
from sparse_asr.data.manifest import read_manifest
from sparse_asr.models import build_model
from sparse_asr.training.loss import batch_loss
from sparse_asr.training.optim import MomentumSGD, attach_flat_grad


def load_training_set(cfg) -> SpeechDataset:
    """The config's training utterances (its `max_train_utterances` shortest if set), masked as it says."""
    d = cfg.data
    frame = read_manifest(d.train_manifest)
    if d.max_train_utterances:
        frame = frame.sort_values(["duration", "utt_id"], kind="stable").head(d.max_train_utterances)
    augment = SpecAugment(d.freq_masks, d.freq_mask_width, d.time_masks, d.time_mask_width, d.time_mask_max_fraction)
    return SpeechDataset(frame, augment=augment, seed=cfg.seed)


def global_batches(dataset: SpeechDataset, batch_size: int, seed: int, sorted_epochs: int = 0):
    """(epoch, items of one global batch) forever, in the trainer's order (its sampler, its epochs; the first
    `sorted_epochs` in order of length, SortaGrad)."""
    sampler = BucketingSampler(dataset.durations, batch_size, seed=seed, shuffle=True, drop_last=True,
                               sorted_epochs=sorted_epochs)
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        dataset.set_epoch(epoch)  # the epoch's masks
        for batch in sampler.global_batches():
            yield epoch, [dataset[int(i)] for i in batch]
        epoch += 1


def shards(items: list, P: int) -> list[list]:
    """Rank r's utterances: the r-th contiguous slice, as the sampler gives them."""
    per = len(items) // P
    return [items[r * per:(r + 1) * per] for r in range(P)]


def mean(tensors: list[torch.Tensor]) -> torch.Tensor:
    total = tensors[0].clone()
    for t in tensors[1:]:
        total += t
    return total / len(tensors)


class ShardGradients:
    """The per-rank gradients of a global batch for several P, computed in this process (module docstring).
    `replicas` take the model's parameters before each batch; the trainer's loss: CTC sum / utterances."""

    def __init__(self, model_name: str, sync_bn: bool, finest: int, timeout_s: float = 300.0):
        self.sync_bn, self.finest = sync_bn, finest
        self.group = ThreadGroup(finest, timeout_s) if sync_bn else None
        comms = self.group.comms if sync_bn else [None]
        self.replicas = [build_model(model_name, sync_bn=comm) for comm in comms]
        self.flats = [attach_flat_grad(list(m.parameters())) for m in self.replicas]

    @torch.no_grad()
    def load(self, model: torch.nn.Module) -> None:
        for replica in self.replicas:
            for dst, src in zip(replica.parameters(), model.parameters()):
                dst.copy_(src)

    def gradient(self, r: int, items: list) -> torch.Tensor:
        """Replica r's gradient on these utterances (a copy)."""
        model, flat = self.replicas[r], self.flats[r]
        flat.zero_()
        batch = collate(items)
        log_probs, lengths = model(batch.features, batch.feature_lengths)
        loss = batch_loss(log_probs, lengths, batch)
        loss.backward()
        return flat.clone()

    def __call__(self, items: list, ranks: list[int]) -> dict[int, list[torch.Tensor]]:
        """{P: the P ranks' gradients} for every P of `ranks`."""
        if not self.sync_bn:
            return {P: [self.gradient(0, shard) for shard in shards(items, P)] for P in ranks}
        cut = shards(items, self.finest)
        finest = self.group.run(lambda comm: self.gradient(comm.rank, cut[comm.rank]))
        out = {}
        for P in ranks:
            step = self.finest // P
            out[P] = finest if step == 1 else [mean(finest[r * step:(r + 1) * step]) for r in range(P)]
        return out


def flat_momentum(optimizer: MomentumSGD, params: list[torch.nn.Parameter]) -> torch.Tensor:
    """The optimizer's momentum buffers as one flat vector (zeros before its first step)."""
    parts = []
    for p in params:
        buffer = optimizer.state.get(p, {}).get("momentum_buffer")
        parts.append((buffer if buffer is not None else torch.zeros_like(p)).flatten())
    return torch.cat(parts)
