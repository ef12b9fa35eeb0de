"""Decoding a model's CTC log-probabilities into words: greedy best path, or a beam with a lexicon and an n-gram
LM built from the training transcripts (DESIGN 7).

    decoder = make_decoder("beam", lm="auto", train_manifest="manifests/an4_train.csv")
    texts = decoder.decode(log_probs, lengths)     # (T, B, C), (B,) -> B strings; decoder.name says which
"""
from __future__ import annotations

from pathlib import Path

from sparse_asr.decoding.decoders import BeamDecoder, BeamSettings, GreedyDecoder, decode_each
from sparse_asr.decoding.lm import DEFAULT_ORDER, lm_dir_for, lm_files, read_json

DECODERS = ("greedy", "beam")
__all__ = ["BeamDecoder", "BeamSettings", "GreedyDecoder", "decode_each", "make_decoder", "resolve_lm",
           "settings_for"]


def resolve_lm(lm: str, train_manifest: str | Path | None, order: int = DEFAULT_ORDER) -> Path | None:
    """The LM directory `lm` names: "none" -> None; "auto" -> built from `train_manifest`; else a directory
    holding lexicon.txt and lm.arpa, or the lm.arpa itself."""
    if lm == "none":
        return None
    if lm == "auto":
        if train_manifest is None:
            raise ValueError("--lm auto needs the training manifest to build the lexicon and LM from")
        return lm_dir_for(train_manifest, order)
    path = Path(lm)
    lm_dir = path.parent if path.suffix == ".arpa" else path
    lm_files(lm_dir)  # both files there, neither a link
    return lm_dir


def settings_for(lm_dir: Path | None, beam_size=None, lm_weight=None, word_score=None) -> tuple[BeamSettings, str]:
    """The beam's settings: those given, else the LM directory's tuned.json (tuned on a dev set), else the
    defaults; and a line saying where they came from."""
    tuned, source = {}, "defaults"
    if lm_dir is not None and (lm_dir / "tuned.json").is_file():
        tuned = read_json(lm_dir / "tuned.json")["best"]
        source = f"tuned on {read_json(lm_dir / 'tuned.json').get('tuned_on', 'a dev set')}: {lm_dir / 'tuned.json'}"
    defaults = BeamSettings()
    chosen = BeamSettings(
        beam_size=int(beam_size if beam_size is not None else tuned.get("beam_size", defaults.beam_size)),
        lm_weight=float(lm_weight if lm_weight is not None else tuned.get("lm_weight", defaults.lm_weight)),
        word_score=float(word_score if word_score is not None else tuned.get("word_score", defaults.word_score)))
    return chosen, source


def make_decoder(kind: str = "greedy", lm: str = "auto", train_manifest: str | Path | None = None,
                 order: int = DEFAULT_ORDER, beam_size=None, lm_weight=None, word_score=None, log=None):
    """A decoder by name (DECODERS). For "beam", `lm` is "none" (lexicon-free, no LM), "auto" or a path
    (resolve_lm); settings not given come from the LM's tuned.json or the defaults (settings_for)."""
    if kind == "greedy":
        return GreedyDecoder()
    if kind != "beam":
        raise ValueError(f"decoder must be one of {', '.join(DECODERS)}, got {kind!r}")
    lm_dir = resolve_lm(lm, train_manifest, order)
    settings, source = settings_for(lm_dir, beam_size, lm_weight, word_score)
    if log is not None:
        log(f"beam settings ({source}): beam {settings.beam_size}, lm_weight {settings.lm_weight:g}, "
            f"word_score {settings.word_score:g}" + (f"; LM {lm_dir}" if lm_dir else "; no lexicon, no LM"))
    if lm_dir is None:
        return BeamDecoder(settings)
    lexicon, arpa = lm_files(lm_dir)
    meta = read_json(lm_dir / "lm.json") if (lm_dir / "lm.json").is_file() else {}
    label = f"{meta['order']}-gram LM" if "order" in meta else "n-gram LM"
    return BeamDecoder(settings, lexicon, arpa, label)
