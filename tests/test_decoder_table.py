"""bench/decoder_table.py on real emissions of kept verdict runs, cut to a few AN4 utterances: the paired figures
are each seed's relative difference averaged, the averaged column decodes the run's averaged-model file with the
run's own LM settings, and --reuse takes exactly the rows whose inputs did not change."""
import json
import shutil
from pathlib import Path

import pytest

from bench.decoder_table import AVERAGED, COLUMNS, main, markdown, summary
from sparse_asr.decoding import BeamDecoder, BeamSettings, decode_each
from sparse_asr.decoding.lm import lm_dir_for, lm_files
from sparse_asr.decoding.tune import references
from sparse_asr.stats import paired_interval
from sparse_asr.training.emissions import load_emissions, save_emissions
from sparse_asr.training.scoring import ErrorCounts

KEPT = Path(__file__).resolve().parent.parent / "docs/results/verdict_p4x4/runs"
UTTERANCES = 8


def cut(source: Path, into: Path, n: int) -> None:
    ids, log_probs = load_emissions(source)
    save_emissions(into, ids[:n], log_probs[:n])


def test_the_table_pairs_by_seed_and_reuses_only_unchanged_rows(an4_manifests, tmp_path, monkeypatch, capsys):
    runs = tmp_path / "runs"
    sources = {"dense-s1": "dense-s6", "oktopk-s1": "oktopk-s6", "dense-s2": "dense-s7", "oktopk-s2": "oktopk-s7"}
    # an "averaged model" unlike the run's last one: the other arm's test emissions of the same seed
    averaged_sources = {"dense-s1": "oktopk-s6", "oktopk-s1": "dense-s6", "dense-s2": "oktopk-s7"}
    for name, source in sources.items():
        (runs / name).mkdir(parents=True)
        for split in ("dev", "test"):
            cut(KEPT / source / f"emissions_{split}.npz", runs / name / f"emissions_{split}.npz", UTTERANCES)
    for name, source in averaged_sources.items():  # oktopk-s2 keeps none: seed 2 has no averaged pair
        cut(KEPT / source / "emissions_test.npz", runs / name / "emissions_test_avg2_last.npz", UTTERANCES)
    # the training logs: oktopk-s1's is that of a run that never left CTC's plateau; seed 2's runs keep none
    for name in ("dense-s1", "oktopk-s1"):
        shutil.copy(KEPT / {"dense-s1": "dense-s6", "oktopk-s1": "oktopk-s8"}[name] / "metrics.jsonl.xz", runs / name)
    monkeypatch.chdir(tmp_path)  # the LM is built under ./lm
    out = tmp_path / "table.json"
    argv = [str(runs), "--train-manifest", str(an4_manifests / "an4_train.csv"),
            "--dev-manifest", str(an4_manifests / "an4_dev.csv"),
            "--test-manifest", str(an4_manifests / "an4_test.csv"), "--out", str(out), "--reuse"]

    assert main(argv) == 0
    first = json.loads(out.read_text())
    rows = first["rows"]
    assert sorted(rows) == ["dense-s1", "dense-s2", "oktopk-s1", "oktopk-s2"]
    assert "taken from" not in capsys.readouterr().out
    defined = [c for c in COLUMNS if all(rows[f"dense-s{s}"]["wer"][c] > 0 for s in (1, 2))]
    assert "greedy" in defined  # greedy is exact on stored emissions: these utterances hold errors
    for column in defined:
        diffs = [100 * (rows[f"oktopk-s{s}"]["wer"][column] / rows[f"dense-s{s}"]["wer"][column] - 1) for s in (1, 2)]
        interval = paired_interval(diffs)
        line = next(line for line in first["table"].splitlines() if line.startswith("| oktopk | 2 |"))
        assert f"{interval.mean:+.1f}% [{interval.low:+.1f}%, {interval.high:+.1f}%]" in line, (column, line)

    lexicon, arpa = lm_files(lm_dir_for(str(an4_manifests / "an4_train.csv"), 3))
    for name, source in averaged_sources.items():  # decoded from its own file, with the run's dev-tuned LM settings
        tuned = rows[name]["tuned"]["lm"]
        decoder = BeamDecoder(BeamSettings(tuned["beam_size"], tuned["lm_weight"], tuned["word_score"]), lexicon, arpa)
        ids, log_probs = load_emissions(runs / name / "emissions_test_avg2_last.npz")
        counts = ErrorCounts()
        for ref, hyp in zip(references(str(an4_manifests / "an4_test.csv"), ids), decode_each(decoder, log_probs)):
            counts.add(ref, hyp)
        assert rows[name]["wer"][AVERAGED] == pytest.approx(counts.summary()["wer"]), name
    assert AVERAGED not in rows["oktopk-s2"]["wer"]
    assert rows["dense-s1"]["wer"][AVERAGED] != rows["dense-s1"]["wer"]["beam + lexicon + LM"]  # the file matters
    averaged_pair = 100 * (rows["oktopk-s1"]["wer"][AVERAGED] / rows["dense-s1"]["wer"][AVERAGED] - 1)
    line = next(line for line in first["table"].splitlines() if line.startswith("| oktopk | 2 |"))
    assert line.rstrip(" |").endswith(f"{averaged_pair:+.1f}% (n = 1)"), line  # one seed: a mean, no interval

    assert ("oktopk on the seeds where a run stayed on the plateau (dev WER never < 0.8): seed 1 "
            in first["summary"])
    assert "no training log, so not known to have left CTC's plateau: dense-s2 oktopk-s2" in first["summary"]

    assert main(argv + ["--tabulate"]) == 0  # decodes nothing, tables the rows as they are
    assert "tuning on" not in capsys.readouterr().out
    assert json.loads(out.read_text()) == first
    assert main(argv) == 0  # nothing changed: every row is taken as it was
    assert capsys.readouterr().out.count("its inputs are unchanged") == 4
    assert json.loads(out.read_text())["rows"] == rows

    cut(KEPT / "oktopk-s7" / "emissions_test.npz", runs / "oktopk-s2" / "emissions_test.npz", UTTERANCES - 3)
    assert main(argv) == 0  # one run's test emissions changed: that row alone is decoded again
    printed = capsys.readouterr().out
    assert printed.count("its inputs are unchanged") == 3 and "oktopk-s2: tuning on" in printed, printed
    again = json.loads(out.read_text())["rows"]
    assert again["oktopk-s2"]["utterances"] == UTTERANCES - 3
    assert {k: v for k, v in again.items() if k != "oktopk-s2"} == {k: v for k, v in rows.items() if k != "oktopk-s2"}
    shutil.rmtree(runs / "dense-s2")
    (runs / "dense-s3").mkdir()
    for split in ("dev", "test"):
        cut(KEPT / "dense-s8" / f"emissions_{split}.npz", runs / "dense-s3" / f"emissions_{split}.npz", UTTERANCES)
    with pytest.raises(SystemExit, match=r"--tabulate: .* has no row for dense-s3: decode them first"):
        main(argv + ["--tabulate"])


