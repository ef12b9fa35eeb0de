"""Audio loading (soundfile: WAV and NIST SPHERE), spectrogram features and their training augmentation (DESIGN 6)."""
from __future__ import annotations

import os
import struct

import numpy as np
import soundfile
import torch
import torchaudio


class AudioError(ValueError):
    """An audio file that cannot be used as it is; the message names the file."""


def _declared_frames(head: bytes, info) -> int | None:
    """Frames the file's header (its first bytes, `head`) promises, for the two formats we meet (NIST
    SPHERE, RIFF WAV); None when unknown. libsndfile counts the frames actually present, so comparing
    with this is how a cut-off file is caught."""
    if head.startswith(b"NIST_1A"):
        for line in head.split(b"\n"):
            parts = line.split()
            if len(parts) == 3 and parts[0] == b"sample_count":
                return int(parts[2])
        return None
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE" and info.subtype.startswith("PCM_"):
        offset = 12
        while offset + 8 <= len(head):  # walk the chunks to the data chunk
            chunk, size = head[offset:offset + 4], struct.unpack("<I", head[offset + 4:offset + 8])[0]
            if chunk == b"data":
                bytes_per_frame = int(info.subtype[4:]) // 8 * info.channels
                return None if size in (0, 0xFFFFFFFF) else size // bytes_per_frame  # 0/max: size unknown (streamed)
            offset += 8 + size + (size & 1)
    return None


WINDOW_MS = 20  # the features' analysis window; a file shorter than one is refused by audio_frames


def audio_frames(path, sample_rate: int = 16000) -> int:
    """Frames of a mono file at `sample_rate`, from its header alone (nothing is decoded, so a whole corpus
    is checked quickly). Raises AudioError naming the file if it does not exist or cannot be
    read, is not at `sample_rate`, has more than one channel (we do not resample or downmix silently:
    AN4 is 16 kHz mono, anything else is a mistake), is truncated, or holds no samples. This is THE
    check of an audio file: load_audio, the AN4 preparation and the trainer's manifest check use it."""
    path = str(path)
    if not os.path.isfile(path):
        raise AudioError(f"{path}: {'not a regular file' if os.path.exists(path) else 'file does not exist'}")
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
        info = soundfile.info(path)
        declared = _declared_frames(head, info)
    except OSError as e:
        raise AudioError(f"{path}: cannot open ({e.strerror or e})") from None
    except (RuntimeError, ValueError, struct.error) as e:  # soundfile's errors are RuntimeErrors
        raise AudioError(f"{path}: cannot read audio ({e})") from None
    if info.samplerate != sample_rate:
        raise AudioError(f"{path}: sample rate {info.samplerate} Hz, expected {sample_rate} Hz")
    if info.channels != 1:
        raise AudioError(f"{path}: {info.channels} channels, expected mono")
    if declared is not None and info.frames < declared:
        raise AudioError(f"{path}: truncated: header declares {declared} samples, file holds {info.frames}")
    if info.frames == 0:
        raise AudioError(f"{path}: no samples")
    shortest = int(round(sample_rate * WINDOW_MS / 1000))
    if info.frames < shortest:  # the features need one analysis window at least
        raise AudioError(f"{path}: {info.frames} samples ({info.frames / sample_rate:.3f} s), shorter than one "
                         f"{WINDOW_MS:g} ms analysis window: too short to compute features")
    return info.frames


def load_audio(path, sample_rate: int = 16000) -> torch.Tensor:
    """Samples of a mono file as float32 in [-1, 1], shape (samples,). Raises AudioError naming the
    file if audio_frames refuses it, or if it cannot be decoded or holds non-finite samples."""
    path = str(path)
    audio_frames(path, sample_rate)
    try:
        wave, _ = soundfile.read(path, dtype="float32", always_2d=False)
    except (OSError, RuntimeError, ValueError) as e:
        raise AudioError(f"{path}: cannot read audio ({e})") from None
    if not np.isfinite(wave).all():
        raise AudioError(f"{path}: non-finite samples")
    return torch.from_numpy(wave)


