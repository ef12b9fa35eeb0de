"""evaluate.py's decoding flags end to end on real AN4 utterances, checkpoint averaging (parameters and BatchNorm
statistics), the choice of checkpoints by dev WER, progress lines and the warnings about unusual inputs."""
import json

import numpy as np
import pytest
import soundfile
import torch

import evaluate
from sparse_asr.comm import Communicator
from sparse_asr.data.domain import TrainingRange, input_warnings
from sparse_asr.models import build_model
from sparse_asr.training.averaging import average_states, averaged_model, choose_checkpoints
from sparse_asr.training.checkpoint import (Progress, RankState, TrainingState, checkpoints_size, rng_state,
                                            save_training_state)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def save_checkpoint(run_dir, step: int, seed: int, train_manifest="manifests/an4_train.csv", keep: int = 10,
                    keep_best: int = 0):
    """A tiny model's checkpoint at `step`, its weights and BatchNorm statistics drawn from `seed`."""
    torch.manual_seed(seed)
    model = build_model("lstman4_tiny")
    with torch.no_grad():
        for parameter in model.parameters():  # (BatchNorm's weights start at 1 in every model)
            parameter.add_(0.01 * torch.randn_like(parameter))
        for name, buffer in model.named_buffers():
            if buffer.is_floating_point():
                buffer.uniform_(0.5, 2.0) if "var" in name else buffer.normal_()
    config = {"model": {"name": "lstman4_tiny"}, "data": {"train_manifest": str(train_manifest)}}
    state = TrainingState(config=config, model=model.state_dict(), optimizer={}, progress=Progress(step=step),
                          mine=RankState({}, rng_state(), {}, {}))
    save_training_state(Communicator(), run_dir / "checkpoints", state, keep=keep, keep_best=keep_best)
    return model.state_dict()


def write_dev_scores(run_dir, scores: dict[int, float]):
    rows = [{"kind": "dev", "step": step, "epoch": i, "time": 0.0, "dev/wer": wer}
            for i, (step, wer) in enumerate(scores.items())]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.unit
def test_averaging_two_checkpoints_gives_the_mean_of_their_parameters_and_batchnorm_statistics(tmp_path):
    first, second = save_checkpoint(tmp_path, 10, seed=1), save_checkpoint(tmp_path, 20, seed=2)
    write_dev_scores(tmp_path, {10: 0.5, 20: 0.4})
    state, shared, chosen = averaged_model(tmp_path, 2, by="last")
    assert [p.name for p, _ in chosen] == ["step-00000010", "step-00000020"] and shared["progress"]["step"] == 20
    statistics = [k for k in state if "running_mean" in k or "running_var" in k]
    assert statistics and any("weight" in k for k in state)
    for key, value in state.items():
        if value.is_floating_point():
            assert torch.allclose(value, (first[key] + second[key]) / 2, atol=1e-7), key
            assert not torch.equal(first[key], second[key]), key  # (a mean of two different tensors)
        else:  # num_batches_tracked: a counter, the newest's
            assert torch.equal(value, second[key])
    with pytest.raises(Exception, match="different models"):
        average_states([first, {**second, "extra": torch.zeros(1)}])


@pytest.mark.unit
def test_the_best_checkpoints_by_dev_wer_are_chosen_and_too_few_is_an_error(tmp_path):
    for step, seed in ((10, 1), (20, 2), (30, 3)):
        save_checkpoint(tmp_path, step, seed)
    write_dev_scores(tmp_path, {10: 0.30, 20: 0.50, 30: 0.35})
    assert [(p.name, w) for p, w in choose_checkpoints(tmp_path, 2, "dev")] == [("step-00000010", 0.30),
                                                                                ("step-00000030", 0.35)]
    assert [p.name for p, _ in choose_checkpoints(tmp_path, 2, "last")] == ["step-00000020", "step-00000030"]
    with pytest.raises(Exception, match="4 checkpoints to average by dev, but only 3 qualify"):
        choose_checkpoints(tmp_path, 4, "dev")


@pytest.mark.unit
def test_training_keeps_the_best_checkpoints_by_dev_wer_besides_the_newest(tmp_path):
    """keep 1 newest and the 2 best: each save prunes what neither rule nor a link (last) keeps."""
    scores = {}
    for step, wer in ((10, 0.6), (20, 0.3), (30, 0.5), (40, 0.4), (50, 0.7)):
        scores[step] = wer
        write_dev_scores(tmp_path, scores)  # the trainer's dev row is on disk before its checkpoint
        save_checkpoint(tmp_path, step, seed=step, keep=1, keep_best=2)
    kept = sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*"))
    assert kept == ["step-00000020", "step-00000040", "step-00000050"]
    count, size = checkpoints_size(tmp_path / "checkpoints")
    assert count == 3 and size > 3 * sum(v.numel() * 4 for v in build_model("lstman4_tiny").state_dict().values())


