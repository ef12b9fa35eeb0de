"""The decoders, behind one interface: `decoder.decode(log_probs (T, B, C), lengths (B,)) -> list[str]`, and
`decoder.name`, which every reported score carries.

- GreedyDecoder: best path (argmax per frame, repeats collapsed, blanks dropped; data/text.greedy_decode).
- BeamDecoder: torchaudio's CTC beam search (flashlight-text's decoder, KenLM bundled): lexicon-free without a
  lexicon, else restricted to the lexicon's words, scored with an ARPA n-gram when one is given:
  score = acoustic log-prob + lm_weight * log10 P_LM + word_score * words.
"""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

from sparse_asr.data.text import LABELS, greedy_decode

# The beam decoder's token names, index for index with data/text.LABELS: blank, apostrophe, A-Z, word boundary.
TOKENS = ["-", *LABELS[1:-1], "|"]
TIE_BREAK = 1e-4  # nats: far below the emissions' 1/16 nat step, so it only decides exact ties
MISSING = ("beam decoding needs the flashlight-text package (pinned in requirements.txt): run bash scripts/setup.sh "
           "or .venv/bin/pip install flashlight-text==0.0.7")


@dataclass(frozen=True)
class BeamSettings:
    """The beam's size and how the LM's score and each word are weighed (tuned on dev: decoding/tune.py). The
    defaults are the grid's best on the dev sets of two dense verdict runs, pooled (docs/results.md)."""

    beam_size: int = 64
    lm_weight: float = 1.5
    word_score: float = 2.0

    def __post_init__(self):
        if int(self.beam_size) < 1:
            raise ValueError(f"beam size must be >= 1, got {self.beam_size}")


class GreedyDecoder:
    name = "greedy"

    def decode(self, log_probs: torch.Tensor, lengths: torch.Tensor) -> list[str]:
        return greedy_decode(log_probs, lengths)


class BeamDecoder:
    """CTC beam search. lexicon None: lexicon-free (any character sequence), and `lm` must be None too."""

    def __init__(self, settings: BeamSettings = BeamSettings(), lexicon: str | Path | None = None,
                 lm: str | Path | None = None, lm_label: str = "n-gram LM"):
        if lm is not None and lexicon is None:
            raise ValueError("a word language model needs a lexicon")
        ctc_decoder = import_ctc_decoder()
        self.settings, self.lexicon, self.lm = settings, lexicon, lm
        with kenlm_quiet():
            self._decoder = ctc_decoder(lexicon=None if lexicon is None else str(lexicon), tokens=TOKENS,
                                        lm=None if lm is None else str(lm), beam_size=int(settings.beam_size),
                                        lm_weight=float(settings.lm_weight), word_score=float(settings.word_score),
                                        blank_token="-", sil_token="|", unk_word="<unk>")
        if lexicon is None:
            self.name = f"beam {settings.beam_size}"
        elif lm is None:
            self.name = f"beam {settings.beam_size} + lexicon (word_score {settings.word_score:g})"
        else:
            self.name = (f"beam {settings.beam_size} + lexicon + {lm_label} (lm_weight {settings.lm_weight:g}, "
                         f"word_score {settings.word_score:g})")

    def decode(self, log_probs: torch.Tensor, lengths: torch.Tensor) -> list[str]:
        if log_probs.dim() != 3:
            raise ValueError(f"log_probs must be (T, B, C), got shape {tuple(log_probs.shape)}")
        emissions = log_probs.detach().to("cpu", torch.float32).transpose(0, 1)  # (B, T, C)
        emissions = emissions.clone(memory_format=torch.contiguous_format)  # ours: break_ties writes into it
        lengths = lengths.detach().cpu().to(torch.int32)
        for b, length in enumerate(lengths.tolist()):
            break_ties(emissions[b, :length])
        hypotheses = self._decoder(emissions, lengths)
        texts = []
        for best in hypotheses:
            if not best:
                texts.append("")
            elif self.lexicon is not None:
                texts.append(" ".join(w for w in best[0].words if w))
            else:
                chars = "".join(self._decoder.idxs_to_tokens(best[0].tokens)).replace("-", "").replace("|", " ")
                texts.append(" ".join(chars.split()))
        return texts


@contextlib.contextmanager
def kenlm_quiet():
    """Hold back what KenLM writes to the process's stderr while it loads an ARPA file (a progress bar per
    decoder built); shown after all if the load fails."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            held.seek(0)
            sys.stderr.write(held.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def break_ties(emission: torch.Tensor) -> None:
    """Add (in place) at most TIE_BREAK nats of noise seeded by the emission's own bytes. flashlight's beam orders
    hypotheses of equal score by chance (the same emission decoded twice could give two texts), and emissions kept
    as bytes (training/emissions.py: steps of 1/16 nat) tie often; so perturbed, frames no longer tie. Not every
    choice is then fixed: with the lexicon at lm_weight 0 and beam 16, one utterance of a kept run still decodes to
    two texts in one process, the same decoder called again (flashlight orders some equal-scored hypotheses by
    memory address); bench/decoder_table.py decodes twice and shows both."""
    seed = zlib.crc32(emission.numpy().tobytes())
    emission += TIE_BREAK * torch.rand(emission.shape, generator=torch.Generator().manual_seed(seed))


def import_ctc_decoder():
    """torchaudio's ctc_decoder, or an ImportError that says how to install what it needs."""
    try:
        import flashlight.lib.text.decoder  # noqa: F401 -- what torchaudio's decoder imports
        from torchaudio.models.decoder import ctc_decoder
    except (ImportError, RuntimeError) as e:
        raise ImportError(f"{MISSING} ({e})") from None
    return ctc_decoder


def decode_each(decoder, log_probs: list[torch.Tensor]) -> list[str]:
    """Decode a list of (T_i, C) log-probabilities (an emissions file's), one utterance at a time."""
    return [decoder.decode(lp[:, None], torch.tensor([lp.shape[0]]))[0] for lp in log_probs]