class FeatureExtractor:
    """Waveform -> normalised log magnitude spectrogram (n_fft // 2 + 1 = 161 bins, T frames).

    STFT with a Hamming window of `window_ms` (20 ms = 320 samples at 16 kHz), hop `hop_ms`
    (10 ms = 160), centred frames so T = 1 + samples // hop; magnitude (power 1), log1p, then
    mean 0 / std 1 over the whole utterance (as deepspeech.pytorch does)."""

    def __init__(self, sample_rate: int = 16000, window_ms: float = WINDOW_MS, hop_ms: float = 10):
        self.sample_rate = sample_rate
        self.n_fft = int(round(sample_rate * window_ms / 1000))
        self.hop_length = int(round(sample_rate * hop_ms / 1000))
        self.num_bins = self.n_fft // 2 + 1
        self.spectrogram = torchaudio.transforms.Spectrogram(
            n_fft=self.n_fft, win_length=self.n_fft, hop_length=self.hop_length,
            window_fn=torch.hamming_window, power=1)

    def num_frames(self, num_samples: int) -> int:
        return 1 + num_samples // self.hop_length

    def __call__(self, wave: torch.Tensor) -> torch.Tensor:
        if wave.dim() != 1:
            raise ValueError(f"expected a 1-D waveform, got shape {tuple(wave.shape)}")
        if wave.numel() <= self.n_fft // 2:  # the centred STFT reflect-pads n_fft // 2 samples
            raise ValueError(f"waveform of {wave.numel()} samples is too short (need more than {self.n_fft // 2})")
        with torch.no_grad():
            spec = torch.log1p(self.spectrogram(wave.float()))
            std = spec.std().clamp_min(1e-5)  # a silent (constant) input must not give NaN
            return (spec - spec.mean()) / std


class SpecAugment:
    """Frequency and time masking of normalised features (SpecAugment, Park et al. 2019, without
    time warping), for training only.

    `freq_masks` bands of width uniform in [0, freq_mask_width] bins and `time_masks` bands of width
    uniform in [0, min(time_mask_width, time_mask_max_fraction * T)] frames are set to 0, the
    utterance mean after normalisation; each band's start is uniform over the positions where it
    fits, and bands may overlap. 0 masks of both kinds = off.

    The caller passes the random generator, so that an item's masks can be a pure function of
    (seed, epoch, item): see SpeechDataset.set_epoch."""

    def __init__(self, freq_masks: int = 0, freq_mask_width: int = 15, time_masks: int = 0,
                 time_mask_width: int = 25, time_mask_max_fraction: float = 0.1):
        if freq_masks < 0 or time_masks < 0:
            raise ValueError(f"mask counts must be >= 0, got freq_masks={freq_masks}, time_masks={time_masks}")
        if freq_mask_width < 1 or time_mask_width < 1:
            raise ValueError(f"mask widths must be >= 1, got freq_mask_width={freq_mask_width}, "
                             f"time_mask_width={time_mask_width}")
        if not 0 < time_mask_max_fraction <= 1:
            raise ValueError(f"time_mask_max_fraction must be in (0, 1], got {time_mask_max_fraction}")
        self.freq_masks, self.freq_mask_width = freq_masks, freq_mask_width
        self.time_masks, self.time_mask_width = time_masks, time_mask_width
        self.time_mask_max_fraction = time_mask_max_fraction

    @property
    def enabled(self) -> bool:
        return self.freq_masks > 0 or self.time_masks > 0

    def __call__(self, feats: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
        """(bins, T) -> a masked copy of the same shape."""
        if feats.dim() != 2:
            raise ValueError(f"expected (bins, frames) features, got shape {tuple(feats.shape)}")
        bins, frames = feats.shape
        out = feats.clone()
        max_time_width = min(self.time_mask_width, int(self.time_mask_max_fraction * frames))
        for _ in range(self.freq_masks):
            start, width = _band(rng, bins, min(self.freq_mask_width, bins))
            out[start:start + width, :] = 0
        for _ in range(self.time_masks):
            start, width = _band(rng, frames, max_time_width)
            out[:, start:start + width] = 0
        return out


def _band(rng: np.random.Generator, size: int, max_width: int) -> tuple[int, int]:
    """(start, width): width uniform in [0, max_width], start uniform in [0, size - width]."""
    width = int(rng.integers(0, max_width + 1))
    return int(rng.integers(0, size - width + 1)), width
