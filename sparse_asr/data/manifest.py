"""Manifests: read, write, check and fix the paths of the CSV files that list a data set (DESIGN 6).

Two formats are read:
  ours    header `audio,duration,transcript,utt_id,speaker`; audio relative to the manifest's
          directory (or absolute).
  legacy  no header, two columns `/abs/path.wav,/abs/path.txt` (deepspeech.pytorch and the original
          Ok-Topk manifests); the transcript is read from the txt file, the duration from the audio header.

`read_manifest` gives one DataFrame for both. The fix-paths functions work on the raw rows instead,
so that a manifest whose files are not (yet) where it says can still be repaired.
"""
from __future__ import annotations

import csv
import io
import math
import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import soundfile

from sparse_asr.fileio import MANIFEST_BYTES, TRANSCRIPT_BYTES, atomic_write, read_bytes, read_text

COLUMNS = ["audio", "duration", "transcript", "utt_id", "speaker"]
OURS, LEGACY = "ours", "legacy"
PATH_FIELDS = {OURS: (0,), LEGACY: (0, 1)}  # which fields of a row are file paths


class ManifestError(ValueError):
    """A manifest that cannot be read; the message names the file and line."""


@dataclass
class RawManifest:
    """A manifest as text rows: `rows` holds (line number, fields) for every data row."""

    path: Path
    format: str  # OURS or LEGACY
    rows: list[tuple[int, list[str]]]


# ---------------------------------------------------------------- reading

def read_raw(path, problems: list[str] | None = None) -> RawManifest:
    """Split a manifest into rows and tell its format, without touching the files it lists. Bad rows raise
    one ManifestError naming them all, or with `problems` given are added to it (and left out)."""
    path = Path(path)
    try:
        lines = split_rows(path)
    except ManifestError as e:
        if problems is None:
            raise
        problems.append(str(e))  # the other manifests' faults are still named beside it
        return RawManifest(path, OURS, [])
    first = [value.strip() for value in lines[0][1]]
    if first == COLUMNS:
        fmt, body, width = OURS, lines[1:], len(COLUMNS)
    elif len(first) == 2:
        fmt, body, width = LEGACY, lines, 2
    else:
        message = (f"{path}:1: neither our header {','.join(COLUMNS)!r} nor a legacy two-column row "
                   f"(audio,transcript.txt): got {len(first)} fields {lines[0][1]!r}")
        if problems is None:
            raise ManifestError(message)
        problems.append(message)
        return RawManifest(path, OURS, [])
    rows, found = [], []
    for line, fields in body:
        if not fields or (len(fields) == 1 and not fields[0].strip()):
            continue  # blank line
        if len(fields) != width:
            found.append(f"{path}:{line}: expected {width} fields for a {fmt} manifest, got {len(fields)}: {fields!r}")
        elif any(not fields[i].strip() for i in PATH_FIELDS[fmt]):
            found.append(f"{path}:{line}: empty path in {fields!r}")
        else:
            rows.append((line, fields))
    if problems is None:
        raise_all(found, len(body), path)
    else:
        problems.extend(found)
    return RawManifest(path, fmt, rows)


def split_rows(path: Path) -> list[tuple[int, list[str]]]:
    """(line number, fields) of every CSV record of the manifest `path`: a regular file of bounded size, UTF-8
    (a byte-order mark, from spreadsheet exports, is not part of the header); ManifestError naming it."""
    try:
        data = read_bytes(path, MANIFEST_BYTES, "manifest")
    except FileNotFoundError:
        raise ManifestError(f"manifest {path} does not exist") from None
    except OSError as e:
        raise ManifestError(str(e)) from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise ManifestError(f"{path}:{line}: not UTF-8 text (byte {data[e.start]:#04x}; {e.reason})") from None
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        lines = [(reader.line_num, fields) for fields in reader]  # line_num: where the record ends
    except csv.Error as e:
        raise ManifestError(f"{path}:{reader.line_num + 1}: not a readable CSV line ({e})") from None
    if not lines:
        raise ManifestError(f"manifest {path} is empty")
    return lines


def raise_all(problems: list[str], rows: int, path) -> None:
    """One ManifestError listing every bad row (a user fixes them in one pass, not one per run)."""
    if len(problems) == 1:
        raise ManifestError(problems[0])
    if problems:
        raise ManifestError(f"{len(problems)} of {rows} rows of {path} cannot be used:\n"
                            + "\n".join(f"  {p}" for p in problems))


def resolve(path_field: str, manifest_dir) -> str:
    """An absolute path: relative paths are relative to the manifest's directory. Symlinks are kept."""
    return os.path.abspath(os.path.join(manifest_dir, path_field.strip()))


