"""Communicator results and byte/message counters for P = 1..4 (tests/mpi/comm_check.py)."""
import subprocess
import sys

import pytest

from tests.mpi_helpers import REPO, check_mpi

MODULE = ["-m", "tests.mpi.comm_check"]


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_communicator_under_mpiexec(nprocs):
    assert f"ok communicator P={nprocs}" in check_mpi(nprocs, MODULE, timeout=120)


@pytest.mark.parametrize("flags", [[], ["--no-mpi"]], ids=["singleton", "without-mpi4py"])
def test_communicator_one_process_without_mpiexec(flags):
    """P = 1 works when started as a plain `python` (MPI singleton) and when mpi4py is missing."""
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, *MODULE, *flags], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok communicator P=1" in proc.stdout
