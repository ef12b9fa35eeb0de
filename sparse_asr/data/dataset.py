"""Speech dataset, padding collate and the distributed bucketing sampler (DESIGN 2, step 1-2)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch.utils.data import DataLoader

from sparse_asr.data.audio import AudioError, FeatureExtractor, SpecAugment, load_audio
from sparse_asr.data.manifest import ManifestError, read_manifest
from sparse_asr.data.text import text_to_ids, transcript_problem


# Last word of the augmentation generators' seed: numpy pads short seed lists with zeros, so without
# it item 0's [seed, epoch, 0] would give the same stream as the sampler's [seed, epoch] shuffle.
AUGMENT_STREAM = 0x5EC


class SpeechDataset(torch.utils.data.Dataset):
    """Utterances of a manifest (path or DataFrame from read_manifest). Item i is
    (features (bins, T) float32, target LongTensor of label ids, i). Transcripts are encoded once
    up front, so a bad character is reported at construction, naming the manifest line.

    `augment` (training sets only) masks the features of item i in epoch e with a generator seeded
    by (seed, e, i): the masks do not depend on the order items are read in, the DataLoader
    workers, the rank, or where a resumed run starts, and they never touch the global RNGs. The
    trainer calls set_epoch(e) before each epoch, as it does for the sampler."""

    def __init__(self, manifest, features: FeatureExtractor | None = None, augment: SpecAugment | None = None,
                 seed: int = 0, cache: bool = False, cache_device: str | torch.device = "cpu"):
        df = manifest if isinstance(manifest, pd.DataFrame) else read_manifest(manifest)
        self.source = df.attrs.get("manifest", "<DataFrame>")
        self.features = features if features is not None else FeatureExtractor()
        self.augment = augment if augment is not None and augment.enabled else None
        self.seed, self.epoch = seed, 0
        # cache: each utterance's clean features kept after their first computation (masks are drawn on a copy),
        # so later epochs read no audio and run no STFT. In this process only (data.num_workers must be 0). On
        # cache_device: on a GPU, batches are then padded and masked there and nothing crosses the PCIe bus.
        self.cache: dict[int, torch.Tensor] | None = {} if cache else None
        self.cache_device = torch.device(cache_device)
        self.audio = df["audio"].tolist()
        self.durations = df["duration"].to_numpy(dtype=float)
        self.transcripts = df["transcript"].tolist()
        self.utt_ids = df["utt_id"].tolist()
        lines = self.lines = df["line"].tolist() if "line" in df.columns else [f"row {i}" for i in range(len(df))]
        self.targets, problems = [], []
        for line, utt_id, transcript in zip(lines, self.utt_ids, self.transcripts):
            problem = transcript_problem(transcript)
            if problem is not None:
                problems.append(f"{self.source}:{line} ({utt_id}): {problem}")
                continue
            self.targets.append(torch.tensor(text_to_ids(transcript), dtype=torch.long))
        if problems:  # every bad row at once: a user fixes them in one pass
            raise ManifestError(f"{len(problems)} of {len(lines)} rows have transcripts that cannot be trained on:\n"
                                + "\n".join(f"  {p}" for p in problems))

    def __len__(self) -> int:
        return len(self.audio)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose augmentation masks items get (no effect without `augment`)."""
        self.epoch = epoch

    def __getitem__(self, i: int):
        feats = self.cache.get(i) if self.cache is not None else None
        if feats is None:
            wave = load_audio(self.audio[i], self.features.sample_rate)
            try:
                feats = self.features(wave)
            except ValueError as e:
                raise AudioError(f"{self.audio[i]}: {e}") from None
            if self.cache is not None:
                feats = self.cache[i] = feats.to(self.cache_device)
        if self.augment is not None:
            feats = self.augment(feats, np.random.default_rng([self.seed, self.epoch, i, AUGMENT_STREAM]))
        return feats, self.targets[i], i


@dataclass
class Batch:
    """A padded batch, longest utterance first (packed LSTM sequences need that order)."""

    features: torch.Tensor  # (B, 1, bins, Tmax), zero-padded
    feature_lengths: torch.Tensor  # (B,) int64 frames
    targets: torch.Tensor  # (sum of target_lengths,) int64, concatenated in batch order
    target_lengths: torch.Tensor  # (B,) int64
    indices: list[int]  # dataset positions, in batch order

    def __len__(self) -> int:
        return len(self.indices)

    def to(self, device, non_blocking: bool = False) -> "Batch":
        move = lambda t: t.to(device, non_blocking=non_blocking)  # noqa: E731
        return Batch(move(self.features), move(self.feature_lengths), move(self.targets), move(self.target_lengths),
                     self.indices)

    def pin_memory(self) -> "Batch":  # called by DataLoader(pin_memory=True)
        return Batch(self.features.pin_memory(), self.feature_lengths.pin_memory(), self.targets.pin_memory(),
                     self.target_lengths.pin_memory(), self.indices)


