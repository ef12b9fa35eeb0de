"""AN4 as FLAC for the offline bundle (used by scripts/pack_offline.sh).

    python scripts/offline/an4_flac.py --source ../shared/data/an4_sphere.tar.gz --data-dir datasets \
        --out BUNDLE [--max-utterances N]

Prepares AN4 as sparse_asr.data.an4 does (same checks, same train/dev/test split), then writes
  BUNDLE/datasets/an4/<split>/<utt>.flac                      every utterance, re-encoded losslessly
  BUNDLE/datasets/LICENSE.an4                                 CMU's notice, which must travel with the data
  BUNDLE/manifests/an4_{train,dev,test}.csv                   audio paths relative to the manifest
so the manifests stay valid wherever the bundle is unpacked. FLAC is about 44% of the SPHERE size;
every file is read back and compared sample for sample with its original.
--max-utterances N keeps only the N shortest utterances of each split (a small bundle for tests;
the same rule as data.max_train_utterances).
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import soundfile

from sparse_asr.data.an4 import SAMPLE_RATE, URL, An4Error, prepare_an4
from sparse_asr.data.manifest import read_manifest, write_manifest

SPLITS = ("train", "dev", "test")


def to_flac(source: Path, target: Path) -> int:
    """Re-encode one 16-bit mono file as FLAC (strongest compression), check it decodes to the same
    samples; returns the FLAC's size in bytes."""
    samples, rate = soundfile.read(source, dtype="int16")
    if rate != SAMPLE_RATE or samples.ndim != 1:
        raise An4Error(f"{source}: expected {SAMPLE_RATE} Hz mono, got {rate} Hz, shape {samples.shape}")
    target.parent.mkdir(parents=True, exist_ok=True)
    soundfile.write(target, samples, rate, format="FLAC", subtype="PCM_16", compression_level=1.0)
    decoded, _ = soundfile.read(target, dtype="int16")
    if not np.array_equal(decoded, samples):
        raise An4Error(f"{target}: the FLAC does not decode to the samples of {source}")
    return target.stat().st_size


def convert(source: str, data_dir: Path, out: Path, max_utterances: int = 0) -> dict[str, int]:
    """FLAC corpus, licence and manifests under `out`; returns {split: utterances}."""
    with tempfile.TemporaryDirectory() as sphere_manifests:
        paths = prepare_an4(source, data_dir, sphere_manifests)
        splits = {split: read_manifest(paths[split]) for split in SPLITS}
    if paths["license"] is None:
        raise An4Error("no AN4 licence notice found: CMU's notice must be shipped with the data")
    (out / "datasets").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(paths["license"], out / "datasets" / "LICENSE.an4")
    counts, flac_bytes, sphere_bytes = {}, 0, 0
    for split, df in splits.items():
        if max_utterances:
            df = df.sort_values(["duration", "utt_id"], kind="stable").head(max_utterances)
        flac_paths = []
        for audio, utt_id in zip(df["audio"], df["utt_id"]):
            target = out / "datasets" / "an4" / split / f"{utt_id}.flac"  # one folder per split: fewer, shorter paths
            if target.exists():
                raise An4Error(f"utterance {utt_id} appears twice in the {split} split")
            flac_bytes += to_flac(Path(audio), target)
            sphere_bytes += Path(audio).stat().st_size
            flac_paths.append(str(target))
        df = df.drop(columns="line").assign(audio=flac_paths)
        write_manifest(df, out / "manifests" / f"an4_{split}.csv")
        counts[split] = len(df)
    print(f"[an4_flac] {sum(counts.values())} utterances ({', '.join(f'{k} {v}' for k, v in counts.items())}): "
          f"{sphere_bytes / 2**20:.1f} MiB SPHERE -> {flac_bytes / 2**20:.1f} MiB FLAC in {out / 'datasets' / 'an4'}",
          flush=True)
    return counts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", default=URL, help="URL, an4_sphere.tar.gz, or extracted an4/ directory")
    parser.add_argument("--data-dir", type=Path, default=Path("datasets"), help="where a tarball is extracted")
    parser.add_argument("--out", type=Path, required=True, help="the bundle directory")
    parser.add_argument("--max-utterances", type=int, default=0, help="keep the N shortest per split (0 = all)")
    args = parser.parse_args(argv)
    if args.max_utterances < 0:
        parser.error(f"--max-utterances must be >= 0, got {args.max_utterances}")
    try:
        convert(args.source, args.data_dir, args.out, args.max_utterances)
    except An4Error as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