def read_manifest(path, problems: list[str] | None = None) -> pd.DataFrame:
    """Read a manifest of either format into columns audio (absolute), duration, transcript, utt_id,
    speaker, plus `line` (its line in the file). `df.attrs["manifest"]` names the file. Every bad row of
    every kind (fields, duration, transcript, an utterance id seen before) is named in one ManifestError,
    or with `problems` given added to it and left out, so a caller can add its own checks (the audio)
    and raise once."""
    from sparse_asr.data.text import transcript_problem

    found = []
    raw = read_raw(path, found)
    rows = len(raw.rows) + len(found)
    base = raw.path.parent
    records, seen = [], {}
    for line, fields in raw.rows:
        where = f"{raw.path}:{line}"
        if raw.format == OURS:
            audio, duration, transcript, utt_id, speaker = fields
            try:
                duration = float(duration)
            except ValueError:
                found.append(f"{where}: duration {duration!r} is not a number")
                continue
            audio = resolve(audio, base)
        else:
            audio, txt = resolve(fields[0], base), resolve(fields[1], base)
            try:
                transcript = read_text(txt, TRANSCRIPT_BYTES, "transcript")  # not a FIFO, not /dev/zero
                if not os.path.isfile(audio):  # else libsndfile says only "System error."
                    raise FileNotFoundError(f"audio file {audio} does not exist")
                info = soundfile.info(audio)
            except (OSError, RuntimeError) as e:
                found.append(f"{where}: {e} (repair paths with scripts/fix_manifest.py)")
                continue
            duration = info.frames / info.samplerate
            utt_id, speaker = Path(audio).stem, Path(audio).parent.name
        if not (math.isfinite(duration) and duration > 0):
            found.append(f"{where}: duration must be a positive number, got {duration}")
            continue
        transcript = " ".join(transcript.split())
        utt_id = utt_id.strip()
        bad = transcript_problem(transcript)
        if bad is not None:
            found.append(f"{where} ({utt_id}): {bad}")
            continue
        if utt_id in seen:  # the same utterance twice would be trained on twice, silently
            found.append(f"{where}: utterance {utt_id!r} is also on line {seen[utt_id]}")
            continue
        seen[utt_id] = line
        records.append((audio, duration, transcript, utt_id, speaker.strip(), line))
    if problems is None:
        raise_all(found, rows, raw.path)
    else:
        problems.extend(found)
    df = pd.DataFrame.from_records(records, columns=COLUMNS + ["line"])
    df["duration"] = df["duration"].astype(float)
    df.attrs["manifest"] = str(raw.path)
    return df


# Manifests may round durations (whoever wrote them); a wrong or cut-off file is off by far more.
DURATION_TOLERANCE_S = 0.1


def audio_problem(audio: str, duration: float, sample_rate: int = 16000) -> str | None:
    """Why a manifest row's audio cannot be trained on, from the file's header only (audio.audio_frames:
    exists, readable, rate, mono, not truncated), or because it is not as long as the manifest says
    (within DURATION_TOLERANCE_S); None if it is fine. The message names the file."""
    from sparse_asr.data.audio import AudioError, audio_frames  # torch-free callers of this module stay light

    try:
        seconds = audio_frames(audio, sample_rate) / sample_rate
    except AudioError as e:
        return str(e)
    if abs(seconds - duration) > DURATION_TOLERANCE_S:
        return f"{audio}: holds {seconds:.3f} s of audio, the manifest says {duration:.3f} s"
    return None


def missing_files(df: pd.DataFrame) -> list[tuple[int, str]]:
    """(line number, path) of every audio file that does not exist. Lines come from the `line`
    column when the frame was read from a file, else from the row position (+2 for the header)."""
    lines = df["line"].tolist() if "line" in df.columns else range(2, len(df) + 2)
    return [(int(line), audio) for line, audio in zip(lines, df["audio"]) if not os.path.isfile(audio)]


# ---------------------------------------------------------------- writing

def relative_if_sensible(path: str, manifest_dir) -> str:
    """`path` relative to the manifest's directory, unless the two share nothing but the filesystem
    root (then a relative path would only break when either moves, so keep it absolute)."""
    path, manifest_dir = os.path.abspath(path), os.path.abspath(manifest_dir)
    if os.path.commonpath([path, manifest_dir]) == os.path.sep:
        return path
    return os.path.relpath(path, manifest_dir)


def write_text_atomic(path, text: str) -> bool:
    """Write `text` to `path` via a temporary file and os.replace, so readers never see half a file.
    Returns False (and leaves the file alone, mtime included) when it already holds exactly `text`."""
    path = Path(path)
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return False
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))
    return True


def _csv_text(rows, header=None) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    if header:
        writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue()