def collate(batch) -> Batch:
    """[(features (bins, T), target, index), ...] -> Batch sorted by T descending (stable)."""
    batch = sorted(batch, key=lambda item: item[0].shape[1], reverse=True)
    bins, t_max = batch[0][0].shape[0], batch[0][0].shape[1]
    features = torch.zeros(len(batch), 1, bins, t_max, device=batch[0][0].device)
    for b, (feats, _, _) in enumerate(batch):
        features[b, 0, :, : feats.shape[1]] = feats
    return Batch(
        features=features,
        feature_lengths=torch.tensor([item[0].shape[1] for item in batch], dtype=torch.long),
        targets=torch.cat([item[1] for item in batch]),
        target_lengths=torch.tensor([len(item[1]) for item in batch], dtype=torch.long),
        indices=[int(item[2]) for item in batch],
    )


class BucketingSampler(torch.utils.data.Sampler):
    """Batch sampler giving THIS rank its share of length-bucketed global batches.

    Each epoch: sort utterances by duration (ties by index), cut into global batches of
    `global_batch_size` neighbours, shuffle the order of the global batches with a generator seeded
    by (seed, epoch) -- the same on every rank -- and give rank r the r-th contiguous slice of each.

    SortaGrad (DeepSpeech 2, Amodei et al. 2016, section 3.1): epochs below `sorted_epochs` run their global
    batches shortest first instead of shuffled. Short utterances give CTC small, well-conditioned
    gradients while the network is still random, which helps it leave the all-blank plateau early.

    drop_last=True (training): every rank yields the same number of equal batches. The
    n % global_batch_size utterances left over are dropped; with shuffle they are a different random
    subset each epoch (so no utterance is never trained on), without shuffle the longest ones.
    drop_last=False (evaluation): every utterance is yielded exactly once over all ranks; the last,
    smaller global batch is split as evenly as possible, so ranks may yield different counts.
    """

    def __init__(self, durations, global_batch_size: int, rank: int = 0, world_size: int = 1,
                 seed: int = 0, shuffle: bool = True, drop_last: bool = True, sorted_epochs: int = 0):
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in 0..{world_size - 1} (world_size {world_size})")
        if global_batch_size < 1 or global_batch_size % world_size:
            raise ValueError(f"global_batch_size {global_batch_size} must be a positive multiple of world_size "
                             f"{world_size}")
        self.durations = np.asarray(durations, dtype=float)
        if drop_last and len(self.durations) < global_batch_size:
            raise ValueError(f"only {len(self.durations)} utterances: not one full global batch of {global_batch_size} "
                             "(drop_last=True)")
        self.global_batch_size = global_batch_size
        self.rank, self.world_size = rank, world_size
        if sorted_epochs < 0:
            raise ValueError(f"sorted_epochs must be >= 0, got {sorted_epochs}")
        self.seed, self.shuffle, self.drop_last, self.sorted_epochs = seed, shuffle, drop_last, sorted_epochs
        self.epoch, self.start_batch = 0, 0

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Select the epoch (reshuffles) and, to resume mid-epoch, skip its first `start_batch` batches."""
        if start_batch < 0:
            raise ValueError(f"start_batch must be >= 0, got {start_batch}")
        self.epoch, self.start_batch = epoch, start_batch

    def global_batches(self) -> list[np.ndarray]:
        """This epoch's global batches (dataset indices), in the order they will be run."""
        n, size = len(self.durations), self.global_batch_size
        rng = np.random.default_rng([self.seed, self.epoch])
        keep = np.arange(n)
        if self.drop_last and n % size:
            if self.shuffle:
                keep = np.sort(rng.permutation(n)[: n - n % size])
            else:
                keep = np.argsort(self.durations, kind="stable")[: n - n % size]
        order = keep[np.argsort(self.durations[keep], kind="stable")]
        batches = [order[i:i + size] for i in range(0, len(order), size)]
        if self.shuffle and self.epoch >= self.sorted_epochs:
            batches = [batches[j] for j in rng.permutation(len(batches))]
        return batches

    def _rank_batches(self) -> list[list[int]]:
        shares = [np.array_split(batch, self.world_size)[self.rank] for batch in self.global_batches()]
        return [share.tolist() for share in shares if len(share)]

    @property
    def batches_per_epoch(self) -> int:
        """Batches this rank runs in a whole epoch (ignoring start_batch)."""
        return len(self._rank_batches())

    def __len__(self) -> int:
        return max(0, self.batches_per_epoch - self.start_batch)

    def __iter__(self):
        yield from self._rank_batches()[self.start_batch:]


@dataclass
class TrainingData:
    """A run's datasets and this rank's sampler of the training set."""

    train: SpeechDataset
    dev: SpeechDataset | None
    test: SpeechDataset | None
    sampler: BucketingSampler


def make_loader(dataset: SpeechDataset, sampler: BucketingSampler, num_workers: int = 0,
                pin_memory: bool = False) -> DataLoader:
    """DataLoader that runs `sampler`'s batches through `collate`. Batches of a dataset cached on a GPU are
    there already (pinning is for host memory only)."""
    on_host = dataset.cache is None or dataset.cache_device.type == "cpu"
    return DataLoader(dataset, batch_sampler=sampler, num_workers=num_workers, collate_fn=collate,
                      pin_memory=pin_memory and on_host, persistent_workers=False)


def feature_bytes(dataset: SpeechDataset) -> int:
    """float32 bytes of every utterance's features (what a full cache holds)."""
    f = dataset.features
    return sum(4 * f.num_bins * f.num_frames(round(d * f.sample_rate)) for d in dataset.durations)
