"""scripts/keep_runs.py (sparse_asr/analysis/keep.py): what it keeps of a finished run, what it skips, and what
it refuses (symbolic links, a different run under the same name). That compare_runs reads kept real runs as the
live ones: tests/test_compare_runs.py::test_real_runs_one_and_two_ranks; the script itself as a command:
tests/test_compare_runs.py::test_command_line."""
import gzip
import json
import lzma
from pathlib import Path

import numpy as np
import pytest

from sparse_asr.analysis import keep as keep_runs

pytestmark = pytest.mark.unit


def make_run(root: Path, name: str, finished: bool = True, provenance: bool = True) -> Path:
    run = root / name
    (run / "checkpoints" / "epoch_1").mkdir(parents=True)
    (run / "checkpoints" / "epoch_1" / "index.json").write_text("{}")
    (run / "events.out.tfevents.1.vm.1.0").write_bytes(b"\0" * 100)
    (run / "config.yaml").write_text(f"name: {name}\nseed: 1\n")
    rows = [{"kind": "train", "step": 1, "epoch": 0, "time": 1.0, "train/loss": 2.5},
            {"kind": "dev", "step": 1, "epoch": 1, "time": 2.0, "dev/wer": 0.5}]
    if finished:
        rows.append({"kind": "test", "step": 1, "epoch": 1, "time": 3.0, "test/wer": 0.25})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if provenance:
        (run / "provenance.jsonl").write_text('{"host": "vm"}\n')
    return run


def keep(*args) -> tuple[int, str, str]:
    import contextlib
    import io
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = keep_runs.main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


def test_a_finished_run_is_kept_as_config_provenance_and_xz_metrics(tmp_path):
    run = make_run(tmp_path / "runs", "dense-s1")
    code, out, err = keep(run, "--into", tmp_path / "kept")
    assert code == 0 and err == "" and "dense-s1: kept" in out
    kept = tmp_path / "kept" / "dense-s1"
    assert sorted(p.name for p in kept.iterdir()) == ["config.yaml", "metrics.jsonl.xz", "provenance.jsonl"]
    assert (kept / "config.yaml").read_bytes() == (run / "config.yaml").read_bytes()
    assert (kept / "provenance.jsonl").read_bytes() == (run / "provenance.jsonl").read_bytes()
    assert lzma.decompress((kept / "metrics.jsonl.xz").read_bytes()) == \
        keep_runs.digest((run / "metrics.jsonl").read_bytes())
    # kept again (as when rerun while other runs finish): nothing changes, nothing fails
    before = {p.name: p.stat().st_mtime_ns for p in kept.iterdir()}
    code, out, _ = keep(run, "--into", tmp_path / "kept")
    assert code == 0 and "already kept" in out
    assert {p.name: p.stat().st_mtime_ns for p in kept.iterdir()} == before
    # a copy kept before xz, its metrics gzipped at full precision, is the same run: left as it is
    (kept / "metrics.jsonl.xz").unlink()
    (kept / "metrics.jsonl.gz").write_bytes(gzip.compress((run / "metrics.jsonl").read_bytes()))
    code, out, _ = keep(run, "--into", tmp_path / "kept")
    assert code == 0 and "already kept" in out
    assert sorted(p.name for p in kept.iterdir()) == ["config.yaml", "metrics.jsonl.gz", "provenance.jsonl"]
    # ... unless what it holds differs: a value, or a truncated file
    metrics = (run / "metrics.jsonl").read_bytes()
    for other in (metrics.replace(b'"test/wer": 0.25', b'"test/wer": 0.26'), metrics[:-10]):
        (kept / "metrics.jsonl.gz").write_bytes(gzip.compress(other))
        code, _, err = keep(run, "--into", tmp_path / "kept")
        assert code == 1 and "already holds a run with other files" in err


def test_emissions_are_kept_beside_the_run_and_a_linked_one_is_refused(tmp_path):
    from sparse_asr.training.emissions import load_emissions, save_emissions
    import torch

    run = make_run(tmp_path / "runs", "dense-s1")
    save_emissions(run / "emissions_test.npz", ["u1"], [torch.log_softmax(torch.arange(29.0)[None], dim=1)])
    code, out, err = keep(run, "--into", tmp_path / "kept")
    assert code == 0 and err == "", err
    kept = tmp_path / "kept" / "dense-s1"
    assert "emissions_test.npz" in {p.name for p in kept.iterdir()}
    assert load_emissions(kept / "emissions_test.npz")[0] == ["u1"]
    other = make_run(tmp_path / "runs", "dense-s2")
    (other / "emissions_dev.npz").symlink_to(run / "emissions_test.npz")
    code, _, err = keep(other, "--into", tmp_path / "kept")
    assert code == 1 and "emissions_dev.npz is a symbolic link" in err


