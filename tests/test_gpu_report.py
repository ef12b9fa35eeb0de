"""bench/gpu_report.py: the GPU suite's summary from raw outputs (here: the figures the GPU suite quotes
from an H200, written the way the suite's steps write them), and the environment report."""
import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.tooling  # every test runs bench/gpu_report.py in a subprocess

SELECTION = """numel = 27,569,568, float32, median of 10 runs; ratio = torch.topk time / method time

| device | threads | density | k | method | median ms | vs torch.topk | exact |
|---|---|---|---|---|---|---|---|
| cuda | 8 | 0.02 | 551,391 | torch.topk | 0.7 | 1.00x | yes |
| cuda | 8 | 0.02 | 551,391 | radix select | 2.0 | 0.35x | yes |
| cuda | 8 | 0.02 | 551,391 | topk_threshold_select (ours) | 4.2 | 0.17x | yes |
| cuda | 8 | 0.02 | 551,391 | threshold reuse | 0.2 | 3.50x | n/a |
"""


def step_row(P, algorithm, compute, select, comm, other, precision="fp32"):
    ms = 1e-3
    return {"algorithm": algorithm, "P": P, "model": "lstman4", "precision": precision,
            "t_compute_mean": compute * ms, "t_select_mean": select * ms, "t_comm_mean": comm * ms,
            "t_other_mean": other * ms, "t_step_mean": (compute + select + comm + other) * ms,
            "comm_select_pct_of_compute": 100 * (select + comm) / compute}


def write_suite_outputs(out):
    (out / "steps.tsv").write_text("step\tstatus\tseconds\tlimit_s\nenv\tok\t3\t25\nstep_P2\ttimed out\t95\t95\n")
    (out / "env.json").write_text(json.dumps({"host": "gpu1", "cpus": 16, "torch": "2.11", "cuda_build": "13.0",
                                              "cudnn": 91000, "mpi": "MPICH Version: 5.0.2", "bundle": "abc123",
                                              "gpus": [{"name": "NVIDIA H200"}]}))
    (out / "selection.md").write_text(SELECTION)
    batch = {"global_batch": 64}
    (out / "step_time_P1.json").write_text(json.dumps({"batch": batch, "rows": [
        step_row(1, "dense", 53.2, 0, 0, 2.0)]}))
    (out / "step_time_P1_bf16.json").write_text(json.dumps({"batch": batch, "rows": [
        step_row(1, "dense", 26.0, 0, 0, 2.0, precision="bf16")]}))
    (out / "step_time_P2.json").write_text(json.dumps({"batch": batch, "rows": [
        step_row(2, "dense", 77.3, 0, 69.9, 4.6), step_row(2, "oktopk", 78.3, 3.0, 5.0, 8.1)]}))
    write_run(out, "oktopk-p2", "oktopk", 2, "fp32", dev_wers=[0.91], test_wer=0.875, samples_per_sec=600.0)
    write_run(out, "dense-p1", "dense", 1, "fp32", dev_wers=[0.50, 0.20, 0.16], test_wer=0.14)
    write_run(out, "dense-p1-bf16", "dense", 1, "bf16", dev_wers=[0.52, 0.204], test_wer=0.15)
    write_run(out, "oktopk-p4", "oktopk", 4, "fp32", dev_wers=[0.60, 0.212, 0.18], test_wer=0.16)


