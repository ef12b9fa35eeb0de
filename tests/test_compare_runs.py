"""scripts/compare_runs.py (sparse_asr/analysis/): runs with known scalars written by TensorBoard's writer, then
real tiny training runs (1 and 2 ranks): the table must hold exactly what was logged, the plots must show every
run."""
import contextlib
import io
import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import numpy as np
import pandas as pd
import pytest
import yaml
from torch.utils.tensorboard import SummaryWriter

from sparse_asr import stats
from sparse_asr.analysis import compare as compare_command, keep
from sparse_asr.analysis.paired import runs_by_label_and_seed, seed_band
from sparse_asr.analysis.plots import x_values
from sparse_asr.analysis.runs import Curve, Run, load_run, nearest_values, run_label
from sparse_asr.training.runlog import read_metrics
from tests.mpi_helpers import check_mpi

REPO = Path(__file__).resolve().parent.parent

PLOTS = ["curves_vs_step.png", "curves_vs_wall_time.png", "curves_vs_bytes.png"]
COLORS = [(0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)]  # matplotlib's first two line colours (C0, C1)


def write_run(run_dir: Path, config: dict | None, scalars: dict[str, list[tuple[int, float]]],
              new_style: tuple[str, ...] = ()) -> None:
    """Event file with the given (step, value) points; wall time = 1000 + 2 * step seconds."""
    run_dir.mkdir(parents=True)
    writer = SummaryWriter(log_dir=str(run_dir))
    for tag, points in scalars.items():
        for step, value in points:
            writer.add_scalar(tag, value, step, walltime=1000.0 + 2 * step, new_style=tag in new_style)
    writer.close()
    if config is not None:
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config))


def config(algorithm, density, P, model="lstman4"):
    return {"name": "x", "model": {"name": model}, "compression": {"algorithm": algorithm, "density": density},
            "distributed": {"world_size": P}}


