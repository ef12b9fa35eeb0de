"""What a cluster user's mistakes and a cluster's failures must produce: a clear message naming the cause
(file, line, key or machine), nothing lost, and an end (never a hang). Each case runs the real entry point
the way a user would, in a subprocess."""
import os
import subprocess
import sys

from tests.conftest import REPO
from tests.mpi.train_common import SMOKE_CONFIG, tiny_overrides


def train_cli(args: list[str], env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "train.py", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def test_bf16_on_a_cpu_without_bfloat16_kernels_is_refused_before_the_run_starts(an4_manifests, tmp_path):
    """oneDNN capped at AVX2 (an AMD EPYC's instruction set): bf16 would die inside the LSTM's first forward
    with 'could not create a primitive descriptor'; instead train.py refuses it by name, writes nothing."""
    proc = train_cli(["--config", str(SMOKE_CONFIG), *tiny_overrides(an4_manifests, tmp_path, "bf16"),
                      "train.precision=bf16", "model.sync_batchnorm=true"], env={"ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert proc.returncode == 1, proc.stderr
    assert "ConfigError: train.precision=bf16: this CPU (" in proc.stderr, proc.stderr
    assert "has no oneDNN bfloat16 kernels" in proc.stderr and "use train.precision=fp32" in proc.stderr
    assert "Traceback" not in proc.stderr and "primitive descriptor" not in proc.stderr
    assert not (tmp_path / "bf16").exists()
