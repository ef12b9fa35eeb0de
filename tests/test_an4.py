"""AN4 preparation from the project's copy of CMU's archive (fixture an4_prepared in conftest)."""
import io
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pandas as pd
import pytest

from sparse_asr.data.an4 import An4Error, prepare_an4
from sparse_asr.data.manifest import missing_files, read_manifest
from tests.conftest import AN4_ARCHIVE, DATA_DIR, REPO, TEST_MANIFESTS


def load(manifests: Path) -> dict[str, pd.DataFrame]:
    return {name: read_manifest(manifests / f"an4_{name}.csv") for name in ("train", "dev", "test")}


def test_counts_speakers_and_dev_split(an4_manifests):
    splits = load(an4_manifests)
    train, dev, test = splits["train"], splits["dev"], splits["test"]
    assert len(train) + len(dev) == 948 and len(test) == 130
    assert train["speaker"].nunique() + dev["speaker"].nunique() == 74 and test["speaker"].nunique() == 10
    assert not set(train["speaker"]) & set(dev["speaker"]), "dev must be speaker-disjoint from train"
    assert not set(test["speaker"]) & (set(train["speaker"]) | set(dev["speaker"]))
    assert 0.08 <= len(dev) / 948 <= 0.12
    for df in splits.values():
        assert missing_files(df) == []
        assert df["utt_id"].is_unique
        assert (df["duration"] > 0).all()
        # utterance ids name their speaker: an251-fash-b is speaker fash
        assert all(f"-{speaker}-" in utt for utt, speaker in zip(df["utt_id"], df["speaker"]))
    # transcripts as in the corpus files, markers stripped
    first = (train.set_index("utt_id").loc["an251-fash-b"] if "an251-fash-b" in set(train["utt_id"])
             else dev.set_index("utt_id").loc["an251-fash-b"])
    assert first["transcript"] == "YES" and first["duration"] == 1.0  # 16000 samples at 16 kHz
    assert test.set_index("utt_id").loc["an406-fcaw-b", "transcript"] == "RUBOUT G M E F THREE NINE"


def test_manifests_are_relative_to_their_directory(an4_manifests):
    header, first_row = (an4_manifests / "an4_test.csv").read_text().splitlines()[:2]
    assert header == "audio,duration,transcript,utt_id,speaker"
    assert first_row.startswith("../an4/wav/an4test_clstk/")  # datasets/test_manifests -> datasets/an4


def test_license_notice_kept(an4_prepared):
    notice = Path(an4_prepared["license"]).read_text()
    assert "Carnegie Mellon University" in notice and notice == (an4_prepared["root"] / "LICENSE").read_text()


def test_rerun_is_idempotent_and_fast(an4_prepared, capsys):
    files = [an4_prepared[name] for name in ("train", "dev", "test")]
    before = [(f.read_bytes(), f.stat().st_mtime_ns) for f in files]
    start = time.perf_counter()
    again = prepare_an4(AN4_ARCHIVE, DATA_DIR, TEST_MANIFESTS)
    elapsed = time.perf_counter() - start
    out = capsys.readouterr().out
    assert again == an4_prepared
    assert [(f.read_bytes(), f.stat().st_mtime_ns) for f in files] == before
    assert "reusing" in out and out.count("unchanged") == 3 and "extracting" not in out
    assert elapsed < 10, f"a rerun should only re-check, took {elapsed:.1f}s"


def test_extracted_directory_source_gives_same_manifests(an4_prepared, tmp_path):
    paths = prepare_an4(an4_prepared["root"], tmp_path / "data", tmp_path / "manifests")
    assert paths["root"] == an4_prepared["root"]
    for name in ("train", "dev", "test"):
        ours, theirs = read_manifest(paths[name]), read_manifest(an4_prepared[name])
        pd.testing.assert_frame_equal(ours.drop(columns="line"), theirs.drop(columns="line"))


# ---------------------------------------------------------------- a small corpus built from real files

