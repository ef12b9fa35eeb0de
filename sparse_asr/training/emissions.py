"""A model's per-frame log-probabilities on a set ("emissions"), kept small enough to commit beside a run, so that a
later decoder (a beam, a language model) scores the same model without the checkpoint or a retraining.

    save_emissions(path, utt_ids, log_probs)   # log_probs: one (T_i, C) float tensor per utterance
    utt_ids, log_probs = load_emissions(path)  # the same order; float32, within STEP / 2 of what was saved

Each log-probability is kept as a byte: round(-log p / STEP), clipped at MAX_CODE (a floor of -10 nats, p below
4.5e-5: a symbol no beam keeps against a best one near 1). Clipped, most codes of a trained model are the floor: the
.npz holds a run's dev and test sets in about 150 kB (a float32 copy: 3.7 MB), small enough that every run of a
comparison travels with the checkout. Greedy decoding of the kept emissions equals the model's wherever a frame's
two best symbols differ by more than STEP.
Read with numpy's allow_pickle=False: a shared file is data, never code.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from sparse_asr.fileio import atomic_write

STEP = 1.0 / 16  # nats per code
MAX_CODE = 160  # -10 nats
FORMAT = 1


def save_emissions(path: str | Path, utt_ids: list[str], log_probs: list[torch.Tensor]) -> None:
    if len(utt_ids) != len(log_probs):
        raise ValueError(f"{len(utt_ids)} utterance ids for {len(log_probs)} emissions")
    classes = {int(lp.shape[1]) for lp in log_probs}
    if len(classes) > 1:
        raise ValueError(f"emissions of different widths {sorted(classes)}")
    lengths = np.array([lp.shape[0] for lp in log_probs], dtype=np.int32)
    flat = torch.cat([lp.detach().float().cpu() for lp in log_probs]) if log_probs else torch.zeros(0, 0)
    codes = torch.round(-flat / STEP).clamp_(0, MAX_CODE).to(torch.uint8).numpy()
    arrays = {"format": np.array(FORMAT), "step": np.array(STEP), "utt_ids": np.array(utt_ids, dtype=str),
              "lengths": lengths, "codes": codes}
    atomic_write(path, lambda f: np.savez_compressed(f, **arrays))


def load_emissions(path: str | Path) -> tuple[list[str], list[torch.Tensor]]:
    """The utterance ids and (T_i, C) float32 log-probabilities of an emissions file; a file of another shape or
    version is refused by name."""
    with np.load(path, allow_pickle=False) as data:
        missing = {"format", "step", "utt_ids", "lengths", "codes"} - set(data.files)
        if missing or int(data["format"]) != FORMAT:
            raise ValueError(f"{path}: not an emissions file of format {FORMAT} (missing {sorted(missing)})")
        step, utt_ids, lengths, codes = float(data["step"]), data["utt_ids"].tolist(), data["lengths"], data["codes"]
    if codes.ndim != 2 or int(lengths.sum()) != codes.shape[0] or len(utt_ids) != len(lengths):
        raise ValueError(f"{path}: {len(utt_ids)} ids and {lengths.sum()} frames for codes of shape {codes.shape}")
    log_probs = torch.from_numpy(codes.astype(np.float32) * -step)
    return utt_ids, list(torch.split(log_probs, lengths.tolist()))
