"""Manifest reading/writing and the fix-paths tool, on real AN4 utterances."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import soundfile

from sparse_asr.data.manifest import (ManifestError, build_index, find_by_name, fix_paths, missing_files,
                                      read_manifest, read_raw, rewrite_prefix, write_manifest)
from tests.conftest import REPO

OLD_ROOT = "/scratch/snx3000/shigang"
FIX = [sys.executable, str(REPO / "scripts" / "fix_manifest.py")]


@pytest.fixture(scope="module")
def tiny(tiny_manifest):
    return read_manifest(tiny_manifest)


def fix(*args, cwd=REPO):
    return subprocess.run([*FIX, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=120)


# ---------------------------------------------------------------- our format

def test_write_read_round_trip(tiny, tmp_path):
    path = tmp_path / "sub" / "m.csv"
    assert write_manifest(tiny, path) is True
    again = read_manifest(path)
    pd.testing.assert_frame_equal(again.drop(columns="line"), tiny.drop(columns="line"))
    assert again["line"].tolist() == list(range(2, 10))
    assert write_manifest(tiny, path) is False, "identical content must not be rewritten"
    leftovers = [p.name for p in path.parent.iterdir() if p.name != "m.csv"]
    assert leftovers == [], "atomic write must not leave temporary files"


def test_relative_paths_follow_the_manifest(tiny, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for audio in tiny["audio"]:
        os.symlink(audio, data / Path(audio).name)
    moved = tiny.assign(audio=[str(data / Path(a).name) for a in tiny["audio"]])
    write_manifest(moved, tmp_path / "manifests" / "m.csv")
    assert (tmp_path / "manifests" / "m.csv").read_text().splitlines()[1].startswith("../data/")
    # move data and manifests together: still valid
    os.rename(tmp_path, tmp_path.with_name(tmp_path.name + "_moved"))
    moved_root = tmp_path.with_name(tmp_path.name + "_moved")
    try:
        df = read_manifest(moved_root / "manifests" / "m.csv")
        assert missing_files(df) == [] and df["audio"][0].startswith(str(moved_root / "data"))
    finally:
        os.rename(moved_root, tmp_path)


def test_bad_manifests_name_file_and_line(tiny, tmp_path):
    path = tmp_path / "bad.csv"
    cases = {
        "audio,duration,transcript,utt_id,speaker\na.wav,1.0,YES,u1,s1\nb.wav,oops,NO,u2,s2\n": ":3: duration 'oops'",
        "audio,duration,transcript,utt_id,speaker\na.wav,1.0,YES,u1\n": ":2: expected 5 fields",
        "audio,duration,transcript,utt_id,speaker\na.wav,-1,YES,u1,s1\n": ":2: duration must be a positive",
        "a,b,c\n": ":1: neither our header",
        "": "is empty",
    }
    for text, expected in cases.items():
        path.write_text(text)
        with pytest.raises(ManifestError) as error:
            read_manifest(path)
        assert str(path) in str(error.value) and expected in str(error.value), error.value
    with pytest.raises(ManifestError, match="does not exist"):
        read_manifest(tmp_path / "absent.csv")


def test_byte_order_mark_and_bad_bytes(tiny, tmp_path):
    """A UTF-8 BOM (spreadsheet exports) before a valid header is accepted; a byte that is not UTF-8 is
    reported at its own line, wherever it is in the file."""
    write_manifest(tiny, tmp_path / "plain.csv")
    text = (tmp_path / "plain.csv").read_bytes()
    (tmp_path / "bom.csv").write_bytes(b"\xef\xbb\xbf" + text)
    bom = read_manifest(tmp_path / "bom.csv")
    pd.testing.assert_frame_equal(bom, read_manifest(tmp_path / "plain.csv"), check_like=False)
    lines = text.split(b"\n")
    lines[6] = lines[6].replace(b",", b",\xe9", 1)  # latin-1 e-acute on line 7
    (tmp_path / "latin1.csv").write_bytes(b"\n".join(lines))
    with pytest.raises(ManifestError, match=r"latin1\.csv:7: not UTF-8 text \(byte 0xe9"):
        read_manifest(tmp_path / "latin1.csv")
    long = [lines[0]] + lines[1:3] * 2000 + [lines[3].replace(b",", b",\xff", 1)]  # past the first read buffer
    (tmp_path / "long.csv").write_bytes(b"\n".join(long) + b"\n")
    with pytest.raises(ManifestError, match=r"long\.csv:4002: not UTF-8 text \(byte 0xff"):
        read_manifest(tmp_path / "long.csv")


def test_legacy_manifest_names_missing_audio(tiny, tmp_path):
    txt = tmp_path / "a.txt"
    txt.write_text("hello\n")
    (tmp_path / "legacy.csv").write_text(f"{tiny['audio'][0]},{txt}\n{tmp_path / 'gone.wav'},{txt}\n")
    with pytest.raises(ManifestError) as error:
        read_manifest(tmp_path / "legacy.csv")
    assert f"legacy.csv:2: audio file {tmp_path / 'gone.wav'} does not exist" in str(error.value)
    assert "System error" not in str(error.value)


def test_missing_files_by_line(tiny, tmp_path):
    df = tiny.copy()
    df.loc[3, "audio"] = str(tmp_path / "gone.sph")
    write_manifest(df, tmp_path / "m.csv")
    assert missing_files(read_manifest(tmp_path / "m.csv")) == [(5, str(tmp_path / "gone.sph"))]


@pytest.mark.unit
def test_rewrite_prefix():
    assert rewrite_prefix("/scratch/a/x.wav", "/scratch/a", "/data") == "/data/x.wav"
    assert rewrite_prefix("/scratch/a/x.wav", "/scratch/a/", "/data/") == "/data/x.wav"
    assert rewrite_prefix("/scratch/ab/x.wav", "/scratch/a", "/data") is None  # whole components only


# ---------------------------------------------------------------- legacy two-column manifests

@pytest.fixture
def legacy(tiny, tmp_path):
    """Real utterances as WAV + TXT in the original an4/train/{wav,txt} layout under tmp_path/new,
    and a legacy manifest pointing at /scratch/snx3000/shigang/... . Its third row's files were
    never copied (deliberately missing)."""
    new_root = tmp_path / "new"
    lines = []
    for number, row in enumerate(tiny.head(5).itertuples()):
        wav = new_root / "an4_dataset" / "train" / "an4" / "wav" / f"{row.utt_id}.wav"
        txt = wav.parent.parent / "txt" / f"{row.utt_id}.txt"
        if number != 2:
            wav.parent.mkdir(parents=True, exist_ok=True)
            txt.parent.mkdir(parents=True, exist_ok=True)
            data, rate = soundfile.read(row.audio, dtype="int16")
            soundfile.write(wav, data, rate, subtype="PCM_16")
            txt.write_text(row.transcript.lower() + "\n")
        lines.append(f"{OLD_ROOT}/{wav.relative_to(new_root)},{OLD_ROOT}/{txt.relative_to(new_root)}")
    manifest = tmp_path / "an4_train_manifest.csv"
    manifest.write_text("\n".join(lines) + "\n")
    return manifest, new_root, tiny.head(5)


def expect_legacy_fixed(path: Path, new_root: Path, expected: pd.DataFrame, missing_row_root):
    """Every row kept, in order; found files under new_root; the missing third row under missing_row_root."""
    raw = read_raw(path)
    assert raw.format == "legacy" and len(raw.rows) == len(expected)
    for number, ((_, (wav, txt)), utt) in enumerate(zip(raw.rows, expected["utt_id"])):
        root = missing_row_root if number == 2 else new_root
        assert wav == f"{root}/an4_dataset/train/an4/wav/{utt}.wav"
        assert txt == f"{root}/an4_dataset/train/an4/txt/{utt}.txt"


def test_fix_legacy_by_prefix(legacy, tmp_path):
    manifest, new_root, expected = legacy
    original = manifest.read_text()
    result = fix(manifest, "--old-root", OLD_ROOT + "/", "--new-root", new_root)
    assert result.returncode == 1
    utt = expected["utt_id"].iloc[2]
    assert f"{manifest}:3: cannot find {new_root}/an4_dataset/train/an4/wav/{utt}.wav" in result.stderr
    assert f"{manifest}:3: cannot find {new_root}/an4_dataset/train/an4/txt/{utt}.txt" in result.stderr
    assert result.stderr.count("cannot find") == 2 and "nothing written: 2 files not found" in result.stderr
    assert manifest.read_text() == original, "a failed fix must leave the manifest alone"
    # --check reports the same and writes nothing
    checked = fix(manifest, "--check", "--old-root", OLD_ROOT, "--new-root", new_root)
    assert checked.returncode == 1 and checked.stderr.count("cannot find") == 2 and manifest.read_text() == original
    # --allow-missing writes every row (the missing one included) to --out
    out = tmp_path / "fixed.csv"
    allowed = fix(manifest, "--old-root", OLD_ROOT, "--new-root", new_root, "--out", out, "--allow-missing")
    assert allowed.returncode == 0, allowed.stderr
    assert "10 paths: 10 prefix-rewritten, 0 found by name, 2 not found" in allowed.stdout
    expect_legacy_fixed(out, new_root, expected, missing_row_root=new_root)
    # without the missing row the fixed manifest reads back: transcripts from txt, durations from audio
    lines = manifest.read_text().splitlines()
    complete = tmp_path / "complete.csv"
    complete.write_text("\n".join(lines[:2] + lines[3:]) + "\n")
    in_place = fix(complete, "--old-root", OLD_ROOT, "--new-root", new_root)
    assert in_place.returncode == 0, in_place.stderr
    df = read_manifest(complete)
    kept = expected.drop(index=expected.index[2])
    assert df["transcript"].tolist() == [t.lower() for t in kept["transcript"]]
    np.testing.assert_allclose(df["duration"], kept["duration"])
    assert df["utt_id"].tolist() == kept["utt_id"].tolist() and df["speaker"].tolist() == ["wav"] * 4


def test_fix_legacy_by_search(legacy, tmp_path):
    manifest, new_root, expected = legacy
    decoy = new_root / "elsewhere" / "test" / "wav"  # same name in another tree: the longer shared tail wins
    decoy.mkdir(parents=True)
    first = expected["utt_id"].iloc[0]
    (decoy / f"{first}.wav").write_bytes(b"decoy")
    out = tmp_path / "searched.csv"
    result = fix(manifest, "--search-root", new_root, "--out", out, "--allow-missing")
    assert result.returncode == 0, result.stderr
    assert f"{manifest}:3: cannot find" in result.stderr and "8 found by name" in result.stdout
    expect_legacy_fixed(out, new_root, expected, missing_row_root=OLD_ROOT)  # no guess: kept as it was
    failing = fix(manifest, "--search-root", new_root, "--out", tmp_path / "never.csv")
    assert failing.returncode == 1 and not (tmp_path / "never.csv").exists()


def test_fix_our_format_moves_relative_paths(tiny, tmp_path):
    """Our format: absolute paths under an old root are rewritten and stored relative to --out's dir."""
    data = tmp_path / "data"
    data.mkdir()
    for audio in tiny["audio"]:
        os.symlink(audio, data / Path(audio).name)
    old = tiny.assign(audio=[f"/old/root/{Path(a).name}" for a in tiny["audio"]])
    write_manifest(old, tmp_path / "m.csv")
    assert missing_files(read_manifest(tmp_path / "m.csv")) == \
        [(line, a) for line, a in zip(range(2, 10), old["audio"])]
    raw = read_raw(tmp_path / "m.csv")
    fixed, report = fix_paths(raw, tmp_path / "out" / "m.csv", "/old/root", str(data))
    assert report.unresolved == [] and report.rewritten == 8
    assert [fields[0] for _, fields in fixed.rows] == [f"../data/{Path(a).name}" for a in tiny["audio"]]
    assert [fields[1:] for _, fields in fixed.rows] == [fields[1:] for _, fields in raw.rows]
    # by name, through the CLI, in place
    result = fix(tmp_path / "m.csv", "--search-root", data)
    assert result.returncode == 0, result.stderr
    assert f"indexed 8 files under {data}" in result.stdout
    df = read_manifest(tmp_path / "m.csv")
    assert missing_files(df) == [] and df["utt_id"].tolist() == tiny["utt_id"].tolist()
    # counts read as English: one file, not "1 files"
    lone = tmp_path / "lone"
    lone.mkdir()
    os.symlink(tiny["audio"].iloc[0], lone / Path(tiny["audio"].iloc[0]).name)
    assert f"indexed 1 file under {lone}\n" in fix(tmp_path / "m.csv", "--check", "--search-root", lone).stdout


@pytest.mark.unit
def test_ambiguous_names_are_not_guessed(tmp_path):
    for sub in ("a/wav", "b/wav"):
        (tmp_path / sub).mkdir(parents=True)
        (tmp_path / sub / "x.wav").write_bytes(b"")
    found, reason = find_by_name("/old/c/wav/x.wav", build_index(tmp_path))
    assert found is None and "ambiguous" in reason


@pytest.mark.unit
def test_cli_usage_errors(tmp_path):
    assert fix(tmp_path / "m.csv").returncode == 2  # no action given
    assert fix(tmp_path / "m.csv", "--old-root", "/x").returncode == 2
    result = fix(tmp_path / "absent.csv", "--check")
    assert result.returncode == 2 and "does not exist" in result.stderr
