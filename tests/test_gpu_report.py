"""bench/gpu_report.py: the GPU suite's summary from raw outputs (here: the figures issue 12 quotes
from an H200, written the way the suite's steps write them), and the environment report."""
import json
import subprocess
import sys

from tests.conftest import REPO

SELECTION = """numel = 27,569,568, float32, median of 10 runs; ratio = torch.topk time / method time

| device | threads | density | k | method | median ms | vs torch.topk | exact |
|---|---|---|---|---|---|---|---|
| cuda | 8 | 0.02 | 551,391 | torch.topk | 0.7 | 1.00x | yes |
| cuda | 8 | 0.02 | 551,391 | radix select | 2.0 | 0.35x | yes |
| cuda | 8 | 0.02 | 551,391 | sample+refine (ours) | 4.2 | 0.17x | yes |
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
    run = out / "runs" / "oktopk-p2"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("compression:\n  algorithm: oktopk\ndistributed:\n  world_size: 2\n"
                                     "train:\n  precision: fp32\n")
    records = [{"kind": "train", "step": 10, "epoch": 0, "time": 100.0, "train/samples_per_sec": 600.0},
               {"kind": "epoch", "step": 13, "epoch": 1, "time": 102.0, "epoch/loss": 95.5, "epoch/seconds": 2.0},
               {"kind": "val", "step": 13, "epoch": 1, "time": 103.0, "val/wer": 0.91},
               {"kind": "test", "step": 13, "epoch": 1, "time": 104.5, "test/wer": 0.875, "test/cer": 0.5}]
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
    assert "| cuda | 8 | 0.02 | 551,391 | sample+refine (ours) | 4.2 | 0.17x | yes |" in lines
    assert "| 2 | fp32 | oktopk | lstman4 | 64 | 78.3 | 3.0 | 5.0 | 8.1 | 94.4 | 10.2% |" in lines
    assert "| 1 | bf16 | dense | lstman4 | 64 | 26.0 | 0.0 | 0.0 | 2.0 | 28.0 | 0.0% |" in lines
    assert "| oktopk-p2 | oktopk | 2 | fp32 | 1 | 13 | 2.0 | 4.5 | 600.0 | 95.500 | 0.910 | 0.875 | 0.500 |" in lines
    assert "| Ok-Topk's exact selection <= torch.topk's time (density 0.02) | 4.20 ms vs 0.70 ms | NOT met |" in lines
    assert "| threshold reuse <= 0.1 ms | 0.20 ms | NOT met |" in lines
    assert "| Ok-Topk (selection + communication) <= 5% of compute, P = 2 | 10.2% | NOT met |" in lines
    assert "| step <= 30 ms with bf16 (dense, P = 1) | 28.0 ms | met |" in lines


def test_summary_of_an_empty_folder_says_what_is_missing(tmp_path):
    proc = report("summary", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "# GPU suite: no GPU" in proc.stdout and proc.stdout.count("no result") == 3
    assert "| threshold reuse <= 0.1 ms | n/a | n/a |" in proc.stdout


def test_env_requires_cuda_when_asked(tmp_path):
    proc = report("env", str(tmp_path), "--require-cuda")
    assert proc.returncode == 1 and "CUDA is not available" in proc.stderr
    env = json.loads((tmp_path / "env.json").read_text())
    assert env["cuda_available"] is False and env["gpus"] == [] and env["mpi"].startswith("MPICH")