def make_small_corpus(root: Path, src: Path, take: int = 3) -> list[str]:
    """An an4/ tree with the first `take` utterances of each split (real .sph files and etc lines)."""
    kept = []
    for split, wav in (("train", "an4_clstk"), ("test", "an4test_clstk")):
        fileids = (src / "etc" / f"an4_{split}.fileids").read_text().splitlines()[:take]
        transcription = (src / "etc" / f"an4_{split}.transcription").read_text().splitlines()[:take]
        (root / "etc").mkdir(parents=True, exist_ok=True)
        (root / "etc" / f"an4_{split}.fileids").write_text("\n".join(fileids) + "\n")
        (root / "etc" / f"an4_{split}.transcription").write_text("\n".join(transcription) + "\n")
        for entry in fileids:
            (root / "wav" / entry).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / "wav" / f"{entry}.sph", root / "wav" / f"{entry}.sph")
            kept.append(Path(entry).name)
        (root / "wav" / wav).mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src / "LICENSE", root / "LICENSE")
    return kept


def test_problems_are_reported_by_name(an4_prepared, tmp_path):
    root = tmp_path / "an4"
    kept = make_small_corpus(root, an4_prepared["root"])
    no_audio = next(root.glob("wav/an4_clstk/*/*.sph"))
    no_audio.unlink()
    garbage = next(root.glob("wav/an4test_clstk/*/*.sph"))
    garbage.write_bytes(b"this is not audio" * 100)
    stray = no_audio.parent / "an999-fash-b.sph"  # audio nobody lists or transcribes
    shutil.copyfile(next(root.glob("wav/an4_clstk/*/*.sph")), stray)
    with pytest.raises(An4Error) as error:
        prepare_an4(root, tmp_path / "data", tmp_path / "manifests", dev_fraction=0.3)
    message = str(error.value)
    assert f"transcript without audio: {no_audio.stem}" in message
    assert f"unreadable audio: {garbage}" in message
    assert "utterance without transcript: " in message and str(stray) in message
    assert not (tmp_path / "manifests").exists(), "nothing may be written for an incomplete corpus"
    assert len(kept) == 6


def test_command_line_exit_status(an4_prepared, tmp_path):
    root = tmp_path / "an4"
    make_small_corpus(root, an4_prepared["root"])
    command = [sys.executable, "-m", "sparse_asr.data.an4", "--source", str(root), "--data-dir", str(tmp_path / "data"),
               "--manifest-dir", str(tmp_path / "manifests"), "--dev-fraction", "0.3"]
    ok = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert len(read_manifest(tmp_path / "manifests" / "an4_test.csv")) == 3
    next(root.glob("wav/an4test_clstk/*/*.sph")).unlink()
    failed = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert failed.returncode == 1 and "transcript without audio" in failed.stderr


def tarball(path: Path, root: Path, extra: tarfile.TarInfo | None = None) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        tar.add(root, arcname="an4")
        if extra is not None:
            tar.addfile(extra, io.BytesIO(b"x" * extra.size))
    return path


def test_url_source_downloads_verifies_and_extracts(an4_prepared, tmp_path):
    root = tmp_path / "src" / "an4"
    make_small_corpus(root, an4_prepared["root"])
    archive = tarball(tmp_path / "small_an4.tar.gz", root)
    paths = prepare_an4(archive.as_uri(), tmp_path / "data", tmp_path / "manifests", dev_fraction=0.3)
    assert (tmp_path / "data" / "small_an4.tar.gz").read_bytes() == archive.read_bytes()
    assert paths["root"] == (tmp_path / "data" / "an4").resolve()
    assert len(read_manifest(paths["test"])) == 3 and missing_files(read_manifest(paths["test"])) == []
    assert (tmp_path / "data" / "LICENSE.an4").is_file()
    not_tar = tmp_path / "page.html"
    not_tar.write_text("<html>not found</html>")
    with pytest.raises(An4Error, match="not a gzip file"):
        prepare_an4(not_tar.as_uri(), tmp_path / "data2", tmp_path / "manifests2")
    assert not (tmp_path / "data2" / "page.html").exists()


def test_unsafe_archive_is_refused(an4_prepared, tmp_path):
    root = tmp_path / "src" / "an4"
    make_small_corpus(root, an4_prepared["root"])
    escape = tarfile.TarInfo("an4/../../escaped.txt")
    escape.size = 4
    archive = tarball(tmp_path / "evil.tar.gz", root, escape)
    with pytest.raises(An4Error, match="unsafe|outside"):
        prepare_an4(archive, tmp_path / "data", tmp_path / "manifests")
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "data" / "an4").exists()
    outside = tarfile.TarInfo("etc/passwd")
    outside.size = 4
    with pytest.raises(An4Error, match="outside an4/"):
        prepare_an4(tarball(tmp_path / "other.tar.gz", root, outside), tmp_path / "data3", tmp_path / "manifests")