def test_evaluate_decodes_with_a_beam_an_lm_and_averaged_checkpoints(tiny_manifest, tmp_path, capsys, monkeypatch):
    """The new flags on 8 real AN4 utterances: every score names its decoder, greedy beside the beam; --lm auto
    builds the LM from the training manifest into lm/ of the working directory."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    save_checkpoint(run, 10, seed=1, train_manifest=tiny_manifest)
    save_checkpoint(run, 20, seed=2, train_manifest=tiny_manifest)
    write_dev_scores(run, {10: 0.9, 20: 0.8})
    evaluate.main([str(run), "--manifest", str(tiny_manifest), "--decoder", "beam", "--beam-size", "4",
                   "--lm-weight", "0.5", "--word-score", "1", "--worst", "2", "--average", "2"])
    out = capsys.readouterr().out
    assert "averaged 2 checkpoints by dev: step-00000010 (dev WER 0.9000), step-00000020 (dev WER 0.8000)" in out
    assert "decoder: beam 4 + lexicon + 3-gram LM (lm_weight 0.5, word_score 1)" in out and "decoder: greedy" in out
    assert out.count("  wer  ") == 2 and "worst 2 utterances" in out
    assert (tmp_path / "lm" / "tiny-3gram" / "lm.arpa").is_file()
    evaluate.main([str(run / "checkpoints" / "last"), "--manifest", str(tiny_manifest), "--decoder", "beam",
                   "--lm", "none", "--beam-size", "4", "--worst", "0"])
    assert "decoder: beam 4\n" in capsys.readouterr().out
    evaluate.main([str(run), "--manifest", str(tiny_manifest), "--decoder", "beam", "--tune-on", str(tiny_manifest),
                   "--worst", "0"])
    out = capsys.readouterr().out
    tuned = json.loads((tmp_path / "lm" / "tiny-3gram" / "tuned.json").read_text())
    assert len(tuned["grid"]) == 60 and f"best: beam {tuned['best']['beam_size']}" in out
    assert f"beam settings (tuned on {tiny_manifest}" in out
    assert f"decoder: beam {tuned['best']['beam_size']} + lexicon + 3-gram LM (lm_weight " in out
    with pytest.raises(SystemExit):
        evaluate.parse_args([str(run), "--manifest", "m.csv", "--beam-size", "4"])  # a beam setting without a beam
    with pytest.raises(SystemExit):
        evaluate.parse_args([str(run), "--manifest", "m.csv", "--decoder", "beam", "--tune-on", "an4_test.csv"])


@pytest.mark.unit
def test_inputs_unlike_the_training_data_are_named():
    training = TrainingRange(0.7, 6.4)
    quiet, loud = torch.full((16000,), 1e-4), 0.05 * torch.randn(16000, generator=torch.Generator().manual_seed(0))
    assert input_warnings("a.wav", loud, 16000, training) == []
    assert input_warnings("long.wav", loud.repeat(14), 16000, training) == [
        "long.wav: 14.0 s long, far outside the training utterances' 0.7-6.4 s"]
    assert input_warnings("q.wav", quiet, 16000, training) == [
        "q.wav: near-silent (RMS -80 dBFS; training audio is above -45)"]


def test_evaluate_warns_about_converted_silent_and_long_audio(tiny_manifest, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    save_checkpoint(tmp_path / "run", 10, seed=1, train_manifest=tiny_manifest)
    rng = np.random.default_rng(0)
    soundfile.write(tmp_path / "cd.wav", 0.1 * rng.standard_normal((44100, 2)), 44100)
    soundfile.write(tmp_path / "silent.wav", np.zeros(16000), 16000)
    soundfile.write(tmp_path / "long.wav", 0.1 * rng.standard_normal(16000 * 30), 16000)
    evaluate.main([str(tmp_path / "run"), "--audio", "cd.wav", "silent.wav", "long.wav"])
    out = capsys.readouterr().out
    assert "warning: cd.wav: 2 channels averaged to mono; resampled from 44100 Hz to 16000 Hz" in out
    assert "warning: silent.wav: near-silent" in out and "warning: long.wav: 30.0 s long, far outside" in out


@pytest.mark.unit
def test_progress_is_quiet_on_short_work_and_counts_long_work(capsys, monkeypatch):
    clock = iter([0.0, 1.0, 2.0, 12.0, 13.0, 25.0])
    monkeypatch.setattr(evaluate.time, "perf_counter", lambda: next(clock))
    progress = evaluate.Progress("set")  # started at 0
    progress(10, 100)  # 1 s: quiet
    progress(20, 100)  # 2 s: quiet
    progress(60, 100)  # 12 s: a line, 8 s to go
    progress(70, 100)  # 13 s: quiet again
    progress(100, 100)  # 25 s
    assert capsys.readouterr().out.splitlines() == ["set: 60/100 utterances, 12 s, about 8 s to go",
                                                    "set: 100/100 utterances, 25 s, about 0 s to go"]


def test_training_with_the_beam_scores_dev_and_test_with_both_decoders(tiny_manifest, tmp_path, monkeypatch, capsys):
    """train.eval_decoder=beam: dev/wer (and so checkpoints/best) stays greedy, dev/beam_wer beside it; the run's
    end names its checkpoints' size."""
    from sparse_asr.training.runlog import read_metrics
    from tests.mpi.train_common import run_training, tiny_overrides

    monkeypatch.chdir(tmp_path)
    run_training(tiny_overrides(tiny_manifest.parent, tmp_path, "beam", data__train_manifest=tiny_manifest,
                                data__dev_manifest=tiny_manifest, data__test_manifest=tiny_manifest,
                                data__max_train_utterances=0, data__max_eval_utterances=0, train__epochs=1,
                                train__eval_decoder="beam"))
    rows = [r for r in read_metrics(tmp_path / "beam") if r["kind"] in ("dev", "test")]
    assert [r["kind"] for r in rows] == ["dev", "test"]
    assert {"dev/wer", "dev/beam_wer", "dev/beam_cer"} <= set(rows[0]) and "test/beam_wer" in rows[1]
    out = capsys.readouterr().out
    assert "greedy: wer" in out and "checkpoints kept" in out
    assert "; beam 64 + lexicon + 3-gram LM (lm_weight 1.5, word_score 2)" in out
