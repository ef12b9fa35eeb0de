"""bench/accuracy.sh: a tiny real benchmark (lstman4_tiny, 8 utterances, 1 epoch, 2 ranks, two algorithms)
must write one table with a row of real figures per algorithm; bad arguments fail before any training."""
import itertools
import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sparse_asr.models import build_model
from sparse_asr.models.sync_batchnorm import SyncBatchNorm
from tests.reference import ring_allreduce_bytes

pytestmark = pytest.mark.tooling

REPO = Path(__file__).resolve().parent.parent


def accuracy_sh(*args, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "bench/accuracy.sh", *map(str, args)], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def table_rows(markdown: str) -> dict[str, dict[str, str]]:
    """The first table's rows (the benchmark's own; paired.md's follows it), by run."""
    lines = markdown.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    table = list(itertools.takewhile(lambda line: line.startswith("|"), lines[first:]))
    header = [cell.strip() for cell in table[0].strip("|").split("|")]
    rows = [dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")))) for line in table[2:]]
    return {row["run"]: row for row in rows}


def tiny_args(manifests: Path, out: Path) -> list:
    return ["-c", "configs/smoke.yaml", "-n", "2", "-e", "1", "-a", "dense topka", "-o", out,
            *(f"data.{s}_manifest={manifests / f'an4_{s}.csv'}" for s in ("train", "dev", "test")),
            "data.max_train_utterances=8", "data.max_eval_utterances=4", "model.sync_batchnorm=true",
            "compression.density=0.05"]


@pytest.fixture(scope="module")
def tiny_benchmark(an4_manifests, tmp_path_factory) -> Path:
    """One real benchmark over two seeds (dense and topka at seeds 2 and 1: four runs), shared by the tests below
    (one launch of the four trainings, on one xdist worker: their group; a test that changes a run works on its own
    copy)."""
    out = tmp_path_factory.mktemp("accuracy") / "acc"
    proc = accuracy_sh(*tiny_args(an4_manifests, out), "--seeds", "2 1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


@pytest.mark.mpi
@pytest.mark.xdist_group("tiny_benchmark")
def test_tiny_benchmark_writes_one_table_of_real_figures(tiny_benchmark, an4_manifests):
    out = tiny_benchmark
    markdown = (out / "accuracy.md").read_text()
    assert "smoke, lstman4_tiny, 2 rank(s), 1 epochs, seeds 2 1" in markdown and "sync_batchnorm true" in markdown
    rows = table_rows(markdown)
    assert set(rows) == {"dense-s2", "topka-s2", "dense-s1", "topka-s1"}, markdown
    # per optimizer step, each rank receives the BatchNorm statistics (2C+1 float64) and gradient sums (2C float32)
    syncbn = sum(ring_allreduce_bytes(2 * m.num_features + 1, 2, 8) + ring_allreduce_bytes(2 * m.num_features, 2, 4)
                 for m in build_model("lstman4_tiny", sync_bn=object()).modules() if isinstance(m, SyncBatchNorm))
    for run, row in rows.items():
        assert (row["P"], row["steps"], row["model"]) == ("2", "2", "lstman4_tiny"), row
        for key in ("final_dev_wer", "best_dev_wer", "test_wer", "test_cer", "step_ms", "bytes_recv_per_step"):
            assert math.isfinite(float(row[key])) and float(row[key]) > 0, (run, key, row)
        assert float(row["syncbn_bytes_per_step"]) == syncbn, row
        assert (out / "runs" / run / "checkpoints" / "last" / "index.json").is_file()
        assert f"done: {out / 'runs' / run}" in (out / "logs" / f"{run}.log").read_text()
    # dense reaches its own best dev WER (x 1.05) by definition, at a step of the run and the bytes received by then
    dense = rows["dense-s1"]
    assert float(dense["target_dev_wer"]) == pytest.approx(float(dense["best_dev_wer"]) * 1.05, rel=1e-3)
    assert 1 <= int(dense["step_at_target"]) <= 2 and float(dense["bytes_at_target"]) > 0, dense
    dense_bytes = ring_allreduce_bytes(sum(p.numel() for p in build_model("lstman4_tiny").parameters()), 2)
    assert float(dense["bytes_recv_per_step"]) == pytest.approx(dense_bytes, rel=1e-3)
    assert float(rows["topka-s1"]["bytes_recv_per_step"]) < dense_bytes / 5  # density 0.05
    for name in ("curves_vs_step.png", "curves_vs_bytes.png", "results.csv", "wer_vs_time.md"):
        assert (out / name).stat().st_size > 0, name
    # the same command again neither trains nor reopens the finished runs (a resume would score the test set
    # again and rewrite their files): the runs' files are untouched and the table is the same
    files = {p: p.read_bytes() for p in (out / "runs").rglob("*") if p.is_file()}
    proc = accuracy_sh(*tiny_args(an4_manifests, out), "--seeds", "2 1", "--dry-run")
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout + proc.stderr
    assert proc.stderr.count("finished (1 epochs and its test WER") == 4, proc.stderr
    proc = accuracy_sh(*tiny_args(an4_manifests, out), "--seeds", "2 1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    again = table_rows((out / "accuracy.md").read_text())
    for run, row in rows.items():
        assert (again[run]["steps"], again[run]["test_wer"]) == (row["steps"], row["test_wer"])
        log = (out / "logs" / f"{run}.log").read_text()
        assert log.count(f"done: {out / 'runs' / run}") == 1 and log.count("step 1: gradient exchange") == 1
    assert {p: p.read_bytes() for p in (out / "runs").rglob("*") if p.is_file()} == files
    # asked for more epochs than they have, all four resume from their last checkpoint
    args = tiny_args(an4_manifests, out)
    args[args.index("-e") + 1] = "2"
    proc = accuracy_sh(*args, "--seeds", "2 1", "--dry-run")
    assert proc.returncode == 0 and proc.stdout.count("--resume") == 4, proc.stdout + proc.stderr


@pytest.mark.mpi
@pytest.mark.xdist_group("tiny_benchmark")
def test_tiny_benchmark_over_seeds_pairs_every_algorithm_with_dense(tiny_benchmark, an4_manifests, tmp_path):
    """--seeds: every algorithm at every seed, runs <algorithm>-s<seed>; paired.md compares topka with dense
    seed by seed from the same runs that results.csv tables; each run's target is dense's at its seed."""
    out = tmp_path / "acc"
    shutil.copytree(tiny_benchmark, out)  # this test cuts a run short: on its own copy
    runs = ["dense-s2", "topka-s2", "dense-s1", "topka-s1"]
    for name, seed in zip(runs, (2, 2, 1, 1)):
        assert f"seed: {seed}\n" in (out / "runs" / name / "config.yaml").read_text(), name
    markdown = (out / "accuracy.md").read_text()
    assert "--seeds '2 1'" in markdown
    results = pd.read_csv(out / "results.csv").set_index("run")
    assert list(results.index) == runs  # seed by seed: an interrupted benchmark holds whole rounds
    for seed in (1, 2):
        dense_best = results.loc[f"dense-s{seed}", "best_dev_wer"]
        assert results.loc[f"topka-s{seed}", "target_dev_wer"] == pytest.approx(dense_best * 1.05)
    paired = pd.read_csv(out / "paired.csv").replace({np.nan: None})
    assert list(zip(paired["run"], paired["metric"])) == [
        ("topka", metric) for metric in ("test_wer", "best_dev_wer", "last5_dev_wer", "last_epoch_loss", "test_loss",
                                          "plateau_exit_step")]
    by_metric = paired.set_index("metric")
    test = by_metric.loc["test_wer"]
    assert (test["n"], test["unpaired"]) == (2, None)
    assert by_metric.loc["test_loss", "n"] == 2  # a real run logs test/loss where paired.md reads it
    diffs = [results.loc[f"topka-s{s}", "test_wer"] - results.loc[f"dense-s{s}", "test_wer"] for s in (1, 2)]
    assert [test["diff_s1"], test["diff_s2"]] == pytest.approx(diffs)
    assert test["mean_diff"] == pytest.approx(sum(diffs) / 2)
    assert "## Paired by seed against dense" in markdown and (out / "paired.md").read_text() in markdown
    # a half-trained run (no test WER yet) resumes; the finished three are left as they are
    metrics = out / "runs" / "topka-s1" / "metrics.jsonl"
    metrics.write_text("".join(line for line in metrics.read_text().splitlines(keepends=True) if '"test"' not in line))
    proc = accuracy_sh(*tiny_args(an4_manifests, out), "--seeds", "2 1", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\n") == 1 and proc.stdout.endswith(f"--resume {out / 'runs' / 'topka-s1'}\n"), proc.stdout


def test_seeds_run_every_algorithm_at_every_seed(tmp_path):
    out = tmp_path / "acc"
    (out / "runs" / "dense-s1" / "checkpoints" / "last").mkdir(parents=True)  # dense at seed 1 was started
    proc = accuracy_sh("-a", "dense powersgd:matrix_approximation_rank=4", "--seeds", "3 1", "-o", out, "--dry-run",
                       "compression.density=0.02")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    expected = [("dense-s3", "3"), ("powersgd-matrix_approximation_rank4-s3", "3"), ("dense-s1", "1"),
                ("powersgd-matrix_approximation_rank4-s1", "1")]
    assert len(lines) == len(expected), proc.stdout
    for line, (name, seed) in zip(lines, expected):
        assert f" name={name} " in line and line.count(" seed=") == 1, line
        assert " compression.density=0.02 " in line
        assert line.split(" --resume ")[0].endswith(f" seed={seed}"), line
        assert line.endswith(f"--resume {out / 'runs' / name}") == (name == "dense-s1"), line
    assert "compression.options.matrix_approximation_rank=4" in lines[1]
    # --seed S keeps the plain names; no seed at all leaves the config's
    proc = accuracy_sh("-a", "dense topka", "--seed", "7", "-o", out, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert [(" name=dense " in line, " name=topka " in line, line.endswith(" seed=7"))
            for line in proc.stdout.splitlines()] == [(True, False, True), (False, True, True)]
    proc = accuracy_sh("-a", "dense", "-o", out, "--dry-run")
    assert proc.returncode == 0 and " seed=" not in proc.stdout and " name=dense " in proc.stdout, proc.stdout


def test_a_seed_run_directory_without_checkpoint_is_refused(tmp_path):
    (tmp_path / "acc" / "runs" / "topka-s2").mkdir(parents=True)
    proc = accuracy_sh("-a", "dense topka", "--seeds", "1 2", "-o", tmp_path / "acc", "--dry-run")
    message = f"{tmp_path / 'acc' / 'runs' / 'topka-s2'} exists but holds no checkpoint"
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


@pytest.mark.parametrize("args, message", [
    (["-a", "dense nope"], "compression.algorithm 'nope' is unknown"),
    (["-n", "3"], "train.global_batch_size=16 is not divisible by 3 ranks"),
    (["train.epochs=3"], "override 'train.epochs=3' is set by accuracy.sh itself"),
    (["-a", "dense dense"], "an algorithm is listed twice"),
    (["-n", "0"], "--ranks must be a positive integer"),
    (["-c", "configs/nope.yaml"], "config file 'configs/nope.yaml' not found"),
    (["optim.lr=bad"], "optim.lr must be float"),
    (["--seed", "1", "--seeds", "2 3"], "give --seed or --seeds, not both"),
    (["--seeds", "1 x"], "--seeds must be integers >= 0, got 'x' in '1 x'"),
    (["--seeds", "2 3 2"], "a seed is listed twice: 2 3 2"),
    (["seed=4"], "override 'seed=4' is set by accuracy.sh itself"),
])
def test_bad_arguments_fail_before_training(tmp_path, args, message):
    proc = accuracy_sh(*args, "-o", tmp_path / "acc")
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "acc").exists()


def test_a_run_directory_without_checkpoint_is_refused(tmp_path):
    (tmp_path / "acc" / "runs" / "dense").mkdir(parents=True)
    proc = accuracy_sh("-a", "dense", "-o", tmp_path / "acc", "--dry-run")
    assert proc.returncode == 2 and "holds no checkpoint to resume from" in proc.stderr, proc.stderr


def test_an_entry_with_options_is_its_own_run(tmp_path):
    out = tmp_path / "acc"
    proc = accuracy_sh("-a", "powersgd powersgd:matrix_approximation_rank=4:warm_start=false", "-o", out, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    plain, variant = proc.stdout.splitlines()
    assert "name=powersgd compression.algorithm=powersgd distributed.world_size=4" in plain
    assert "compression.options" not in plain
    assert ("name=powersgd-matrix_approximation_rank4-warm_startfalse compression.algorithm=powersgd "
            "compression.options.matrix_approximation_rank=4 compression.options.warm_start=false ") in variant


@pytest.mark.parametrize("entry, message", [
    ("powersgd:rank=4", "rank"),  # not an option of PowerSGD: the config check names it
    ("oktopk:matrix_approximation_rank=4", "matrix_approximation_rank"),
    ("powersgd:matrix_approximation_rank", "bad override 'compression.options.matrix_approximation_rank'"),
])
def test_a_bad_option_entry_fails_before_training(tmp_path, entry, message):
    proc = accuracy_sh("-a", entry, "-o", tmp_path / "acc", "--dry-run")
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