def write_manifest(df: pd.DataFrame, path, relative: bool = True) -> bool:
    """Write `df` in our format, atomically; audio paths relative to the manifest's directory when
    `relative` (and sensible). Returns False if the file already had exactly this content."""
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"cannot write manifest {path}: DataFrame lacks columns {missing}")
    manifest_dir = Path(path).absolute().parent
    rows = []
    for audio, duration, transcript, utt_id, speaker in df[COLUMNS].itertuples(index=False):
        audio = relative_if_sensible(audio, manifest_dir) if relative else os.path.abspath(audio)
        rows.append([audio, repr(float(duration)), transcript, utt_id, speaker])
    return write_text_atomic(path, _csv_text(rows, header=COLUMNS))


def write_raw(raw: RawManifest, path) -> bool:
    """Write rows in the manifest's own format (header for ours, none for legacy), atomically."""
    return write_text_atomic(path, _csv_text([fields for _, fields in raw.rows],
                                             header=COLUMNS if raw.format == OURS else None))


# ---------------------------------------------------------------- fixing paths

def rewrite_prefix(path: str, old_root: str, new_root: str) -> str | None:
    """`path` with the directory prefix `old_root` replaced by `new_root`; None if it is not under old_root."""
    old = old_root.rstrip(os.sep) or os.sep
    if path == old:
        return new_root
    if path.startswith(old.rstrip(os.sep) + os.sep):
        return os.path.join(new_root, path[len(old):].lstrip(os.sep))
    return None


def build_index(search_root) -> dict[str, list[str]]:
    """basename -> every absolute path with that name under `search_root` (one walk of the tree)."""
    search_root = os.path.abspath(search_root)
    if not os.path.isdir(search_root):
        raise FileNotFoundError(f"search root {search_root} is not a directory")
    index = defaultdict(list)
    for directory, _, files in os.walk(search_root):
        for name in files:
            index[name].append(os.path.join(directory, name))
    return dict(index)


def _common_suffix_parts(a: str, b: str) -> int:
    n = 0
    for x, y in zip(reversed(Path(a).parts), reversed(Path(b).parts)):
        if x != y:
            break
        n += 1
    return n


def find_by_name(path: str, index: dict[str, list[str]]) -> tuple[str | None, str]:
    """Look `path` up by basename. Among several candidates the one sharing the longest tail of
    directories with `path` wins (train/wav/x.wav over test/wav/x.wav); a tie is ambiguous.
    Returns (found path or None, reason when None)."""
    candidates = index.get(os.path.basename(path), [])
    if not candidates:
        return None, "not found under the search root"
    if len(candidates) == 1:
        return candidates[0], ""
    scored = sorted(((_common_suffix_parts(path, c), c) for c in candidates), reverse=True)
    if scored[0][0] == scored[1][0]:
        return None, (f"ambiguous: {len(candidates)} files named {os.path.basename(path)!r}, e.g. {scored[0][1]} "
                      f"and {scored[1][1]}")
    return scored[0][1], ""


@dataclass
class FixReport:
    rows: int = 0
    paths: int = 0
    rewritten: int = 0  # by prefix
    found: int = 0  # by search
    unresolved: list[tuple[int, str, str]] = field(default_factory=list)  # (line, path, reason)


def fix_paths(raw: RawManifest, out_path=None, old_root=None, new_root=None,
              index=None) -> tuple[RawManifest, FixReport]:
    """Repair every path of `raw` (both paths of a legacy row): first replace the prefix old_root ->
    new_root, then, if the file still does not exist and an `index` (from build_index) is given,
    look it up by name. Every row is kept; rows whose file cannot be found keep their best-guess
    path and are listed in report.unresolved. Our-format paths are written relative to the
    directory of `out_path` (default: the manifest itself) when sensible; legacy paths stay absolute."""
    if (old_root is None) != (new_root is None):
        raise ValueError("old_root and new_root go together")
    out_dir = Path(out_path if out_path is not None else raw.path).absolute().parent
    report = FixReport(rows=len(raw.rows))
    new_rows = []
    for line, fields in raw.rows:
        fields = list(fields)
        for i in PATH_FIELDS[raw.format]:
            path = resolve(fields[i], raw.path.parent)
            report.paths += 1
            if old_root is not None:
                rewritten = rewrite_prefix(path, os.path.abspath(old_root), os.path.abspath(new_root))
                if rewritten is not None:
                    path = rewritten
                    report.rewritten += 1
            reason = "file does not exist"
            if not os.path.isfile(path) and index is not None:
                found, reason = find_by_name(path, index)
                if found is not None:
                    path = found
                    report.found += 1
            if not os.path.isfile(path):
                report.unresolved.append((line, path, reason))
            fields[i] = relative_if_sensible(path, out_dir) if raw.format == OURS else path
        new_rows.append((line, fields))
    return RawManifest(raw.path, raw.format, new_rows), report