def write_run(out, name, algorithm, P, precision, dev_wers, test_wer, samples_per_sec=500.0):
    """A training's config.yaml and metrics.jsonl as train.py writes them: 13 steps per epoch, 2 s each."""
    run = out / "runs" / name
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(f"compression:\n  algorithm: {algorithm}\ndistributed:\n  world_size: {P}\n"
                                     f"train:\n  precision: {precision}\n")
    records = [{"kind": "train", "step": 10, "epoch": 0, "time": 100.0, "train/samples_per_sec": samples_per_sec}]
    for epoch, wer in enumerate(dev_wers, start=1):
        records += [{"kind": "epoch", "step": 13 * epoch, "epoch": epoch, "time": 100.0 + 2 * epoch,
                     "epoch/loss": 95.5 / epoch, "epoch/seconds": 2.0},
                    {"kind": "dev", "step": 13 * epoch, "epoch": epoch, "time": 101.0 + 2 * epoch, "dev/wer": wer}]
    records.append({"kind": "test", "step": 13 * len(dev_wers), "epoch": len(dev_wers),
                    "time": 102.5 + 2 * len(dev_wers), "test/wer": test_wer, "test/cer": 0.5})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def report(*args):
    return subprocess.run([sys.executable, "bench/gpu_report.py", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


def test_summary_tables_and_targets(tmp_path):
    write_suite_outputs(tmp_path)
    proc = report("summary", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "# GPU suite: NVIDIA H200"
    assert "| step_P2 | timed out | 95 | 95 |" in lines
    assert "| cuda | 8 | 0.02 | 551,391 | topk_threshold_select (ours) | 4.2 | 0.17x | yes |" in lines
    assert "| 2 | fp32 | oktopk | lstman4 | 64 | 78.3 | 3.0 | 5.0 | 8.1 | 94.4 | 10.2% |" in lines
    assert "| 1 | bf16 | dense | lstman4 | 64 | 26.0 | 0.0 | 0.0 | 2.0 | 28.0 | 0.0% |" in lines
    assert "| oktopk-p2 | oktopk | 2 | fp32 | 1 | 13 | 2.0 | 4.5 | 600.0 | 95.500 | 0.910 | 0.875 | 0.500 |" in lines
    assert "| Ok-Topk's exact selection <= torch.topk's time (density 0.02) | 4.20 ms vs 0.70 ms | NOT met |" in lines
    assert "| threshold reuse <= 0.1 ms | 0.20 ms | NOT met |" in lines
    assert "| Ok-Topk (selection + communication) <= 5% of compute, P = 2 | 10.2% | NOT met |" in lines
    assert "| step <= 30 ms with bf16 (dense, P = 1) | 28.0 ms | met |" in lines


def test_summary_compares_the_trainings_at_their_common_epoch(tmp_path):
    """oktopk-p2 reached 1 epoch only: that is where all four are compared; dense-p1-bf16 reached 2."""
    write_suite_outputs(tmp_path)
    (tmp_path / "runs" / "oktopk-p2").rename(tmp_path / "oktopk-p2-aside")  # first: the other three, epoch 2
    lines = report("summary", str(tmp_path)).stdout.splitlines()
    assert "| dense-p1 | 3 | 0.200 | +0.0% | 0.160 | 0.140 | +0.0% |" in lines
    assert "| dense-p1-bf16 | 2 | 0.204 | +2.0% | 0.204 | 0.150 | +7.1% |" in lines
    assert "| oktopk-p4 | 3 | 0.212 | +6.0% | 0.180 | 0.160 | +14.3% |" in lines
    assert "| lstman4 dense, 1 process: test WER <= 0.15 | 0.140 after 3 epochs | met |" in lines
    assert ("| Ok-Topk, P = 4: dev WER within 5% relative of dense fp32 at the same epoch | +6.0% at "
            "epoch 2 | NOT met |") in lines
    assert ("| bf16 dense, P = 1: dev WER within 2% relative of dense fp32 at the same epoch | +2.0% at "
            "epoch 2 | met |") in lines
    assert ("| Ok-Topk, P = 2: dev WER within 5% relative of dense fp32 at the same epoch | n/a at "
            "epoch 2 | n/a |") in lines
    # test WER only where both runs finished the same epochs: oktopk-p4 and dense-p1 both after 3
    assert ("| Ok-Topk, P = 4: test WER within 5% relative of dense fp32, both after the same epochs "
            "| +14.3% after 3 epochs | NOT met |") in lines
    assert ("| Ok-Topk, P = 2: test WER within 5% relative of dense fp32, both after the same epochs "
            "| n/a | n/a |") in lines

    (tmp_path / "oktopk-p2-aside").rename(tmp_path / "runs" / "oktopk-p2")
    lines = report("summary", str(tmp_path)).stdout.splitlines()
    assert "Dev WER at epoch 1, the last epoch every run reached (same epochs); test WER after each run's own " \
           "last epoch." in lines
    assert "| oktopk-p2 | 1 | 0.910 | +82.0% | 0.910 | 0.875 | +525.0% |" in lines
    assert ("| Ok-Topk, P = 2: dev WER within 5% relative of dense fp32 at the same epoch | +82.0% at "
            "epoch 1 | NOT met |") in lines
    assert ("| Ok-Topk, P = 2: test WER within 5% relative of dense fp32, both after the same epochs "
            "| n/a (not the same epochs) | n/a |") in lines


def test_summary_of_an_empty_folder_says_what_is_missing(tmp_path):
    proc = report("summary", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "# GPU suite: no GPU" in proc.stdout and proc.stdout.count("no result") == 3
    assert "| lstman4 dense, 1 process: test WER <= 0.15 | n/a after n/a epochs | n/a |" in proc.stdout
    assert "| threshold reuse <= 0.1 ms | n/a | n/a |" in proc.stdout


def test_env_requires_cuda_when_asked(tmp_path):
    proc = report("env", str(tmp_path), "--require-cuda")
    assert proc.returncode == 1 and "CUDA is not available" in proc.stderr
    env = json.loads((tmp_path / "env.json").read_text())
    assert env["cuda_available"] is False and env["gpus"] == [] and env["mpi"].startswith("MPICH")


def test_rate_counts_whole_epochs_between_the_first_and_last_epoch_end(tmp_path):
    """Epochs per minute from the epoch-end times only: start-up and the lines between do not count."""
    def write(side, ends):
        rows = [{"kind": "train", "step": 1, "epoch": 0, "time": 1000.0}]  # start-up before the first epoch end
        rows += [{"kind": "epoch", "step": 13 * (i + 1), "epoch": i + 1, "time": 1100.0 + t}
                 for i, t in enumerate(ends)]
        rows += [{"kind": "dev", "step": 13, "epoch": 1, "time": 1105.0}]
        (tmp_path / f"metrics_rate_{side}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    write("before", [0, 30, 60])  # 2 epochs in 60 s: 2 per minute
    write("after", [0, 10, 20, 30])  # 3 in 30 s: 6 per minute
    proc = report("rate", str(tmp_path), "--epochs", "12")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "| before | 3 | 2.0 | 6.0 |" in lines and "| after | 4 | 6.0 | 2.0 |" in lines, proc.stdout
    assert "| epochs per minute x2 | 3.00x | met |" in lines
    assert "| 12 epochs of dense lstman4 alone in <= 4 minutes | 2.0 min | met |" in lines
    write("after", [0])  # one epoch end: no rate
    proc = report("rate", str(tmp_path))
    assert "| after | 1 | n/a | n/a |" in proc.stdout and "| epochs per minute x2 | n/a | n/a |" in proc.stdout
