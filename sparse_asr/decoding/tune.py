"""Tune the beam's lm_weight, word_score and size on a DEV set's emissions (never test), print the grid and save
it as tuned.json beside the LM, where make_decoder finds it.

    python -m sparse_asr.decoding.tune --emissions RUN/emissions_dev.npz [more.npz] --manifest manifests/an4_dev.csv \
        --lm auto [--train-manifest manifests/an4_train.csv] [--order 3]

Several emissions files (several runs' dev sets) are pooled: the settings chosen minimise their summed word edits.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

from sparse_asr.data.manifest import read_manifest
from sparse_asr.decoding import BeamDecoder, BeamSettings, decode_each, lm_files, resolve_lm
from sparse_asr.fileio import atomic_write_text
from sparse_asr.training.scoring import ErrorCounts

# lm_weight weighs log10 LM probabilities against the model's log-probabilities in nats; 0 is the lexicon alone
LM_WEIGHTS = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0)
WORD_SCORES = (-1.0, 0.0, 1.0, 2.0, 3.0)
BEAM_SIZES = (16, 64)


def references(manifest: str | Path, utt_ids: list[str]) -> list[str]:
    frame = read_manifest(manifest)
    by_id = dict(zip(frame["utt_id"], frame["transcript"]))
    missing = [u for u in utt_ids if u not in by_id]
    if missing:
        raise ValueError(f"{len(missing)} utterances of the emissions are not in {manifest} (first: {missing[0]})")
    return [by_id[u] for u in utt_ids]


def tune(sets: list[tuple[list, list[str]]], lm_dir: Path, lm_weights=LM_WEIGHTS, word_scores=WORD_SCORES,
         beam_sizes=BEAM_SIZES, log=print) -> tuple[dict, list[dict]]:
    """Every grid point's pooled WER over `sets` ((log-probs, references) pairs); -> (best, rows). Ties go to the
    smaller beam, then the smaller lm_weight, then the word_score nearer 0."""
    lexicon, arpa = lm_files(lm_dir)
    rows = []
    for beam, lm_weight, word_score in itertools.product(beam_sizes, lm_weights, word_scores):
        t0 = time.perf_counter()
        decoder = BeamDecoder(BeamSettings(beam, lm_weight, word_score), lexicon, arpa)
        counts = ErrorCounts()
        for log_probs, refs in sets:
            for ref, hyp in zip(refs, decode_each(decoder, log_probs)):
                counts.add(ref, hyp)
        row = {"beam_size": beam, "lm_weight": lm_weight, "word_score": word_score,
               "wer": round(counts.summary()["wer"], 5), "seconds": round(time.perf_counter() - t0, 2)}
        rows.append(row)
        log(f"  beam {beam:4d}  lm_weight {lm_weight:4.1f}  word_score {word_score:+4.1f}  dev WER {row['wer']:.4f}"
            f"  ({row['seconds']:.1f} s)")
    best = min(rows, key=lambda r: (r["wer"], r["beam_size"], r["lm_weight"], abs(r["word_score"])))
    return best, rows


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--emissions", nargs="+", required=True, help="emissions .npz of the dev set (one per run)")
    parser.add_argument("--manifest", required=True, help="the dev manifest (references)")
    parser.add_argument("--lm", default="auto", help="auto (built from --train-manifest) or an LM directory")
    parser.add_argument("--train-manifest", default="manifests/an4_train.csv")
    parser.add_argument("--order", type=int, default=3)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    from sparse_asr.training.emissions import load_emissions

    args = parse_args(argv)
    if "test" in Path(args.manifest).name:
        raise SystemExit(f"tune.py: {args.manifest} looks like a test set; tune on dev only")
    lm_dir = resolve_lm(args.lm, args.train_manifest, args.order)
    sets = []
    for path in args.emissions:
        utt_ids, log_probs = load_emissions(path)
        sets.append((log_probs, references(args.manifest, utt_ids)))
    print(f"tuning on {len(args.emissions)} emissions file(s) of {args.manifest}, LM {lm_dir}")
    best, rows = tune(sets, lm_dir)
    save_tuned(lm_dir, f"{args.manifest} ({', '.join(args.emissions)})", best, rows)
    return 0


def save_tuned(lm_dir: Path, tuned_on: str, best: dict, rows: list[dict], log=print) -> None:
    """tuned.json beside the LM: what it was tuned on, the best settings and the whole grid."""
    result = {"tuned_on": tuned_on, "best": best, "grid": rows}
    atomic_write_text(lm_dir / "tuned.json", json.dumps(result, indent=1) + "\n")
    log(f"best: beam {best['beam_size']}, lm_weight {best['lm_weight']:g}, word_score {best['word_score']:g}: "
        f"dev WER {best['wer']:.4f} -> {lm_dir / 'tuned.json'}")


if __name__ == "__main__":
    sys.exit(main())
