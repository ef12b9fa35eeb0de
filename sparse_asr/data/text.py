"""Character labels for CTC (DESIGN 5): blank at index 0, space last, and greedy decoding."""
from __future__ import annotations

import torch

LABELS = "_'ABCDEFGHIJKLMNOPQRSTUVWXYZ "
BLANK = 0
NUM_CLASSES = len(LABELS)  # 29
_INDEX = {c: i for i, c in enumerate(LABELS)}
# A label or its ASCII lower case: str.upper() would fold 'ß' to 'SS', 'ﬁ' to 'FI' and the dotless 'ı' to 'I'
# and train on text the transcript never said.
_INDEX.update({c.lower(): i for c, i in list(_INDEX.items()) if c.isascii() and c.isalpha()})


def text_to_ids(text: str) -> list[int]:
    """Map each character of `text` (upper or lower case) to its label index. The blank symbol '_' is not a
    character a transcript may contain, nor is anything outside the labels (named, never folded)."""
    ids = []
    for position, char in enumerate(text):
        index = _INDEX.get(char)
        if index is None or index == BLANK:
            raise ValueError(f"character {char!r} at position {position} of {text!r} is not one of the labels "
                             f"{LABELS[1:]!r}")
        ids.append(index)
    return ids


def transcript_problem(text: str) -> str | None:
    """Why a transcript cannot be trained on (a character outside the labels, or nothing), or None."""
    try:
        return None if text_to_ids(text) else "empty transcript"
    except ValueError as e:
        return str(e)


def ids_to_text(ids) -> str:
    """Label indices (list or 1-D tensor) -> string. Blanks are kept as '_' (no CTC collapsing here)."""
    out = []
    for i in ids:
        i = int(i)
        if not 0 <= i < NUM_CLASSES:
            raise ValueError(f"label index {i} is outside 0..{NUM_CLASSES - 1}")
        out.append(LABELS[i])
    return "".join(out)


def greedy_decode(log_probs: torch.Tensor, lengths: torch.Tensor) -> list[str]:
    """Best-path CTC decoding: argmax per frame, collapse repeats, drop blanks.
    log_probs: (T, B, C); lengths: (B,) valid frames per utterance. Leading/trailing spaces are
    stripped and runs of spaces squeezed so the result compares word-by-word with a transcript."""
    if log_probs.dim() != 3:
        raise ValueError(f"log_probs must be (T, B, C), got shape {tuple(log_probs.shape)}")
    best = log_probs.argmax(dim=2).t().cpu()  # (B, T)
    texts = []
    for b, length in enumerate(lengths.tolist()):
        path = best[b, : int(length)].tolist()
        chars, previous = [], None
        for index in path:
            if index != previous and index != BLANK:
                chars.append(LABELS[index])
            previous = index
        texts.append(" ".join("".join(chars).split()))
    return texts