def test_the_metrics_are_kept_as_the_event_files_hold_them():
    """Every float as the float32 TensorBoard would store, in its shortest digits; the wall clock to the
    millisecond; keys, their order, integers, strings and non-finite values as they were; a digest of a digest is
    itself; and fewer bytes after xz, not more."""
    rng = np.random.default_rng(0)
    rows = [{"kind": "train", "step": step, "epoch": step // 53, "time": 1795909700.0029626 + step * 0.2718281828,
             "train/loss": float(rng.lognormal(3, 1)), "time/communication": float(rng.random() * 1e-5),
             "comm/cum_bytes_recv": float(step * 443391.0), "comm/dense": 0.0, "note": "x"} for step in range(1, 400)]
    rows.append({"kind": "train", "step": 400, "time": 1.5, "train/loss": float("nan"),
                 "train/grad_norm": float("inf")})
    metrics = "".join(json.dumps(r) + "\n" for r in rows).encode()
    kept = keep_runs.digest(metrics)
    assert keep_runs.digest(kept) == kept
    back = [json.loads(line) for line in kept.decode().splitlines()]
    assert len(back) == len(rows)
    for row, again in zip(rows, back):
        assert list(again) == list(row)  # same keys, same order
        for key, value in row.items():
            if key == "time":
                assert abs(again[key] - value) <= 0.0005
            elif isinstance(value, float) and np.isfinite(value):
                assert np.float32(again[key]) == np.float32(value), (key, value, again[key])
                assert len(repr(again[key])) <= 15
            elif isinstance(value, float):
                assert repr(again[key]) == repr(value)  # nan, inf
            else:
                assert again[key] == value and type(again[key]) is type(value)
    assert len(lzma.compress(kept, preset=9)) < 0.8 * len(lzma.compress(metrics, preset=9))


def test_an_unfinished_run_is_skipped_and_the_others_kept(tmp_path):
    done = make_run(tmp_path / "runs", "dense-s1")
    running = make_run(tmp_path / "runs", "dense-s2", finished=False)
    old = make_run(tmp_path / "runs", "dense-s3", provenance=False)  # a run from before provenance.jsonl
    code, out, err = keep(done, running, old, "--into", tmp_path / "kept")
    assert code == 0 and err == ""
    assert "dense-s2: not finished" in out
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["dense-s1", "dense-s3"]
    assert sorted(p.name for p in (tmp_path / "kept" / "dense-s3").iterdir()) == ["config.yaml", "metrics.jsonl.xz"]


def test_a_different_run_under_the_same_name_is_not_overwritten(tmp_path):
    first = make_run(tmp_path / "a", "dense-s1")
    assert keep(first, "--into", tmp_path / "kept")[0] == 0
    kept_metrics = (tmp_path / "kept" / "dense-s1" / "metrics.jsonl.xz").read_bytes()
    other = make_run(tmp_path / "b", "dense-s1")
    (other / "config.yaml").write_text("name: dense-s1\nseed: 1\noptim:\n  lr: 0.01\n")
    code, out, err = keep(other, "--into", tmp_path / "kept")
    assert code == 1 and "already holds a run with other files" in err and str(other) in err
    assert (tmp_path / "kept" / "dense-s1" / "metrics.jsonl.xz").read_bytes() == kept_metrics


def test_symbolic_links_are_refused_in_the_run_and_at_the_target(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("not a metric\n")
    run = make_run(tmp_path / "runs", "dense-s1")
    (run / "provenance.jsonl").unlink()
    (run / "provenance.jsonl").symlink_to(secret)
    code, _, err = keep(run, "--into", tmp_path / "kept")
    assert code == 1 and "provenance.jsonl is a symbolic link" in err
    assert not (tmp_path / "kept" / "dense-s1").exists()

    good = make_run(tmp_path / "runs2", "dense-s2")
    (tmp_path / "kept").mkdir(exist_ok=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "kept" / "dense-s2").symlink_to(elsewhere)
    code, _, err = keep(good, "--into", tmp_path / "kept")
    assert code == 1 and "is a symbolic link; refusing to write through it" in err
    assert list(elsewhere.iterdir()) == []


def test_a_directory_that_is_not_a_run_is_named(tmp_path):
    (tmp_path / "empty").mkdir()
    code, _, err = keep(tmp_path / "empty", "--into", tmp_path / "kept")
    assert code == 1 and f"{tmp_path / 'empty'} has no config.yaml: not a run directory" in err
    run = make_run(tmp_path / "runs", "dense-s1")
    (run / "metrics.jsonl").write_text('{"kind": "train"\n')
    code, _, err = keep(run, "--into", tmp_path / "kept")
    assert code == 1 and "metrics.jsonl is not JSON lines" in err
