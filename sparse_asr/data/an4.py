"""Prepare CMU AN4 (DESIGN 6): fetch or extract the corpus, check it, write train/dev/test manifests.

    python -m sparse_asr.data.an4 --source ../shared/data/an4_sphere.tar.gz --data-dir datasets --manifest-dir manifests

SOURCE is the CMU URL (the default), a local an4_sphere.tar.gz, or an extracted an4/ directory
(used in place). A tarball is extracted once into <data-dir>/an4/; later runs reuse it and say so.
Dev is a fixed, speaker-disjoint ~10% of the training speakers. The corpus licence notice is
copied next to the extracted data (<data-dir>/LICENSE.an4).
"""
from __future__ import annotations

import argparse
import fcntl
import gzip
import json
import os
import random
import re
import shutil
import signal
import sys
import tarfile
import tempfile
import urllib.request
import zlib
from contextlib import contextmanager
from pathlib import Path

import pandas as pd

from sparse_asr.data.audio import AudioError, audio_frames
from sparse_asr.fileio import (RECORD_BYTES, TRANSCRIPT_BYTES, UnsafePathError, atomic_write, atomic_write_text,
                               current_umask, open_no_follow, read_bytes, read_text, trusted_path)
from sparse_asr.data.manifest import write_manifest
from sparse_asr.data.text import text_to_ids

URL = "http://www.speech.cs.cmu.edu/databases/an4/an4_sphere.tar.gz"
REPO = Path(__file__).resolve().parent.parent
SHARED_LICENSE = REPO.parent / "shared" / "data" / "LICENSE.an4"  # CMU's notice on this project's machines
MARKER = ".an4_extracted.json"  # written into <data-dir> once an extraction finished
SPLITS = {"train": "an4_clstk", "test": "an4test_clstk"}  # etc/an4_<split>.* -> wav/<dir>/<speaker>/<utt>.sph
SAMPLE_RATE = 16000


class An4Error(RuntimeError):
    """The corpus is incomplete or malformed; the message lists every problem by name."""


def log(message: str) -> None:
    print(f"[an4] {message}", flush=True)


@contextmanager
def _locked(directory: Path):
    """Serialise preparations sharing a data dir (several test runs may start at once). Under the lock no other
    preparation runs, so a temporary directory or download left by one that was killed (SIGKILL leaves no chance
    to clean up) is removed here: a kill leaves nothing behind for longer than the next preparation."""
    try:
        trusted_path(directory).mkdir(parents=True, exist_ok=True)
    except UnsafePathError as e:
        raise An4Error(str(e)) from None
    path = directory / ".an4.lock"
    try:
        fd = open_no_follow(path)
    except OSError as e:
        raise An4Error(f"cannot open the lock file {path}: {e.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        for leftover in [*directory.glob(".an4_extract.*"), *directory.glob(".download.*")]:
            if leftover.is_dir() and not leftover.is_symlink():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)
        yield
    finally:
        os.close(fd)  # (releases the lock)


# ---------------------------------------------------------------- getting the files

def _is_url(source: str) -> bool:
    return re.match(r"^(https?|ftp|file)://", source) is not None


def _check_gzip_tar(path: Path) -> None:
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic != b"\x1f\x8b":
        raise An4Error(f"{path} is not a gzip file (first bytes {magic!r})")
    try:
        with tarfile.open(path, "r:gz") as tar:
            tar.next()
    except (tarfile.TarError, OSError, EOFError, gzip.BadGzipFile) as e:
        raise An4Error(f"{path} is not a readable gzip tar archive: {e}") from None


def download(url: str, data_dir: Path) -> Path:
    """Fetch `url` into <data-dir>/<name> (kept for later re-extraction) unless already there."""
    target = data_dir / (os.path.basename(url.rstrip("/")) or "an4_sphere.tar.gz")
    if target.is_file():
        log(f"reusing downloaded {target}")
        return target
    log(f"downloading {url} -> {target}")
    fd, tmp = tempfile.mkstemp(dir=data_dir, prefix=".download.")
    os.close(fd)
    try:
        urllib.request.urlretrieve(url, tmp)
        _check_gzip_tar(Path(tmp))
        os.replace(tmp, target)
    except OSError as e:
        raise An4Error(f"could not download {url}: {e}. Without internet, pass --source "
                       "path/to/an4_sphere.tar.gz") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def extract(archive: Path, data_dir: Path) -> Path:
    """Extract `archive` (which must hold only an4/...) into <data-dir>/an4 through a temporary
    directory, so an interrupted run never leaves a half-extracted corpus that looks complete.
    tarfile's 'data' filter refuses absolute paths, '..', links leaving the tree and device files."""
    _check_gzip_tar(archive)
    tmp = Path(tempfile.mkdtemp(dir=data_dir, prefix=".an4_extract."))
    try:
        with tarfile.open(archive, "r:gz") as tar:
            try:
                members = tar.getmembers()
            except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
                raise An4Error(f"{archive} is truncated or damaged ({type(e).__name__}: {e or 'it ends early'}): "
                               f"download or copy it again") from None
            outside = [m.name for m in members if m.name.split("/")[0] != "an4"]
            if outside:
                raise An4Error(f"{archive} holds entries outside an4/, e.g. {outside[:3]}: not the AN4 archive")
            try:
                tar.extractall(tmp, members=members, filter=umask_filter)
            except tarfile.FilterError as e:
                raise An4Error(f"{archive}: refusing unsafe entry: {e}") from None
        os.replace(tmp / "an4", data_dir / "an4")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    record = {"archive": str(archive.resolve()), "bytes": archive.stat().st_size}
    atomic_write_text(data_dir / MARKER, json.dumps(record) + "\n")  # a link at its name is replaced, not followed
    return data_dir / "an4"


