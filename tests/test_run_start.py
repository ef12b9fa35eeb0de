"""Starting a run (train.py): a directory holding a previous run is never reused silently (refused unless
--overwrite or resuming); a refused start leaves no run directory behind; every audio file is checked
before the first step and every bad manifest line is named at once. One process, the tiny model on real
AN4 utterances (the 2-rank audio check is in test_runtime.py)."""
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile

from sparse_asr.data.audio import AudioError
from sparse_asr.data.manifest import ManifestError, read_manifest, write_manifest
from sparse_asr.training.config import ConfigError
from sparse_asr.training.trainer import Trainer
from tests.mpi.train_common import SMOKE_CONFIG, read_metrics, run_training, step_losses, tiny_overrides

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
REPO = Path(__file__).resolve().parent.parent


def on(manifests: dict, out_dir: Path, name: str, **settings) -> list[str]:
    """Overrides for a run on these train/dev/test manifests, every row used."""
    data = {f"data__{split}_manifest": path for split, path in manifests.items()}
    return tiny_overrides(out_dir, out_dir, name, data__max_train_utterances=0, data__max_eval_utterances=0,
                          **data, **settings)


def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_a_previous_run_is_refused_untouched_then_replaced_with_overwrite(tiny_manifest, tmp_path, capsys):
    overrides = on({"train": tiny_manifest, "dev": tiny_manifest, "test": tiny_manifest}, tmp_path, "run",
                   train__epochs=1)
    run_training(overrides)
    run_dir = tmp_path / "run"
    (run_dir / "notes.txt").write_text("mine")
    before = snapshot(run_dir)
    with pytest.raises(FileExistsError) as error:
        run_training(overrides)
    assert str(error.value).startswith(f"run directory {run_dir} holds a previous run (config.yaml, metrics.jsonl, "
                                       f"checkpoints, provenance.jsonl, events.out.tfevents.")
    assert "--resume" in str(error.value) and "--overwrite" in str(error.value)
    assert snapshot(run_dir) == before  # byte-identical: the refused run wrote nothing

    capsys.readouterr()
    run_training(overrides + ["train.epochs=2"], overwrite=True)
    assert "--overwrite: deleted the previous run's config.yaml, metrics.jsonl, checkpoints, provenance.jsonl, " \
           "events.out.tfevents." \
           in capsys.readouterr().out
    assert sorted(step_losses(run_dir)) == [1, 2, 3, 4]  # only the new run's curve: 2 epochs x 2 steps
    assert [m["epoch"] for m in read_metrics(run_dir) if m["kind"] == "epoch"] == [1, 2]
    assert len(list(run_dir.glob("events.out.tfevents.*"))) == 1
    assert "epochs: 2" in (run_dir / "config.yaml").read_text()
    assert (run_dir / "notes.txt").read_text() == "mine"  # not a run file: kept

    last = str(run_dir)
    with pytest.raises(ConfigError, match="--overwrite starts the run afresh and --resume continues it"):
        run_training(overrides, resume=last, overwrite=True)
    run_training(overrides + ["train.epochs=3"], resume=last)  # resuming continues in the directory
    assert sorted(step_losses(run_dir)) == [1, 2, 3, 4, 5, 6]


