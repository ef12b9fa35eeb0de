"""Run a script under real MPI ranks (`mpiexec -n P`) from a pytest test."""
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MPIEXEC = str(Path(sys.executable).parent / "mpiexec")


def run_mpi(nprocs: int, args: list[str], timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """`mpiexec -n nprocs python ARGS...` from the repository root (scripts under tests/ as `-m tests.mpi.NAME`,
    so `tests` imports without PYTHONPATH); returns the finished process.
    One thread per rank: this machine has 2 cores and tests run up to 4 ranks."""
    full_env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    full_env.update(env or {})
    cmd = [MPIEXEC, "-n", str(nprocs), sys.executable, *args]
    return subprocess.run(cmd, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout)


def check_mpi(nprocs: int, args: list[str], timeout: float = 300, env: dict | None = None) -> str:
    """Like run_mpi, but fails the test (showing both streams) unless every rank exits 0."""
    proc = run_mpi(nprocs, args, timeout=timeout, env=env)
    assert proc.returncode == 0, (f"mpiexec -n {nprocs} {' '.join(args)} failed ({proc.returncode})\n"
                                  f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    return proc.stdout