def umask_filter(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    """tarfile's 'data' filter, with the modes every other output gets (0666 or 0777 less the umask) instead of
    the archive's 0644: under umask 077 the corpus is private like the rest of the user's files."""
    member = tarfile.data_filter(member, dest)
    mask = current_umask()
    return member.replace(mode=(0o777 if member.isdir() else 0o666) & ~mask, deep=False)


def locate_corpus(source: str, data_dir: Path) -> Path:
    """The an4/ directory to read: `source` itself if it is one, else the extraction in <data-dir>."""
    if not _is_url(source) and Path(source).is_dir():
        root = Path(source)
        root = root / "an4" if (root / "an4" / "etc").is_dir() else root
        if not (root / "etc").is_dir() or not (root / "wav").is_dir():
            raise An4Error(f"{source} is not an extracted AN4 directory (no etc/ and wav/)")
        log(f"using the extracted corpus in place: {root.resolve()}")
        return root.resolve()
    if (data_dir / MARKER).is_file() and (data_dir / "an4").is_dir():
        done = read_record(data_dir / MARKER)
        log(f"reusing {data_dir / 'an4'} (extracted earlier from {done['archive']})")
        return (data_dir / "an4").resolve()
    if (data_dir / "an4").exists():
        raise An4Error(f"{data_dir / 'an4'} exists but was not extracted completely by this tool: remove it and rerun")
    archive = download(source, data_dir) if _is_url(source) else Path(source)
    if not archive.is_file():
        raise An4Error(f"source {source} is neither a URL, nor a file, nor a directory")
    log(f"extracting {archive} -> {data_dir / 'an4'}")
    return extract(archive, data_dir).resolve()


def read_record(path: Path) -> dict:
    """The extraction record: a small regular file, never read through a link planted at its name."""
    try:
        done = json.loads(read_text(path, RECORD_BYTES, "extraction record", follow=False))
    except (OSError, ValueError) as e:
        raise An4Error(f"{path} cannot be read ({e}): remove it and rerun") from None
    if not isinstance(done, dict) or not isinstance(done.get("archive"), str):
        raise An4Error(f"{path} is not an extraction record of this tool: remove it and rerun")
    return done


def copy_license(root: Path, data_dir: Path) -> Path | None:
    """Keep CMU's notice next to the data: the project's copy if present, else the archive's own. Written
    atomically: a link planted at LICENSE.an4 is replaced, the file it points at left alone."""
    for notice in (SHARED_LICENSE, root / "LICENSE"):
        if notice.is_file():
            target = data_dir / "LICENSE.an4"
            text = read_bytes(notice, RECORD_BYTES, "licence notice")
            if os.path.islink(target) or not target.is_file() or \
                    read_bytes(target, RECORD_BYTES, "licence notice", follow=False) != text:
                atomic_write(target, lambda f: f.write(text))
            return target
    log(f"WARNING: no AN4 licence notice found ({SHARED_LICENSE} or {root / 'LICENSE'}); AN4 requires keeping "
        "CMU's notice")
    return None


# ---------------------------------------------------------------- reading the corpus

_TRANSCRIPT = re.compile(r"^(?:<s>\s+)?(?P<words>.*?)(?:\s+</s>)?\s*\((?P<utt>[^()\s]+)\)\s*$")


def parse_transcription(path: Path) -> dict[str, str]:
    """utt-id -> words, from lines `<s> WORDS </s> (utt-id)` (train) or `WORDS (utt-id)` (test)."""
    texts = {}
    for number, line in enumerate(read_text(path, TRANSCRIPT_BYTES, "transcription").splitlines(), start=1):
        if not line.strip():
            continue
        match = _TRANSCRIPT.match(line.strip())
        if match is None:
            raise An4Error(f"{path}:{number}: not a transcription line: {line!r}")
        utt, words = match["utt"], " ".join(match["words"].split())
        try:
            text_to_ids(words)
        except ValueError as e:
            raise An4Error(f"{path}:{number}: {e}") from None
        if utt in texts:
            raise An4Error(f"{path}:{number}: utterance {utt} transcribed twice")
        texts[utt] = words
    return texts


def read_split(root: Path, split: str) -> tuple[pd.DataFrame, list[str]]:
    """One split as a manifest DataFrame, plus every problem found (by name)."""
    etc, wav_dir = root / "etc", root / "wav" / SPLITS[split]
    for needed in (etc / f"an4_{split}.fileids", etc / f"an4_{split}.transcription", wav_dir):
        if not needed.exists():
            return pd.DataFrame(), [f"{split}: missing {needed}"]
    texts = parse_transcription(etc / f"an4_{split}.transcription")
    fileids = read_text(etc / f"an4_{split}.fileids", TRANSCRIPT_BYTES, "file list")
    listed = [line.strip() for line in fileids.splitlines() if line.strip()]
    on_disk = {p.stem: p for p in wav_dir.glob("*/*.sph")}
    problems, records = [], []
    for entry in listed:  # e.g. an4_clstk/fash/an251-fash-b
        utt, speaker = Path(entry).name, Path(entry).parent.name
        audio = root / "wav" / f"{entry}.sph"
        if utt not in texts:
            problems.append(f"{split}: utterance without transcript: {utt}")
            continue
        if not audio.is_file():
            problems.append(f"{split}: transcript without audio: {utt} (expected {audio})")
            continue
        try:
            samples = audio_frames(audio, SAMPLE_RATE)  # every file's header: rate, channels, not truncated
        except AudioError as e:
            problems.append(f"{split}: unreadable audio: {e}")
            continue
        records.append((str(audio), samples / SAMPLE_RATE, texts[utt], utt, speaker))
    listed_utts = {Path(entry).name for entry in listed}
    problems += [f"{split}: transcript without audio: {utt} (not in an4_{split}.fileids)"
                 for utt in sorted(set(texts) - listed_utts)]
    problems += [f"{split}: utterance without transcript: {p} (audio not in an4_{split}.fileids)"
                 for utt, p in sorted(on_disk.items()) if utt not in listed_utts]
    return (pd.DataFrame.from_records(records, columns=["audio", "duration", "transcript", "utt_id", "speaker"]),
            problems)


def split_dev(train: pd.DataFrame, fraction: float, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Hold out whole speakers: shuffle the sorted speaker list with `seed`, then walk it, taking a
    speaker whenever that brings the dev utterance count closer to `fraction` of the training set.
    Deterministic for a given corpus."""
    if not 0 < fraction < 1:
        raise ValueError(f"dev fraction must be between 0 and 1, got {fraction}")
    speakers = sorted(train["speaker"].unique())
    random.Random(seed).shuffle(speakers)
    goal, dev_speakers, count = fraction * len(train), set(), 0
    per_speaker = train["speaker"].value_counts()
    for speaker in speakers:
        n = int(per_speaker[speaker])
        if abs(count + n - goal) < abs(count - goal):
            dev_speakers.add(speaker)
            count += n
    is_dev = train["speaker"].isin(dev_speakers)
    return train[~is_dev].reset_index(drop=True), train[is_dev].reset_index(drop=True)


def prepare_an4(source: str = URL, data_dir="datasets", manifest_dir="manifests",
                dev_fraction: float = 0.1, seed: int = 0) -> dict[str, Path]:
    """Get, check and split AN4; write an4_{train,dev,test}.csv into `manifest_dir` (rewritten only
    when their content changes). Returns paths: root (the an4/ dir), train, dev, test, license."""
    data_dir, manifest_dir = Path(data_dir).absolute(), Path(manifest_dir).absolute()
    with _locked(data_dir):
        root = locate_corpus(str(source), data_dir)
        license_path = copy_license(root, data_dir)
        train, train_problems = read_split(root, "train")
        test, test_problems = read_split(root, "test")
        problems = train_problems + test_problems
        if problems:
            raise An4Error(f"AN4 in {root} is incomplete ({len(problems)} problems):\n  " + "\n  ".join(problems))
        train, dev = split_dev(train, dev_fraction, seed)
        shared = set(dev["speaker"]) & set(train["speaker"])
        assert not shared, f"dev/train share speakers {shared}"
        paths = {"root": root, "license": license_path}
        for name, df in (("train", train), ("dev", dev), ("test", test)):
            paths[name] = manifest_dir / f"an4_{name}.csv"
            written = write_manifest(df, paths[name])
            log(f"{'wrote' if written else 'unchanged'} {paths[name]}: {len(df)} utterances, "
                f"{df['speaker'].nunique()} speakers, {df['duration'].sum() / 60:.1f} min")
    return paths


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", default=URL,
                        help="URL, an4_sphere.tar.gz, or extracted an4/ directory (default: %(default)s)")
    parser.add_argument("--data-dir", default="datasets", help="where the corpus is extracted (default: %(default)s)")
    parser.add_argument("--manifest-dir", default="manifests",
                        help="where the manifests are written (default: %(default)s)")
    parser.add_argument("--dev-fraction", type=float, default=0.1,
                        help="share of training utterances held out, by speaker")
    parser.add_argument("--seed", type=int, default=0, help="seed of the dev speaker choice (changing it changes dev)")
    args = parser.parse_args(argv)
    # a kill (SIGTERM: a batch job's end, `kill`) leaves through the finally blocks: no temporary directory stays
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        prepare_an4(args.source, args.data_dir, args.manifest_dir, args.dev_fraction, args.seed)
    except (An4Error, UnsafePathError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