def cut(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


@pytest.mark.parametrize("case", ["missing manifest", "bad header", "too few utterances", "truncated audio",
                                  "missing audio", "run directory is a file"])
def test_a_refused_start_leaves_no_run_directory(case, tiny_manifest, tmp_path):
    manifest = tmp_path / "m.csv"
    df = read_manifest(tiny_manifest)
    settings = {}
    if case == "missing manifest":
        manifest, error = tmp_path / "absent.csv", (ManifestError, "does not exist")
    elif case == "bad header":
        manifest.write_text("path,seconds,text\n")
        error = (ManifestError, r"m\.csv:1: neither our header")
    elif case == "too few utterances":
        write_manifest(df, manifest)
        settings, error = {"train__global_batch_size": 16}, (ConfigError, "gives 8 utterances, fewer than one global "
                                                                        r"batch \(train.global_batch_size=16\)")
    elif case == "truncated audio":
        copy = tmp_path / "cut.sph"
        shutil.copyfile(df["audio"][4], copy)
        cut(copy)
        df.loc[4, "audio"] = str(copy)
        write_manifest(df, manifest)
        error = (AudioError, rf"m\.csv:6: {copy}: truncated")
    elif case == "missing audio":
        df.loc[2, "audio"] = str(tmp_path / "gone.sph")
        write_manifest(df, manifest)
        error = (AudioError, rf"m\.csv:4: {tmp_path / 'gone.sph'}: file does not exist")
    else:
        write_manifest(df, manifest)
        (tmp_path / "runs").mkdir()
        (tmp_path / "runs" / "refused").write_text("a file")
        error = (FileExistsError, "exists and is not a directory")
    before = snapshot(tmp_path)
    with pytest.raises(error[0], match=error[1]):
        run_training(on({"train": manifest, "dev": manifest, "test": manifest}, tmp_path / "runs", "refused",
                        **settings))
    assert snapshot(tmp_path) == before  # not even out_dir was created


def test_every_bad_audio_file_is_named_before_the_first_step(tiny_manifest, tmp_path, monkeypatch):
    steps = []
    monkeypatch.setattr(Trainer, "train_step", lambda self, batch: steps.append(1))
    df = read_manifest(tiny_manifest)
    audio = tmp_path / "audio"
    audio.mkdir()
    for i, path in enumerate(df["audio"]):
        df.loc[i, "audio"] = str(shutil.copyfile(path, audio / Path(path).name))
    samples, rate = soundfile.read(df["audio"][0], dtype="int16")
    declared = soundfile.info(df["audio"][3]).frames
    cut(Path(df["audio"][3]))  # line 5
    soundfile.write(audio / "eight_khz.wav", samples[::2], 8000, subtype="PCM_16")
    soundfile.write(audio / "stereo.wav", np.stack([samples, samples], 1), rate, subtype="PCM_16")
    df.loc[5, "audio"], df.loc[6, "audio"] = str(audio / "eight_khz.wav"), str(audio / "stereo.wav")  # lines 7, 8
    df.loc[1, "duration"] += 1.0  # line 3
    write_manifest(df, tmp_path / "train.csv")
    test = read_manifest(tiny_manifest)
    test.loc[0, "audio"] = str(tmp_path / "nowhere" / "a.sph")  # line 2
    write_manifest(test, tmp_path / "test.csv")

    with pytest.raises(AudioError) as error:
        run_training(on({"train": tmp_path / "train.csv", "dev": tiny_manifest, "test": tmp_path / "test.csv"},
                        tmp_path / "runs", "bad"))
    train_csv, test_csv, seconds = tmp_path / "train.csv", tmp_path / "test.csv", df["duration"][1] - 1.0
    assert str(error.value).splitlines() == [
        "5 of 24 manifest rows have audio that cannot be used (checked before training):",
        f"  {test_csv}:2: {tmp_path / 'nowhere' / 'a.sph'}: file does not exist",
        f"  {train_csv}:3: {df['audio'][1]}: holds {seconds:.3f} s of audio, the manifest says {seconds + 1:.3f} s",
        f"  {train_csv}:5: {df['audio'][3]}: truncated: header declares {declared} samples, file holds "
        f"{soundfile.info(df['audio'][3]).frames}",
        f"  {train_csv}:7: {audio / 'eight_khz.wav'}: sample rate 8000 Hz, expected 16000 Hz",
        f"  {train_csv}:8: {audio / 'stereo.wav'}: 2 channels, expected mono"]
    assert steps == [] and not (tmp_path / "runs").exists()


def walk(*arguments: str) -> str:
    """bench/config_walk.py's table (and --list's stops) for these arguments."""
    done = subprocess.run([sys.executable, "bench/config_walk.py", "--list", *arguments], cwd=REPO, text=True,
                          capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_configuration_walks_through_start_up_inside_the_package_parsed_and_resolved_once(an4_manifests,
                                                                                              tmp_path):
    """bench/config_walk.py traces start-up (read_request, run_job) up to training: every function that receives
    the configuration is the package's (none climbs back into train.py, scripts/ or bench/), the walk passes where
    the configuration is used (the one checker, the plan, the exchange, the trainer), so an empty trace cannot
    pass; and the configuration is parsed once and resolved once."""
    overrides = [o for o in tiny_overrides(an4_manifests, tmp_path, "walk", compression__algorithm="oktopk")
                 if not o.startswith(("out_dir=", "name="))]  # the walk's own throw-away directory
    out = walk("--config", str(SMOKE_CONFIG), *overrides)
    stops = [line.strip().split(": ", 1) for line in out.splitlines() if line.startswith("  ") and ".py: " in line]
    assert [module for module, _ in stops if not module.startswith("sparse_asr/")] == []
    assert {"check", "prepare_run", "build_exchange", "Trainer.__init__"} <= {function for _, function in stops}
    row = out.splitlines()[-1].split(" | ")
    assert row[1:2] == ["fresh"] and row[5:7] == ["1", "1"], out  # parses, resolutions
    assert "check x" not in row[7] and "resolve" not in row[7], out


def test_a_resume_builds_one_plan_from_one_reading_of_each_config(an4_manifests, tmp_path, monkeypatch):
    """A resumed start (here with a safe change) reads the checkpoint's saved config once and the request's
    overrides onto it once, resolves once and builds one plan; a fresh start parses its config once."""
    from sparse_asr.training import config, launch, resume

    counts = {"parses": 0, "resolutions": 0, "plans": 0}

    def counting(module, name, key):
        original = getattr(module, name)

        def counted(*args, **kwargs):
            counts[key] += 1
            return original(*args, **kwargs)
        monkeypatch.setattr(module, name, counted)

    counting(config, "build_config", "parses")  # load_config's and the checkpoint's (resume.py's own name below)
    counting(resume, "build_config", "parses")
    counting(resume, "resolve_world_size", "resolutions")
    counting(launch, "resolve_world_size", "resolutions")
    counting(launch, "RunPlan", "plans")
    run_training(tiny_overrides(an4_manifests, tmp_path, "once", train__epochs=1))
    assert counts == {"parses": 1, "resolutions": 1, "plans": 1}
    counts.update(parses=0, resolutions=0, plans=0)
    run_training(["train.epochs=2"], resume=str(tmp_path / "once"), config=None)
    assert counts == {"parses": 2, "resolutions": 1, "plans": 1}  # the saved config, then with train.epochs=2
    assert sorted(step_losses(tmp_path / "once")) == list(range(1, 9))
