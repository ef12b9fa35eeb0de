"""Inputs checked before the first step, each refusal one line naming the file, key or tensor: transcripts
outside the alphabet (never folded), checkpoints of another dtype, shape, form or with non-finite values,
numeric settings that make a run meaningless, CUDA-aware MPI without CUDA support, long evaluation utterances,
and every manifest's faults in one error."""
import json

import pandas as pd
import pytest
import torch

from sparse_asr.comm import Communicator
from sparse_asr.data.manifest import read_manifest
from sparse_asr.training.checkpoint import CheckpointError, check_state_fits, index_digest, read_index
from sparse_asr.training.config import ConfigError, load_config
from sparse_asr.training.launch import long_utterances, setup_process
from sparse_asr.training.resume import drop_metrics_after

pytestmark = pytest.mark.unit

HEADER = "audio,duration,transcript,utt_id,speaker\n"


@pytest.mark.parametrize("text", ["STRAßE", "ﬁVE", "ıN"])
def test_a_transcript_outside_the_alphabet_is_named_not_folded(tmp_path, text):
    (tmp_path / "m.csv").write_text(HEADER + f"a.wav,1.0,{text},u1,s\n", encoding="utf-8")
    problems = []
    read_manifest(tmp_path / "m.csv", problems)
    assert len(problems) == 1 and "is not one of the labels" in problems[0] and "m.csv:2" in problems[0], problems


def test_lower_case_transcripts_still_map_to_the_labels(tmp_path):
    (tmp_path / "m.csv").write_text(HEADER + "a.wav,1.0,it's five,u1,s\n")
    assert read_manifest(tmp_path / "m.csv")["transcript"][0] == "it's five"


def test_every_manifests_faults_are_named_together(tmp_path):
    (tmp_path / "latin1.csv").write_bytes(HEADER.encode() + "a.wav,1.0,CAFé,u1,s\n".encode("latin-1"))
    (tmp_path / "rows.csv").write_text(HEADER + "a.wav,long,HELLO,u1,s\n")
    problems = []
    for name in ("latin1.csv", "rows.csv"):
        read_manifest(tmp_path / name, problems)
    assert "latin1.csv:2: not UTF-8 text (byte 0xe9" in problems[0]
    assert "rows.csv:2: duration 'long' is not a number" in problems[1]


def test_state_of_another_dtype_or_with_nan_is_refused_naming_the_tensor():
    expected = {"rnn.weight": torch.zeros(3, 2), "bn.num_batches_tracked": torch.tensor(0)}
    with pytest.raises(CheckpointError, match=r"rnn\.weight is torch\.int64, this run's is torch\.float32"):
        check_state_fits("model", expected, {**expected, "rnn.weight": torch.zeros(3, 2, dtype=torch.int64)})
    with pytest.raises(CheckpointError, match=r"rnn\.weight holds NaN or infinite values"):
        check_state_fits("model", expected, {**expected, "rnn.weight": torch.full((3, 2), float("nan"))})
    check_state_fits("model", expected, dict(expected))


def test_an_index_entry_of_another_form_is_refused_naming_it(tmp_path):
    index = {"format_version": 5, "world_size": "2", "step": 1, "config": {}, "files": {}}
    index["index_sha256"] = index_digest(index)  # hand-made, digest and all
    (tmp_path / "index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"index\.json: world_size must be a positive integer, got '2'"):
        read_index(tmp_path)
    index = {"format_version": 5, "world_size": 1, "step": 1, "config": {}, "files": {"shared.pt": 7}}
    index["index_sha256"] = index_digest(index)
    (tmp_path / "index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"files\.shared\.pt must hold bytes"):
        read_index(tmp_path)


@pytest.mark.parametrize("override, message", [
    ("optim.lr=1e300", r"optim\.lr must be in \(0, 10\]"),
    ("distributed.timeout_s=1e300", r"distributed\.timeout_s must be in \[0, 604800\]"),
])
def test_numeric_settings_that_break_a_run_or_its_guard_are_refused(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_a_latin1_config_is_refused_naming_the_file_and_line(tmp_path):
    (tmp_path / "c.yaml").write_bytes("seed: 1\n# café\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"c\.yaml:2: not UTF-8 text \(byte 0xe9\)"):
        load_config(tmp_path / "c.yaml")


def test_cuda_aware_mpi_is_refused_where_the_mpi_library_has_no_cuda_support():
    comm = Communicator()  # the pip mpich wheel: MPIX_Query_cuda_support() is 0
    with pytest.raises(ConfigError, match=r"cuda_aware_mpi=true, but this MPI library .* has no CUDA support"):
        setup_process(comm, "cpu", cuda_aware=True)
    assert setup_process(comm, "cpu").device.type == "cpu"


def test_a_long_dev_or_test_utterance_is_warned_like_a_training_one():
    def frame(name, durations):
        df = pd.DataFrame({"duration": durations, "line": range(2, 2 + len(durations))})
        df.attrs["manifest"] = name
        return df

    said = long_utterances({"train": frame("train.csv", [3.0]), "dev": frame("dev.csv", [2.0, 600.0]),
                            "test": frame("test.csv", [45.0])})
    assert "1 dev utterance(s) longer than 30 s" in said and "dev.csv:3 (600 s)" in said
    assert "1 test utterance(s) longer than 30 s" in said and "test.csv:2 (45 s)" in said
    assert "training" not in said


def test_a_damaged_metrics_line_drops_only_itself(tmp_path):
    rows = [json.dumps({"kind": "train", "step": s}) + "\n" for s in range(1, 6)]
    rows[1] = '{"kind": "tr\n'  # damaged in the middle (an editor, a bad copy)
    (tmp_path / "metrics.jsonl").write_text("".join(rows))
    said = drop_metrics_after(tmp_path, 5)
    kept = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert kept == [1, 3, 4, 5] and "line 2 was cut or damaged" in said