@pytest.mark.unit
def test_reuse_needs_the_table_it_reuses(tmp_path):
    with pytest.raises(SystemExit, match="--reuse takes its rows from the --out file"):
        main([str(tmp_path), "--reuse"])


@pytest.mark.unit
def test_the_summary_by_hand():
    """Seed 1: dense greedy 0.5 -> lexicon 0.25 (-50%) -> LM 0.2; oktopk 0.5 -> 0.375 -> 0.25, gaps 0% greedy and
    +25% with LM (moved +25 points). Seed 2: dense 0.25 -> 0.2 (-20%) -> 0.2 (LM equal); oktopk 0.375 -> 0.3 ->
    0.3125 (LM higher), gaps +50% and +56.25% (moved +6.25). Seed 3: oktopk never left the plateau."""
    def row(greedy, lexicon, lm, beam=None):
        return {"wer": {"greedy": greedy, "beam": beam or greedy, "beam + lexicon": lexicon,
                        "beam + lexicon + LM": lm}}
    rows = {"dense-s1": row(0.5, 0.25, 0.2, beam=0.51), "dense-s2": row(0.25, 0.2, 0.2),
            "oktopk-s1": row(0.5, 0.375, 0.25), "oktopk-s2": row(0.375, 0.3, 0.3125),
            "dense-s3": row(0.25, 0.2, 0.15), "oktopk-s3": row(0.75, 0.7, 0.6)}
    rows["dense-s1"]["wer"][AVERAGED] = 0.16
    rows["oktopk-s1"]["wer"][AVERAGED] = 0.3
    plateau = {name: name == "oktopk-s3" for name in rows}
    lines = summary(rows, plateau).splitlines()
    assert lines[1] == "- the lexicon, greedy -> beam + lexicon, on dense's 3 runs: -50.0% to -20.0% (mean -30.0%)"
    assert lines[2] == "- a lexicon-free beam against greedy: at most 2.0% on any of 6 runs"
    assert lines[3] == "- the LM, beam + lexicon -> + LM: lower on 4 of 6 runs, higher on 1 (oktopk-s2), equal on 1"
    assert lines[4] == ("- the averaged checkpoints against the last model, both beam + lexicon + LM: lower on 1 of 2 "
                        "runs (by up to 20.0%), higher on 1 (by up to 20.0%)")
    assert lines[5] == ("- oktopk against dense on the 2 seeds where both left CTC's plateau: gap +0.0% to +50.0% "
                        "(mean +25.0%) greedy, +25.0% to +56.2% (mean +40.6%) with beam + lexicon + LM; moved by "
                        "+6.2 to +25.0 (mean +15.6) points")
    assert lines[6] == ("- oktopk on the seeds where a run stayed on the plateau (dev WER never < 0.8): seed 3 "
                        "+200.0% greedy -> +300.0% with LM")
    assert len(lines) == 7


@pytest.mark.unit
def test_a_column_whose_second_decode_differs_shows_both():
    rows = {"dense-s1": {"wer": {"greedy": 0.25, "beam + lexicon": 0.2109},
                         "second_decode": {"beam + lexicon": 0.2096}}}
    line = markdown(rows, ("greedy", "beam + lexicon")).splitlines()[2]
    assert line == "| dense-s1 | 0.2500 | 0.2109 (again: 0.2096) |"


@pytest.mark.unit
def test_runs_are_listed_by_algorithm_then_seed_as_a_number():
    rows = {name: {"wer": {"greedy": 0.25}} for name in ("oktopk-s2", "dense-s10", "dense-s9", "dense-s1")}
    names = [line.split(" | ")[0][2:] for line in markdown(rows, ("greedy",)).splitlines()[2:6]]
    assert names == ["dense-s1", "dense-s9", "dense-s10", "oktopk-s2"]