def compare(*args) -> subprocess.CompletedProcess:
    """compare_runs' command line (sparse_asr.analysis.compare.main), run in this process (a new interpreter costs
    seconds of imports; test_command_line runs the script itself)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = compare_command.main([str(a) for a in args])
        except SystemExit as e:  # errors exit with their message, as on the command line
            code = e.code if isinstance(e.code, int) else 1
            if not isinstance(e.code, int):
                print(e.code, file=sys.stderr)
    return subprocess.CompletedProcess(args, code, stdout.getvalue(), stderr.getvalue())


@pytest.mark.tooling
def test_command_line(tmp_path):
    """The two scripts as a user and the results jobs run them (from another directory): keep a finished run,
    then compare the kept run."""
    run_dir = tmp_path / "runs" / "dense-s1"
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump({**config("dense", 1.0, 1), "seed": 1}))
    rows = [{"kind": "train", "step": 1, "epoch": 0, "time": 1.0, "train/loss": 2.5},
            {"kind": "dev", "step": 1, "epoch": 1, "time": 2.0, "dev/wer": 0.75},
            {"kind": "test", "step": 1, "epoch": 1, "time": 3.0, "test/wer": 0.625}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    def script(name, *args):
        return subprocess.run([sys.executable, str(REPO / "scripts" / name), *map(str, args)], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)

    proc = script("keep_runs.py", run_dir, "--into", tmp_path / "kept")
    assert proc.returncode == 0 and proc.stdout == f"{run_dir}: kept (config.yaml, metrics.jsonl.xz)\n", proc
    proc = script("compare_runs.py", tmp_path / "kept" / "dense-s1", "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    assert "| dense-s1 | lstman4 | dense | 1 | 1 | 1 | 0.75 | 0.75 |  | 0.625 |" in proc.stdout
    assert (tmp_path / "out" / "results.md").read_text() in proc.stdout
    proc = script("compare_runs.py", "--help")
    assert proc.returncode == 0 and "--out" in proc.stdout


def line_pixels(png: Path, rgb) -> int:
    image = matplotlib.image.imread(png)[..., :3] * 255
    return int((np.abs(image - np.array(rgb)).max(axis=-1) < 8).sum())


def check_plots(out: Path, n_runs: int, n_exchanging: int | None = None) -> None:
    """Every run's curve is drawn, but on the bytes axis only the `n_exchanging` runs (default: all) that received
    bytes: a one-process run has no place there."""
    for name in PLOTS:
        png = out / name
        assert png.is_file() and png.stat().st_size > 20_000, name
        drawn = n_exchanging if name == "curves_vs_bytes.png" and n_exchanging is not None else n_runs
        for rgb in COLORS[:drawn]:
            assert line_pixels(png, rgb) > 100, (name, rgb)
        for rgb in COLORS[drawn:n_runs]:
            assert line_pixels(png, rgb) < 20, (name, rgb)


# ------------------------------------------------------------------------------------------- written events
@pytest.fixture
def two_runs(tmp_path):
    steps = range(1, 21)
    a = tmp_path / "runs" / "ok-p4"
    write_run(a, config("oktopk", 0.02, 4), {
        "train/loss": [(s, 100.0 - 2.5 * s) for s in steps],
        "comm/cum_bytes_recv": [(s, 1024.0 * s) for s in steps if s % 3 == 0],  # logged every 3 steps only
        "time/compute": [(s, 0.25 if s % 2 else 0.5) for s in steps],
        "time/selection": [(s, 0.0625) for s in steps],
        "time/communication": [(s, 0.125) for s in steps],
        "time/step": [(s, 1.0) for s in steps],
        # logged before the dev set's rename: val/* reads as dev/*
        "val/wer": [(10, 0.75), (20, 0.5)], "val/cer": [(10, 0.5), (20, 0.375)],
        "test/wer": [(20, 0.625)], "test/cer": [(20, 0.25)],
        "comm/syncbn_bytes_recv": [(s, 96.0 if s < 10 else 192.0) for s in steps if s % 3 == 0],  # mean 144
    }, new_style=("val/cer",))  # one tag as a new-style tensor summary: read all the same
    b = tmp_path / "runs" / "dense-p2"
    write_run(b, config("dense", 0.01, 2), {  # no selection time, no test set, no CER
        "train/loss": [(s, 90.0 - s) for s in range(1, 31)],
        "comm/cum_bytes_recv": [(s, 4096.0 * s) for s in range(1, 31)],
        "time/compute": [(s, 0.75) for s in range(1, 31)],
        "time/communication": [(s, 0.25) for s in range(1, 31)],
        "dev/wer": [(15, 0.875), (30, 0.625), (31, 0.75)],
    })
    return a, b


@pytest.mark.unit
def test_table_holds_exactly_what_was_logged(two_runs, tmp_path):
    a, b = two_runs
    out = tmp_path / "compare"
    proc = compare(a, b, "--out", out)
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(out / "results.csv")
    rows = {r["run"]: r for r in table.to_dict("records")}
    assert rows["ok-p4"] == {
        "run": "ok-p4", "model": "lstman4", "algorithm": "oktopk", "density": 0.02, "P": 4, "steps": 20,
        "final_dev_wer": 0.5, "best_dev_wer": 0.5, "final_dev_cer": 0.375, "test_wer": 0.625, "test_cer": 0.25,
        "bytes_recv_total": 18 * 1024.0, "bytes_recv_per_step": 1024.0, "syncbn_bytes_per_step": 144.0,
        "compute_ms": 375.0, "selection_ms": 62.5, "communication_ms": 125.0, "step_ms": 1000.0}
    dense = rows["dense-p2"]
    assert (dense["algorithm"], dense["density"], dense["P"], dense["steps"]) == ("dense", 1.0, 2, 30)
    assert (dense["final_dev_wer"], dense["best_dev_wer"]) == (0.75, 0.625)  # the last and the lowest differ here
    assert (dense["bytes_recv_total"], dense["bytes_recv_per_step"]) == (30 * 4096.0, 4096.0)
    assert (dense["compute_ms"], dense["communication_ms"]) == (750.0, 250.0)
    for missing in ("final_dev_cer", "test_wer", "test_cer", "syncbn_bytes_per_step", "selection_ms", "step_ms"):
        assert np.isnan(dense[missing]), missing  # an empty cell, not a crash
    csv_text = (out / "results.csv").read_text()
    markdown = (out / "results.md").read_text()
    assert "nan" not in csv_text.lower() and "nan" not in markdown.lower()
    assert ("| dense-p2 | lstman4 | dense | 1 | 2 | 30 | 0.75 | 0.625 |  |  |  | 1.229e+05 | 4096 |  | 750 |  | 250 "
            "|  |" in markdown)
    assert markdown in proc.stdout
    check_plots(out, 2)


@pytest.mark.parametrize("target, expected", [
    # dense-p2's best dev WER 0.625 x 1.05 = 0.65625: ok-p4 reaches it at its step-20 evaluation (bytes at the
    # nearest logged step, 18), dense-p2 at step 30
    (["--target-run", "dense-p2"], {"ok-p4": (20, 18 * 1024.0), "dense-p2": (30, 30 * 4096.0)}),
    (["--target-wer", "0.8"], {"ok-p4": (10, 9 * 1024.0), "dense-p2": (30, 30 * 4096.0)}),
    (["--target-wer", "0.1"], {"ok-p4": (None, None), "dense-p2": (None, None)}),  # never reached: empty cells
])
@pytest.mark.unit
def test_step_and_bytes_at_a_target_wer(two_runs, tmp_path, target, expected):
    out = tmp_path / "compare"
    proc = compare(*two_runs, "--out", out, *target)
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(out / "results.csv").replace({np.nan: None})
    got = {r["run"]: (r["step_at_target"], r["bytes_at_target"]) for r in table.to_dict("records")}
    assert got == expected
    wer = 0.625 * 1.05 if target[0] == "--target-run" else float(target[1])
    assert table["target_dev_wer"].tolist() == pytest.approx([wer, wer])


@pytest.mark.unit
def test_density_of_algorithms_that_ignore_the_configured_one(tmp_path):
    # PowerSGD's configured density means nothing: the table shows the last logged comm/density (its factors'
    # entries / n, after a dense warm-up at 1.0); without that tag the cell is empty, not the config's value
    logged, bare = tmp_path / "runs" / "psgd", tmp_path / "runs" / "psgd-bare"
    write_run(logged, config("powersgd", 0.02, 4), {"train/loss": [(s, 9.0) for s in (1, 2, 3)],
                                                    "comm/density": [(1, 1.0), (2, 0.0109), (3, 0.0109)]})
    write_run(bare, config("powersgd", 0.02, 4), {"train/loss": [(1, 9.0)]})
    proc = compare(logged, bare, "--out", tmp_path / "compare")
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(tmp_path / "compare" / "results.csv").set_index("run")
    assert table.loc["psgd", "density"] == pytest.approx(0.0109)
    assert math.isnan(table.loc["psgd-bare", "density"])


@pytest.mark.unit
def test_target_run_must_be_one_of_the_runs(two_runs, tmp_path):
    proc = compare(*two_runs, "--out", tmp_path / "compare", "--target-run", "dense-p4")
    assert proc.returncode != 0 and "--target-run 'dense-p4' is not among the runs" in proc.stderr


@pytest.mark.unit
def test_a_run_resumed_across_the_dev_sets_rename_reads_as_one_curve(tmp_path):
    """Logged as val/* before the rename and dev/* after (a resume in between): one dev/wer curve; the
    metrics.jsonl reader renames kinds and tags the same way."""
    run_dir = tmp_path / "resumed"
    write_run(run_dir, config("dense", 1.0, 2), {"val/wer": [(10, 0.9), (20, 0.8)], "dev/wer": [(30, 0.7)]})
    run = load_run(run_dir)
    assert "val/wer" not in run.curves
    assert run.curves["dev/wer"].steps.tolist() == [10, 20, 30]
    assert run.curves["dev/wer"].values.tolist() == pytest.approx([0.9, 0.8, 0.7])
    rows = [{"kind": "val", "step": 10, "epoch": 1, "time": 1.0, "val/wer": 0.9, "val/cer": 0.5},
            {"kind": "dev", "step": 20, "epoch": 2, "time": 2.0, "dev/wer": 0.8},
            {"kind": "validation", "step": 20, "epoch": 2, "time": 2.0, "validation/x": 1.0}]  # not an old name
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert read_metrics(run_dir) == [
        {"kind": "dev", "step": 10, "epoch": 1, "time": 1.0, "dev/wer": 0.9, "dev/cer": 0.5}, rows[1], rows[2]]


@pytest.mark.unit
def test_curve_coordinates(two_runs):
    a, _ = two_runs
    run = load_run(a)
    wer = run.curves["dev/wer"]
    assert x_values(run, wer, "step").tolist() == [10, 20]
    # wall time relative to the run's first event (step 1 at 1002 s)
    assert x_values(run, wer, "wall_time").tolist() == [18.0, 38.0]
    # bytes at the nearest logged step: 9 for step 10, 18 for step 20
    assert x_values(run, wer, "bytes").tolist() == [9 * 1024.0, 18 * 1024.0]
    # a one-process run received nothing: no place on the bytes axis (not a column of points at 0)
    run.curves["comm/cum_bytes_recv"].values[:] = 0.0
    assert x_values(run, wer, "bytes") is None
    assert x_values(run, wer, "step").tolist() == [10, 20]


@pytest.mark.unit
def test_nearest_values_matches_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(50):
        steps = np.unique(rng.integers(0, 60, size=rng.integers(1, 12)))
        curve = Curve(steps, steps * 1.0, rng.normal(size=len(steps)))
        queries = rng.integers(-5, 70, size=20)
        # reference: the smallest distance, the earlier step on ties (argmin takes the first)
        expected = [curve.values[np.argmin(np.abs(steps - q))] for q in queries]
        assert nearest_values(curve, queries).tolist() == expected


@pytest.mark.unit
def test_run_without_events_or_config(tmp_path):
    empty = tmp_path / "empty-run"
    empty.mkdir()
    (empty / "config.yaml").write_text(yaml.safe_dump(config("dense", 0.01, 1)))
    proc = compare(empty, "--out", tmp_path / "o")
    assert proc.returncode != 0
    assert f"no TensorBoard event files (events.out.tfevents.*) or metrics.jsonl under {empty}" in proc.stderr
    proc = compare(tmp_path / "missing", "--out", tmp_path / "o")
    assert proc.returncode != 0 and f"{tmp_path / 'missing'} is not a directory" in proc.stderr
    bare = tmp_path / "bare"  # events only: algorithm, density, P empty; nothing to plot against bytes
    write_run(bare, None, {"train/loss": [(1, 3.0), (2, 2.0)]})
    proc = compare(bare, "--out", tmp_path / "o")
    assert proc.returncode == 0, proc.stderr
    assert "config.yaml missing" in proc.stderr
    assert "| bare |  |  |  |  | 2 |" in (tmp_path / "o" / "results.md").read_text()


# ------------------------------------------------------------------------------------------- real runs
@pytest.mark.mpi
def test_real_runs_one_and_two_ranks(an4_manifests, tmp_path):
    """configs/smoke.yaml at P=1 (dense) and P=2 (TopkA); the table must agree with each run's metrics.jsonl,
    from the run directories and from the runs as scripts/keep_runs.py keeps them (no events, no checkpoints)."""
    common = ["train.py", "--config", "configs/smoke.yaml", f"out_dir={tmp_path}",
              *(f"data.{s}_manifest={an4_manifests / f'an4_{s}.csv'}" for s in ("train", "dev", "test"))]
    check_mpi(1, common + ["name=p1-dense"], timeout=300)
    check_mpi(2, common + ["name=p2-topka", "compression.algorithm=topka", "compression.density=0.05"], timeout=300)
    runs = [tmp_path / "p1-dense", tmp_path / "p2-topka"]
    assert keep.main([*map(str, runs), "--into", str(tmp_path / "kept")]) == 0
    for dirs, out in ((runs, tmp_path / "compare"), (sorted((tmp_path / "kept").iterdir()), tmp_path / "compare_kept")):
        proc = compare(*dirs, "--out", out)
        assert proc.returncode == 0, proc.stderr
        check_real_runs(tmp_path, out)


def check_real_runs(tmp_path: Path, out: Path) -> None:
    """compare_runs' table and plots of test_real_runs_one_and_two_ranks against each run's metrics.jsonl."""
    rows = {r["run"]: r for r in pd.read_csv(out / "results.csv").to_dict("records")}
    for name, algorithm, density, P in (("p1-dense", "dense", 1.0, 1), ("p2-topka", "topka", 0.05, 2)):
        row = rows[name]
        records = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        train = [r for r in records if r["kind"] == "train" and "train/loss" in r]
        dev = [r for r in records if r["kind"] == "dev"]
        test = [r for r in records if r["kind"] == "test"]
        assert (row["algorithm"], row["density"], row["P"], row["model"]) == (algorithm, density, P, "lstman4_tiny")
        assert row["steps"] == train[-1]["step"]
        # TensorBoard stores float32; metrics.jsonl float64
        expected = {"final_dev_wer": dev[-1]["dev/wer"], "best_dev_wer": min(r["dev/wer"] for r in dev),
                    "final_dev_cer": dev[-1]["dev/cer"], "test_wer": test[-1]["test/wer"],
                    "test_cer": test[-1]["test/cer"], "bytes_recv_total": train[-1]["comm/cum_bytes_recv"],
                    "bytes_recv_per_step": train[-1]["comm/cum_bytes_recv"] / train[-1]["step"]}
        for key, tag in (("compute_ms", "time/compute"), ("selection_ms", "time/selection"),
                         ("communication_ms", "time/communication"), ("step_ms", "time/step")):
            expected[key] = 1000 * float(np.mean(np.float32([r[tag] for r in train])))
        for key, value in expected.items():
            assert row[key] == pytest.approx(value, rel=1e-5, abs=1e-9), (name, key)
    assert rows["p1-dense"]["bytes_recv_total"] == 0  # one rank receives nothing
    assert rows["p2-topka"]["bytes_recv_total"] > 0
    check_plots(out, 2, n_exchanging=1)  # the P = 1 run received nothing


# ------------------------------------------------------------------------------------------- paired seeds
@pytest.mark.parametrize("df, published", [
    # two-sided 95% (upper 0.975) critical values of Student's t, 3 decimals: NIST/SEMATECH e-Handbook of
    # Statistical Methods, section 1.3.6.7.2 "Critical Values of the Student's t Distribution"
    (1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (5, 2.571), (6, 2.447), (7, 2.365), (8, 2.306), (9, 2.262),
    (10, 2.228), (11, 2.201), (12, 2.179), (15, 2.131), (20, 2.086), (25, 2.060), (29, 2.045), (30, 2.042),
    (40, 2.021), (60, 2.000), (100, 1.984),
])
@pytest.mark.unit
def test_t_quantile_matches_the_published_table(df, published):
    assert abs(stats.t_quantile(0.95, df) - published) <= 0.0005


@pytest.mark.unit
def test_t_quantile_in_closed_form():
    # df 1 (Cauchy): P(|T| <= t) = 2 atan(t) / pi; df 2: t / sqrt(t^2 + 2); large df: the normal's 1.959964
    assert stats.t_quantile(0.95, 1) == pytest.approx(math.tan(0.475 * math.pi), rel=1e-12)
    assert stats.t_quantile(0.95, 2) == pytest.approx(math.sqrt(2 * 0.95**2 / (1 - 0.95**2)), rel=1e-12)
    assert stats.t_quantile(0.95, 20000) == pytest.approx(1.959964, abs=2e-4)
    with pytest.raises(ValueError, match="integer >= 1"):
        stats.t_quantile(0.95, 0)


@pytest.mark.unit
def test_paired_interval_by_hand():
    # differences 0.02, 0.05, 0.08: mean 0.05; sd = sqrt((0.03^2 + 0 + 0.03^2) / 2) = 0.03; se = 0.03 / sqrt(3)
    # = 0.0173205; t(0.975, 2) = 4.302653; half-width 0.0745241 -> [-0.0245241, 0.1245241]
    interval = stats.paired_interval([0.02, 0.05, 0.08])
    assert (interval.n, interval.mean) == (3, pytest.approx(0.05))
    assert (interval.low, interval.high) == (pytest.approx(-0.0245241, abs=1e-7), pytest.approx(0.1245241, abs=1e-7))
    one = stats.paired_interval([0.125])  # one seed: a mean, no interval
    assert (one.n, one.mean, one.low, one.high) == (1, 0.125, None, None)
    with pytest.raises(ValueError, match="no paired differences"):
        stats.paired_interval([])


def fisher_by_relabelling(events_a: int, n_a: int, events_b: int, n_b: int) -> float:
    """Fisher's two-sided p computed another way: every way of choosing which of the n_a + n_b runs carry the
    events (all equally likely under one shared rate), counted by brute force; p is the share of choices whose
    split between the two groups is no more frequent than the observed one."""
    runs = range(n_a + n_b)
    choices = list(itertools.combinations(runs, events_a + events_b))
    in_a = [sum(run < n_a for run in chosen) for chosen in choices]
    frequency = {k: in_a.count(k) for k in set(in_a)}
    return sum(frequency[k] <= frequency[events_a] for k in in_a) / len(choices)


@pytest.mark.unit
@pytest.mark.parametrize("counts, published", [
    ((3, 4, 1, 4), 0.4857143),     # the lady tasting tea: 3 of 4 right against 1 of 4 (Fisher 1935)
    ((1, 10, 11, 14), 0.0027595),  # [[1, 9], [11, 3]], scipy.stats.fisher_exact's documented example
    ((2, 20, 0, 20), 0.4871795),   # 2 of 20 seeds left on CTC's plateau against none of 20
])
def test_fisher_exact_matches_published_values(counts, published):
    p = stats.fisher_exact_two_sided(*counts)
    assert p == pytest.approx(published, abs=5e-7)
    assert p == pytest.approx(stats.fisher_exact_two_sided(*counts[2:], *counts[:2]))  # symmetric in the two arms


@pytest.mark.unit
@pytest.mark.parametrize("counts", [(0, 5, 0, 7), (5, 5, 0, 7), (2, 6, 3, 5), (1, 3, 4, 9), (4, 8, 4, 8)])
def test_fisher_exact_against_brute_force(counts):
    assert stats.fisher_exact_two_sided(*counts) == pytest.approx(fisher_by_relabelling(*counts), rel=1e-12)
    with pytest.raises(ValueError, match="counts must lie in 0..n"):
        stats.fisher_exact_two_sided(3, 2, 0, 4)


@pytest.mark.parametrize("low, high, expected", [
    (-5.0, 5.0, "not resolved"),            # both ends count as inside: holds -5% and +5%
    (-20.0, 30.0, "not resolved"),
    (-4.999, 5.0, "not better by 5%"),      # holds 0 and +5%, not -5%
    (-5.0, 4.999, "not worse by 5%"),       # holds 0 and -5%, not +5%: a gap above 5% is excluded
    (-4.999, 4.999, "within ±5%"),
    (0.0, 4.0, "within ±5%"),               # an interval ending at 0 does not exclude it
    (1e-9, 30.0, "worse"),                  # excludes 0
    (1e-9, 5.0, "worse by < 5%"),
    (5.0, 30.0, "worse by > 5%"),
    (-30.0, -1e-9, "better"),
    (-5.0, -1e-9, "better by < 5%"),
    (-30.0, -5.0, "better by > 5%"),
])
@pytest.mark.unit
def test_verdict_at_its_boundaries(low, high, expected):
    assert stats.verdict(stats.Interval(3, (low + high) / 2, low, high)) == expected


@pytest.mark.unit
def test_verdict_of_one_seed():
    assert stats.verdict(stats.paired_interval([12.5])) == "n/a (one seed)"


def seeded_run(root: Path, name: str, seed: int, test_wer, dev_wers, last_loss, algorithm=None, loss_scale=1.0,
               P=4):
    """A run of bench/accuracy.sh --seeds: events with test/wer and test/loss (16 x test WER), val/wer at steps 10,
    20 and epoch/loss at steps 10 (20.0) and 20 (`last_loss`), train/loss loss_scale x (30 - step) at steps 1-20;
    config.yaml with its seed and P."""
    scalars = {"train/loss": [(s, loss_scale * (30.0 - s)) for s in range(1, 21)],
               "dev/wer": list(zip((10, 20), dev_wers)), "epoch/loss": [(10, 20.0), (20, last_loss)]}
    if test_wer is not None:
        scalars["test/wer"] = [(20, test_wer)]
        scalars["test/loss"] = [(20, 16 * test_wer)]
    cfg = config(algorithm or name.split("-")[0], 0.02, P)
    cfg["seed"] = seed
    write_run(root / name, cfg, scalars)
    return root / name


@pytest.fixture
def seeded_runs(tmp_path):
    """dense and oktopk at seeds 1, 2, 3; topka at 1, 2 and 4 (no 3), its seed-2 run without a test set.
    Every value is a binary fraction, exact in TensorBoard's float32."""
    root = tmp_path / "runs"
    dirs = []
    for seed, test, best, loss in ((1, 0.5, 0.5, 8.0), (2, 0.25, 0.5, 10.0), (3, 0.625, 0.25, 4.0)):
        dirs.append(seeded_run(root, f"dense-s{seed}", seed, test, (0.75, best), loss))
    for seed, test, best, loss in ((1, 0.5625, 0.5625, 8.5), (2, 0.25, 0.5625, 9.5), (3, 0.6875, 0.2890625, 4.25)):
        first = 0.875 if seed == 1 else 0.75  # oktopk-s1 leaves the plateau (dev WER < 0.8) at step 20, not 10
        dirs.append(seeded_run(root, f"oktopk-s{seed}", seed, test, (first, best), loss))
    for seed, test in ((1, 0.5), (2, None), (4, 0.5)):
        dirs.append(seeded_run(root, f"topka-s{seed}", seed, test, (0.75, 0.5), 8.0 if seed != 2 else 10.0))
    return dirs


@pytest.mark.unit
def test_spread_by_hand(seeded_runs, tmp_path):
    """--spread, per label: dense's test WERs 0.5, 0.25, 0.625 (mean 0.458333, sample sd 0.190941), all three off
    the plateau at step 10; oktopk's seed 1 leaves it at step 20 (median 10); topka's seed 2 logged no test WER;
    'stuck' at seed 2 never has dev WER < 0.8; at seed 3 it has not yet either, but has not ended (no test WER):
    undecided, not on the plateau."""
    root = tmp_path / "more"
    stuck = [seeded_run(root, "stuck-s1", 1, 0.5, (0.75, 0.5), 8.0),
             seeded_run(root, "stuck-s2", 2, 0.875, (0.875, 0.8125), 8.0, algorithm="dense"),
             seeded_run(root, "stuck-s3", 3, None, (0.875, 0.9375), 8.0, algorithm="dense")]
    out = tmp_path / "compare"
    proc = compare(*seeded_runs, *stuck, "--out", out, "--spread")
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(out / "spread.csv", dtype={"seeds": str, "on_plateau_seeds": str, "undecided_seeds": str})
    rows = {r["label"]: r for r in table.replace({np.nan: None}).to_dict("records")}
    assert list(rows) == ["dense", "oktopk", "topka", "stuck"]
    dense = rows["dense"]
    assert (dense["n"], dense["on_plateau"], dense["median_exit_step"], dense["n_test"]) == (3, 0, 10, 3)
    assert (dense["test_wer_mean"], dense["test_wer_sd"]) == (pytest.approx(0.458333, abs=1e-6),
                                                               pytest.approx(0.190941, abs=1e-6))
    assert (dense["test_wer_min"], dense["test_wer_max"]) == (0.25, 0.625)
    assert rows["oktopk"]["median_exit_step"] == 10 and rows["oktopk"]["on_plateau"] == 0
    assert (rows["topka"]["n"], rows["topka"]["n_test"], rows["topka"]["test_wer_sd"]) == (3, 2, 0.0)
    assert (rows["stuck"]["on_plateau"], rows["stuck"]["on_plateau_seeds"],
            rows["stuck"]["median_exit_step"]) == (1, "2", 10)
    assert (rows["stuck"]["undecided_seeds"], rows["dense"]["undecided_seeds"]) == ("3", None)
    assert ("| stuck | 1 2 3 | 1 of 3 (2); undecided: 3 | 10 | 0.6875 | 0.2652 | 0.5 | 0.875 |"
            in (out / "spread.md").read_text())
    assert "Fisher" not in (out / "spread.md").read_text()  # no baseline named, no test against it

    # Against dense (0 of 3 decided on the plateau): 'stuck' is 1 of its 2 decided runs (seed 3 undecided). With
    # one run on the plateau among 5, it falls in 'stuck' with probability 2/5 and in dense with 3/5: p = 0.4.
    proc = compare(*seeded_runs, *stuck, "--out", out, "--spread", "--paired-against", "dense")
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(out / "spread.csv").replace({np.nan: None})
    p = {r["label"]: r["plateau_fisher_p"] for r in table.to_dict("records")}
    assert p == {"dense": None, "oktopk": 1.0, "topka": 1.0, "stuck": pytest.approx(0.4)}
    assert "| 0.6875 | 0.2652 | 0.5 | 0.875 | 0.4 |" in (out / "spread.md").read_text()


@pytest.mark.unit
def test_paired_comparison_by_hand(seeded_runs, tmp_path):
    out = tmp_path / "compare"
    proc = compare(*seeded_runs, "--out", out, "--paired-against", "dense")
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(out / "paired.csv").replace({np.nan: None})
    rows = {(r["run"], r["metric"]): r for r in table.to_dict("records")}
    assert list(rows) == [(run, metric) for run in ("oktopk", "topka")
                          for metric in ("test_wer", "best_dev_wer", "last5_dev_wer", "last_epoch_loss", "test_loss",
                                         "plateau_exit_step")]

    # oktopk test WER: differences 0.0625, 0, 0.0625 (mean 0.0416667, sd 0.0360844, se 0.0208333, half-width
    # 4.302653 x 0.0208333 = 0.0896386); relative 12.5%, 0%, 10% (mean 7.5%, sd 6.614378, se 3.818813,
    # half-width 16.431033): [-8.931%, +23.931%] holds both -5% and +5%
    test = rows["oktopk", "test_wer"]
    assert [test[f"diff_s{s}"] for s in (1, 2, 3)] == [0.0625, 0.0, 0.0625]
    assert [test[f"rel_pct_s{s}"] for s in (1, 2, 3)] == [12.5, 0.0, 10.0]
    assert [test[f"value_s{s}"] for s in (1, 2, 3)] == [0.5625, 0.25, 0.6875]
    assert [test[f"baseline_s{s}"] for s in (1, 2, 3)] == [0.5, 0.25, 0.625]
    assert (test["n"], test["mean_diff"], test["diff_low"], test["diff_high"]) == (
        3, pytest.approx(0.0416667, abs=1e-7), pytest.approx(-0.0479719, abs=1e-7), pytest.approx(0.1313053, abs=1e-7))
    assert (test["mean_rel_pct"], test["rel_low_pct"], test["rel_high_pct"]) == (
        pytest.approx(7.5), pytest.approx(-8.931027, abs=1e-6), pytest.approx(23.931027, abs=1e-6))
    assert (test["verdict"], test["unpaired"]) == ("not resolved", None)

    # oktopk best dev WER (the lowest of each run's evaluations): relative 12.5%, 12.5%, 15.625% (mean
    # 13.541667, sd 1.804220, se 1.041667, half-width 4.482139): [+9.060%, +18.024%], above +5%
    dev = rows["oktopk", "best_dev_wer"]
    assert [dev[f"diff_s{s}"] for s in (1, 2, 3)] == [0.0625, 0.0625, 0.0390625]
    assert (dev["mean_rel_pct"], dev["rel_low_pct"], dev["rel_high_pct"]) == (
        pytest.approx(13.541667, abs=1e-6), pytest.approx(9.059737, abs=1e-6), pytest.approx(18.023597, abs=1e-6))
    assert dev["verdict"] == "worse by > 5%"

    # oktopk last-epoch loss (epoch/loss at the last step, not the first): 8.5 - 8, 9.5 - 10, 4.25 - 4;
    # relative 6.25%, -5%, 6.25% (mean 2.5, sd 6.495191, se 3.75, half-width 16.134947)
    loss = rows["oktopk", "last_epoch_loss"]
    assert [loss[f"diff_s{s}"] for s in (1, 2, 3)] == [0.5, -0.5, 0.25]
    assert (loss["mean_rel_pct"], loss["rel_low_pct"], loss["rel_high_pct"]) == (
        pytest.approx(2.5), pytest.approx(-13.634948, abs=1e-6), pytest.approx(18.634948, abs=1e-6))
    assert loss["verdict"] == "not resolved"

    # oktopk test loss (16 x test WER, read from test/loss, not test/wer): differences 1, 0, 1
    test_loss = rows["oktopk", "test_loss"]
    assert [test_loss[f"diff_s{s}"] for s in (1, 2, 3)] == [1.0, 0.0, 1.0]
    assert [test_loss[f"value_s{s}"] for s in (1, 2, 3)] == [9.0, 4.0, 11.0]
    assert test_loss["mean_rel_pct"] == pytest.approx(7.5)

    # the step of the first dev WER < 0.8: 20 vs 10 at seed 1 (+100%), 10 vs 10 at seeds 2 and 3
    plateau = rows["oktopk", "plateau_exit_step"]
    assert [plateau[f"diff_s{s}"] for s in (1, 2, 3)] == [10.0, 0.0, 0.0]
    assert [plateau[f"rel_pct_s{s}"] for s in (1, 2, 3)] == [100.0, 0.0, 0.0]

    # topka: seed 3 has no topka run, seed 4 no dense run, and topka-s2 logged no test WER: all named,
    # and the test WER rests on seed 1 alone (no interval)
    topka_test = rows["topka", "test_wer"]
    assert topka_test["unpaired"] == "s2: topka-s2 logged no test/wer; s3: no topka run; s4: no dense run"
    assert (topka_test["n"], topka_test["mean_diff"], topka_test["diff_low"], topka_test["verdict"]) == (
        1, 0.0, None, "n/a (one seed)")
    assert topka_test["diff_s2"] is None and topka_test["diff_s4"] is None
    topka_dev = rows["topka", "best_dev_wer"]
    assert (topka_dev["n"], topka_dev["unpaired"]) == (2, "s3: no topka run; s4: no dense run")
    assert (topka_dev["rel_low_pct"], topka_dev["rel_high_pct"], topka_dev["verdict"]) == (0.0, 0.0, "within ±5%")
    assert "topka test_wer: unpaired: s2: topka-s2 logged no test/wer; s3: no topka run" in proc.stderr

    markdown = (out / "paired.md").read_text()
    assert markdown in proc.stdout
    assert ("| oktopk | best dev WER | 3 | s1 +0.0625 (+12.5%); s2 +0.0625 (+12.5%); s3 +0.03906 (+15.6%) | "
            "0.4714 / 0.4167 | +0.05469 [+0.02107, +0.0883] | +13.5% [+9.1%, +18.0%] | worse by > 5% |  |") in markdown
    assert ("| topka | test WER | 1 | s1 +0 (+0.0%) | 0.5 / 0.5 | +0 | +0.0% | n/a (one seed) | "
            "s2: topka-s2 logged no test/wer; s3: no topka run; s4: no dense run |") in markdown
    assert "nan" not in markdown.lower() and "nan" not in (out / "paired.csv").read_text().lower()


@pytest.mark.unit
def test_the_last_dev_evaluations_metric_averages_exactly_the_last_five(tmp_path):
    """dense's dev WER ends at 0.5 five times; oktopk's best (0.25) comes early and its last five are 0.75 then
    four 0.625: mean 0.65, +30% (the mean of all seven, of the last four or six, or the best would differ)."""
    root = tmp_path / "runs"
    curves = {"dense": (1.0, 0.875, 0.5, 0.5, 0.5, 0.5, 0.5), "oktopk": (0.875, 0.25, 0.75, 0.625, 0.625, 0.625, 0.625)}
    for algorithm, dev in curves.items():
        for seed in (1, 2):
            cfg = config(algorithm, 0.02, 4)
            cfg["seed"] = seed
            write_run(root / f"{algorithm}-s{seed}", cfg, {"dev/wer": [(10 * (i + 1), w) for i, w in enumerate(dev)]})
    out = tmp_path / "compare"
    proc = compare(*sorted(root.iterdir()), "--out", out, "--paired-against", "dense")
    assert proc.returncode == 0, proc.stderr
    rows = {r["metric"]: r for r in pd.read_csv(out / "paired.csv").to_dict("records")}
    last = rows["last5_dev_wer"]
    assert [last[f"value_s{s}"] for s in (1, 2)] == [pytest.approx(0.65)] * 2
    assert [last[f"baseline_s{s}"] for s in (1, 2)] == [0.5, 0.5]
    assert last["mean_rel_pct"] == pytest.approx(30.0)
    assert rows["best_dev_wer"]["mean_rel_pct"] == pytest.approx(-50.0)
    assert "| oktopk | mean dev WER of the last 5 | 2 |" in (out / "paired.md").read_text()


@pytest.mark.unit
def test_paired_curves_are_the_mean_over_seeds_with_its_interval(seeded_runs, tmp_path):
    """The paired plot's data, by hand: dense's dev WER at steps 10 (0.75 on every seed: no width) and 20 (0.5,
    0.5, 0.25: mean 5/12, sd 0.1443, t(0.975, 2) = 4.3027, half-width 0.3586); topka's at its seeds 1, 2, 4."""
    runs = [load_run(d) for d in seeded_runs]
    groups = runs_by_label_and_seed(runs)
    dense = seed_band(groups["dense"], "dev/wer")
    assert list(dense["steps"]) == [10, 20] and dense["values"].shape == (3, 2)
    assert dense["mean"] == pytest.approx([0.75, 5 / 12]) and dense["low"][0] == dense["high"][0] == pytest.approx(0.75)
    assert (dense["low"][1], dense["high"][1]) == pytest.approx((5 / 12 - 0.35856, 5 / 12 + 0.35856), abs=1e-4)
    loss = seed_band(groups["oktopk"], "train/loss")
    assert list(loss["steps"]) == list(range(1, 21)) and loss["mean"] == pytest.approx([30.0 - s for s in range(1, 21)])
    assert seed_band(groups["topka"], "test/wer")["values"].shape == (2, 1)  # seed 2 logged none
    assert seed_band(groups["topka"], "no/such_tag") is None
    # The loss panel's band, by hand: two seeds with train/loss 30 - step and 2 x (30 - step), running means over
    # 4 points (at step 20: 11.5 and 23), then mean and interval of the logarithms: geometric mean sqrt(11.5 x 23),
    # log half-width t(0.975, 1) x sd(ln 11.5, ln 23) / sqrt(2) = 12.7062 x (ln 2 / sqrt 2) / sqrt 2.
    pair = {1: load_run(seeded_run(tmp_path / "scaled", "a-s1", 1, 0.5, (0.75, 0.5), 8.0)),
            2: load_run(seeded_run(tmp_path / "scaled", "a-s2", 2, 0.5, (0.75, 0.5), 8.0, loss_scale=2.0))}
    band = seed_band(pair, "train/loss", window=4, log=True)
    assert list(band["values"][:, :2].ravel()) == pytest.approx([29.0, 28.5, 58.0, 57.0])  # the window fills up
    half = 12.7062 * np.log(2) / 2
    assert band["mean"][-1] == pytest.approx(np.sqrt(11.5 * 23))
    assert (band["low"][-1], band["high"][-1]) == pytest.approx(
        (np.sqrt(11.5 * 23) * np.exp(-half), np.sqrt(11.5 * 23) * np.exp(half)), rel=1e-4)
    assert min(band["low"]) > 0  # the arithmetic interval would go below 0 here, off a log axis
    assert seed_band(pair, "train/loss")["low"][-1] < 0
    out = tmp_path / "compare"
    proc = compare(*seeded_runs, "--out", out, "--paired-against", "dense")
    assert proc.returncode == 0, proc.stderr
    png = (out / "paired_curves_vs_step.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 20_000


@pytest.mark.unit
def test_a_run_kept_with_only_its_metrics_compares_as_with_its_events(seeded_runs, tmp_path):
    """docs/results keeps runs as config.yaml + metrics.jsonl.xz (older ones .gz; no TensorBoard events):
    compare_runs reads the same scalars from it, old tag names included, and writes the same paired table as from
    the events."""
    import gzip
    import json
    import lzma
    kept = []
    for i, run_dir in enumerate(seeded_runs):
        run = load_run(run_dir)
        rows = {}
        for tag, curve in run.curves.items():
            for step, wall, value in zip(curve.steps, curve.wall_times, curve.values):
                row = rows.setdefault(int(step), {"kind": "train", "step": int(step), "epoch": 0, "time": float(wall)})
                row["val/wer" if tag == "dev/wer" else tag] = float(value)  # an old-style name, read as dev/wer
        target = tmp_path / "kept" / run_dir.name
        target.mkdir(parents=True)
        (target / "config.yaml").write_text((run_dir / "config.yaml").read_text())
        archive, opener = ("metrics.jsonl.xz", lzma.open) if i % 2 else ("metrics.jsonl.gz", gzip.open)
        with opener(target / archive, "wt") as f:
            f.writelines(json.dumps(rows[step]) + "\n" for step in sorted(rows))
        again = load_run(target)
        assert set(again.curves) == set(run.curves)
        for tag, curve in run.curves.items():
            assert (list(again.curves[tag].steps) == list(curve.steps)
                    and list(again.curves[tag].values) == list(curve.values))
        kept.append(target)
    for dirs, out in ((seeded_runs, tmp_path / "a"), (kept, tmp_path / "b")):
        assert compare(*dirs, "--out", out, "--paired-against", "dense").returncode == 0
    assert (tmp_path / "a" / "paired.csv").read_text() == (tmp_path / "b" / "paired.csv").read_text()
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = compare(empty, "--out", tmp_path / "c")
    assert proc.returncode != 0 and "no TensorBoard event files (events.out.tfevents.*) or metrics.jsonl" in proc.stderr


@pytest.mark.unit
def test_target_run_by_label_takes_the_run_at_the_same_seed(seeded_runs, tmp_path):
    out = tmp_path / "compare"
    proc = compare(*seeded_runs, "--out", out, "--target-run", "dense")
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(out / "results.csv").replace({np.nan: None}).set_index("run")
    # dense's best dev WER x 1.05 at seeds 1, 2, 3: 0.525, 0.525, 0.2625; seed 4 has no dense run
    for name, target in (("dense-s1", 0.525), ("oktopk-s2", 0.525), ("oktopk-s3", 0.2625), ("topka-s1", 0.525)):
        assert table.loc[name, "target_dev_wer"] == pytest.approx(target), name
    assert table.loc["topka-s4", "target_dev_wer"] is None
    assert table.loc["oktopk-s3", "step_at_target"] is None  # 0.2890625 > 0.2625: never reached
    assert table.loc["dense-s3", "step_at_target"] == 20


@pytest.mark.unit
def test_pairing_errors_name_the_runs(seeded_runs, tmp_path):
    proc = compare(*seeded_runs, "--out", tmp_path / "o", "--paired-against", "powersgd")
    assert proc.returncode != 0 and "--paired-against 'powersgd' is not among the run labels" in proc.stderr
    # two runs that are both dense at seed 1: which one pairs is not guessed
    again = seeded_run(tmp_path / "other", "dense", 1, 0.5, (0.75, 0.5), 8.0)
    proc = compare(*seeded_runs, again, "--out", tmp_path / "o", "--paired-against", "dense")
    assert proc.returncode != 0, proc.stdout
    assert f"{seeded_runs[0]} and {again} are both 'dense' at seed 1: cannot pair them" in proc.stderr
    # a run without a seed in its config cannot be paired
    bare = tmp_path / "bare" / "topkdsa-s1"
    write_run(bare, config("topkdsa", 0.02, 4), {"dev/wer": [(1, 0.5)]})
    proc = compare(*seeded_runs, bare, "--out", tmp_path / "o", "--paired-against", "dense")
    assert proc.returncode != 0 and f"{bare / 'config.yaml'} has none (seed: None)" in proc.stderr
    assert not (tmp_path / "o" / "paired.md").exists()


@pytest.mark.unit
def test_label_by_pairs_cells_of_one_algorithm(seeded_runs, tmp_path):
    """Ok-Topk at P = 4 (seeded_runs) and at P = 1 (another cell, the same run names): --label-by
    distributed.world_size makes them two labels, each paired with dense by hand, and with each other."""
    cell_p1 = [seeded_run(tmp_path / "p1", f"oktopk-s{seed}", seed, test, (0.75, 0.5), 8.0, P=1)
               for seed, test in ((1, 0.5), (2, 0.375), (3, 0.625))]
    runs = [*seeded_runs[:6], *cell_p1]  # dense and oktopk at P = 4, seeds 1-3; oktopk at P = 1
    proc = compare(*runs, "--out", tmp_path / "o", "--paired-against", "dense")
    assert proc.returncode != 0 and "runs with the same name would share a legend entry" in proc.stderr
    out = tmp_path / "by_p"
    proc = compare(*runs, "--out", out, "--label-by", "distributed.world_size", "--paired-against",
                   "dense@world_size=4")
    assert proc.returncode == 0, proc.stderr
    test = pd.read_csv(out / "paired.csv").set_index(["run", "metric"]).xs("test_wer", level="metric")
    assert list(test.index) == ["oktopk@world_size=4", "oktopk@world_size=1"]
    dense, p4, p1 = (0.5, 0.25, 0.625), (0.5625, 0.25, 0.6875), (0.5, 0.375, 0.625)
    for label, values in (("oktopk@world_size=4", p4), ("oktopk@world_size=1", p1)):
        assert [test.loc[label, f"diff_s{s}"] for s in (1, 2, 3)] == pytest.approx(
            [v - d for v, d in zip(values, dense)]), label
    results = pd.read_csv(out / "results.csv")
    assert list(results["run"]) == ["dense@world_size=4-s1", "dense@world_size=4-s2", "dense@world_size=4-s3",
                                    "oktopk@world_size=4-s1", "oktopk@world_size=4-s2", "oktopk@world_size=4-s3",
                                    "oktopk@world_size=1-s1", "oktopk@world_size=1-s2", "oktopk@world_size=1-s3"]
    # the cells against each other: P = 4's cost over P = 1, seed by seed
    proc = compare(*runs[3:], "--out", tmp_path / "cells", "--label-by", "distributed.world_size",
                   "--paired-against", "oktopk@world_size=1")
    assert proc.returncode == 0, proc.stderr
    cells = pd.read_csv(tmp_path / "cells" / "paired.csv").set_index("metric").loc["test_wer"]
    assert cells["run"] == "oktopk@world_size=4"
    assert [cells[f"diff_s{s}"] for s in (1, 2, 3)] == pytest.approx([a - b for a, b in zip(p4, p1)])
    # a run whose config lacks the key is named
    bare = tmp_path / "bare" / "dense-s1"
    write_run(bare, {"seed": 1}, {"dev/wer": [(1, 0.5)]})
    proc = compare(bare, "--out", tmp_path / "o", "--label-by", "distributed.world_size")
    assert proc.returncode != 0 and f"{bare / 'config.yaml'} has no value at distributed.world_size" in proc.stderr


@pytest.mark.unit
def test_labels_strip_only_the_configs_own_seed(tmp_path):
    for name, seed, label in (("dense-s3", 3, "dense"), ("dense-s3", 1, "dense-s3"), ("dense", 1, "dense"),
                              ("powersgd-matrix_approximation_rank4-s12", 12, "powersgd-matrix_approximation_rank4"),
                              ("-s2", 2, "-s2")):
        run = Run(name, tmp_path / name, {"seed": seed}, {})
        assert run_label(run) == label, (name, seed)


@pytest.mark.unit
def test_a_run_that_never_leaves_the_plateau_is_named_not_paired(tmp_path):
    root = tmp_path / "runs"
    runs = [seeded_run(root, "dense-s1", 1, 0.5, (0.75, 0.5), 8.0),
            seeded_run(root, "oktopk-s1", 1, 0.875, (0.9375, 0.875), 9.0)]
    out = tmp_path / "compare"
    proc = compare(*runs, "--out", out, "--paired-against", "dense")
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(out / "paired.csv").replace({np.nan: None}).set_index("metric")
    assert table.loc["plateau_exit_step", "n"] == 0
    assert table.loc["plateau_exit_step", "unpaired"] == "s1: no finite plateau_exit_step (inf vs 10.0)"
    assert table.loc["test_wer", "n"] == 1
