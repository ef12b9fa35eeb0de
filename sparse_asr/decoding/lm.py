"""The lexicon and the n-gram language model of a training manifest, built once into a directory:

    lm/an4_train-3gram/
        lexicon.txt   one line per training word: WORD W O R D |   (the characters, then the word boundary)
        lm.arpa       interpolated Witten-Bell n-gram (decoding/ngram.py), log10, for KenLM
        lm.json       what it was built from: the manifest, the SHA-256 of its transcripts, order, counts
        tuned.json    (written by decoding/tune.py) the beam settings tuned on a dev set, with the grid

Only the TRAINING manifest's transcripts are read: a word only dev or test holds is outside the lexicon and the
LM, as it would be for a new user's speech. `lm_dir_for` rebuilds when the transcripts or the order change.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from sparse_asr.data.manifest import read_manifest
from sparse_asr.data.text import LABELS
from sparse_asr.decoding.ngram import WittenBell
from sparse_asr.fileio import atomic_write_text, open_regular, read_text, trusted_path

DEFAULT_ORDER = 3
DEFAULT_ROOT = Path("lm")
BOUNDARY = "|"  # the word boundary token (the space label)
FILES = ("lexicon.txt", "lm.arpa", "lm.json")
RECORD_LIMIT = 1 << 20  # lm.json, tuned.json: small records


def training_sentences(train_manifest: str | Path) -> tuple[list[list[str]], str]:
    """The training transcripts as word lists, and the SHA-256 of their text (what a rebuild checks)."""
    transcripts = [" ".join(str(t).upper().split()) for t in read_manifest(train_manifest)["transcript"]]
    digest = hashlib.sha256("\n".join(transcripts).encode()).hexdigest()
    return [t.split() for t in transcripts], digest


def spelling(word: str) -> list[str]:
    """The tokens of `word` in the lexicon: its characters, then the boundary; a character outside the labels
    raises (it could never be emitted)."""
    bad = [c for c in word if c not in LABELS[1:-1]]
    if bad:
        raise ValueError(f"word {word!r} has characters {bad} outside the model's labels")
    return [*word, BOUNDARY]


def build_lm(train_manifest: str | Path, out_dir: str | Path, order: int = DEFAULT_ORDER) -> Path:
    """Write lexicon.txt, lm.arpa and lm.json of `train_manifest` into `out_dir` (each file atomic)."""
    sentences, digest = training_sentences(train_manifest)
    return write_lm(sentences, out_dir, order, {"train_manifest": str(train_manifest), "transcripts_sha256": digest})


def write_lm(sentences: list[list[str]], out_dir: str | Path, order: int = DEFAULT_ORDER, meta: dict | None = None):
    """The lexicon and ARPA n-gram of `sentences` (word lists) into `out_dir`, with lm.json (`meta` + counts)."""
    out_dir = Path(out_dir)
    model = WittenBell(sentences, order)
    words = model.vocabulary()
    atomic_write_text(out_dir / "lexicon.txt", "".join(f"{w} {' '.join(spelling(w))}\n" for w in words))
    atomic_write_text(out_dir / "lm.arpa", model.to_arpa())
    meta = {**(meta or {}), "order": order, "smoothing": "interpolated Witten-Bell", "sentences": len(sentences),
            "words": len(words), "ngrams": {n: len(model.ngrams(n)) for n in range(1, order + 1)}}
    atomic_write_text(out_dir / "lm.json", json.dumps(meta, indent=1) + "\n")
    return out_dir


def lm_dir_for(train_manifest: str | Path, order: int = DEFAULT_ORDER, root: str | Path = DEFAULT_ROOT) -> Path:
    """root/<manifest stem>-<order>gram, built or rebuilt when missing or when the transcripts changed."""
    out_dir = Path(root) / f"{Path(train_manifest).stem}-{order}gram"
    _, digest = training_sentences(train_manifest)
    try:
        meta = read_json(out_dir / "lm.json")
        fresh = meta.get("transcripts_sha256") == digest and meta.get("order") == order and all(
            (out_dir / name).is_file() for name in FILES)
    except (OSError, ValueError):
        fresh = False
    if not fresh:
        build_lm(train_manifest, out_dir, order)
        (out_dir / "tuned.json").unlink(missing_ok=True)  # tuned for another LM
    return out_dir


def lm_files(lm_dir: str | Path) -> tuple[Path, Path]:
    """(lexicon.txt, lm.arpa) of an LM directory, reached through trusted links only, neither file a link nor
    anything but a regular file (KenLM and the decoder open the paths themselves)."""
    lm_dir = trusted_path(lm_dir)
    paths = (lm_dir / "lexicon.txt", lm_dir / "lm.arpa")
    for path in paths:
        if not path.exists() and not path.is_symlink():
            raise FileNotFoundError(f"{path} does not exist: build it with python -m sparse_asr.decoding.tune "
                                    f"--lm auto, or give --lm a directory holding lexicon.txt and lm.arpa")
        open_regular(path, "LM file", follow=False).close()
    return paths


def read_json(path: str | Path) -> dict:
    value = json.loads(read_text(path, RECORD_LIMIT, "LM record", follow=False))
    if not isinstance(value, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return value
