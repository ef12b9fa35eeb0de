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


def test_everything_a_run_writes_is_readable_by_the_group_as_the_umask_says(an4_manifests, tmp_path):
    """On a shared project allocation the group evaluates and compares runs: config.yaml, checkpoint files,
    their index, metrics.jsonl (rewritten by a resume), the events and prepared manifests get 0666 less the
    umask, not mkstemp's owner-only 0600."""
    import stat

    from sparse_asr.data.manifest import read_manifest, write_manifest
    from tests.mpi.train_common import run_training

    previous = os.umask(0o022)
    try:
        overrides = tiny_overrides(an4_manifests, tmp_path, "shared", train__epochs=1)
        run_training(overrides)
        run_training(overrides + ["train.epochs=2"], resume=str(tmp_path / "shared"))
        write_manifest(read_manifest(an4_manifests / "an4_dev.csv"), tmp_path / "dev.csv")
        os.umask(0o027)
        write_manifest(read_manifest(an4_manifests / "an4_dev.csv"), tmp_path / "dev_027.csv")
    finally:
        os.umask(previous)
    files = [p for p in (tmp_path / "shared").rglob("*") if p.is_file() and not p.is_symlink()]
    assert {p.name for p in files} >= {"config.yaml", "metrics.jsonl", "manifest.json", "shared.pt", "rank0.pt"}
    modes = {str(p.relative_to(tmp_path)): oct(stat.S_IMODE(p.stat().st_mode)) for p in files}
    assert set(modes.values()) == {"0o644"}, modes
    assert oct(stat.S_IMODE((tmp_path / "dev.csv").stat().st_mode)) == "0o644"
    assert oct(stat.S_IMODE((tmp_path / "dev_027.csv").stat().st_mode)) == "0o640"
