"""Word and character error rates (DESIGN 7), accumulated as raw sums so ranks can allreduce them.

Conventions:
- Whitespace is normalised (split / join on single spaces); case is kept as given.
- CER counts spaces as characters, in the reference length and in the edits.
- WER (corpus) = total word edits / total reference words; CER likewise for characters.
- wer_utt_mean = mean over utterances of edits / reference words. An utterance with an empty
  reference scores 0 if its hypothesis is empty too, else 1 (it is all wrong, and counting
  its inserted words instead would let one empty reference dominate the mean). Such an
  utterance adds its inserted words to the corpus WER numerator and 0 to its denominator.
- A metric whose denominator is 0 is absent from summary(): never NaN, never an error.
"""
from dataclasses import dataclass, fields

import Levenshtein
import torch


def word_errors(ref: str, hyp: str):
    """-> (word edit distance, number of reference words)."""
    ref_words, hyp_words = ref.split(), hyp.split()
    # Map each distinct word to one character so the C edit distance counts whole-word edits.
    code = {}
    for word in ref_words + hyp_words:
        code.setdefault(word, chr(len(code)))
    ref_coded = "".join(code[w] for w in ref_words)
    hyp_coded = "".join(code[w] for w in hyp_words)
    return Levenshtein.distance(ref_coded, hyp_coded), len(ref_words)


def char_errors(ref: str, hyp: str):
    """-> (character edit distance, number of reference characters), spaces included."""
    ref, hyp = " ".join(ref.split()), " ".join(hyp.split())
    return Levenshtein.distance(ref, hyp), len(ref)


@dataclass
class ErrorCounts:
    word_edits: int = 0
    words: int = 0
    char_edits: int = 0
    chars: int = 0
    utt_wer_sum: float = 0.0
    utts: int = 0
    loss_sum: float = 0.0
    loss_count: int = 0

    def add(self, ref: str, hyp: str):
        """Score one utterance."""
        word_edits, words = word_errors(ref, hyp)
        char_edits, chars = char_errors(ref, hyp)
        self.word_edits += word_edits
        self.words += words
        self.char_edits += char_edits
        self.chars += chars
        if words > 0:
            self.utt_wer_sum += word_edits / words
        else:
            self.utt_wer_sum += 0.0 if word_edits == 0 else 1.0
        self.utts += 1
        return self

    def add_loss(self, loss_sum: float, count: int):
        """Add a summed loss over `count` utterances (e.g. CTC reduction='sum' of one batch)."""
        self.loss_sum += float(loss_sum)
        self.loss_count += int(count)
        return self

    def merge(self, other: "ErrorCounts"):
        """Add other's sums into self (in place); returns self."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self

    def __add__(self, other: "ErrorCounts"):
        return ErrorCounts().merge(self).merge(other)

    def to_tensor(self) -> torch.Tensor:
        """The raw sums as a float64 tensor (exact for counts below 2^53), ready for allreduce SUM."""
        return torch.tensor([float(getattr(self, f.name)) for f in fields(self)], dtype=torch.float64)

    @classmethod
    def from_tensor(cls, t: torch.Tensor) -> "ErrorCounts":
        names = [f.name for f in fields(cls)]
        values = t.detach().cpu().to(torch.float64).reshape(-1).tolist()
        if len(values) != len(names):
            raise ValueError(f"ErrorCounts.from_tensor: expected {len(names)} values ({', '.join(names)}), "
                             f"got {len(values)}")
        kwargs = {}
        for f, value in zip(fields(cls), values):
            kwargs[f.name] = int(round(value)) if f.type in (int, "int") else value
        return cls(**kwargs)

    def summary(self) -> dict:
        """wer, cer, wer_utt_mean, loss; each only when its denominator is non-zero."""
        out = {}
        if self.words > 0:
            out["wer"] = self.word_edits / self.words
        if self.chars > 0:
            out["cer"] = self.char_edits / self.chars
        if self.utts > 0:
            out["wer_utt_mean"] = self.utt_wer_sum / self.utts
        if self.loss_count > 0:
            out["loss"] = self.loss_sum / self.loss_count
        return out
