"""Is an input like what the model was trained on? Warnings, each naming the file, for audio whose duration lies far
outside the training manifest's range, that had to be converted (another sample rate, several channels), or that is
near-silent. A model decodes such input all the same, into words that mean little; the warning says why.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import soundfile
import torch

from sparse_asr.data.manifest import read_manifest

FAR = 2.0  # "far outside": longer than twice the longest training utterance, or shorter than half the shortest
SILENT_DBFS = -60.0  # AN4's utterances lie between about -42 and -26 dBFS RMS


@dataclass(frozen=True)
class TrainingRange:
    shortest: float  # seconds
    longest: float

    @classmethod
    def of(cls, train_manifest) -> "TrainingRange":
        durations = read_manifest(train_manifest)["duration"]
        return cls(float(durations.min()), float(durations.max()))

    def duration_problem(self, seconds: float) -> str | None:
        if seconds > FAR * self.longest or seconds < self.shortest / FAR:
            return (f"{seconds:.1f} s long, far outside the training utterances' {self.shortest:.1f}-"
                    f"{self.longest:.1f} s")
        return None


def rms_dbfs(wave: torch.Tensor) -> float:
    power = float(wave.double().pow(2).mean()) if wave.numel() else 0.0
    return 10 * math.log10(power) if power > 0 else -math.inf


def level_problem(wave: torch.Tensor) -> str | None:
    level = rms_dbfs(wave)
    return f"near-silent (RMS {level:.0f} dBFS; training audio is above -45)" if level < SILENT_DBFS else None


def load_converted(path: str, sample_rate: int = 16000) -> tuple[torch.Tensor, str | None]:
    """Any audio file soundfile reads as mono float32 at `sample_rate`, and what had to be converted (or None)."""
    import torchaudio.functional as F

    from sparse_asr.data.audio import AudioError

    try:
        wave, rate = soundfile.read(path, dtype="float32", always_2d=True)
    except (OSError, RuntimeError, ValueError) as e:  # soundfile's errors are RuntimeErrors
        raise AudioError(f"{path}: cannot read audio ({e})") from None
    if not np.isfinite(wave).all() or not len(wave):
        raise AudioError(f"{path}: no samples, or non-finite ones")
    notes = []
    if wave.shape[1] != 1:
        notes.append(f"{wave.shape[1]} channels averaged to mono")
    mono = torch.from_numpy(wave.mean(axis=1))
    if rate != sample_rate:
        notes.append(f"resampled from {rate} Hz to {sample_rate} Hz")
        mono = F.resample(mono, rate, sample_rate)
    return mono, ("; ".join(notes) or None)


def input_warnings(path: str, wave: torch.Tensor, sample_rate: int, training: TrainingRange | None,
                   converted: str | None = None) -> list[str]:
    """Every reason to distrust the decoding of one input, each as '<path>: <reason>'."""
    problems = [converted, level_problem(wave),
                training.duration_problem(wave.numel() / sample_rate) if training else None]
    return [f"{path}: {p}" for p in problems if p]
