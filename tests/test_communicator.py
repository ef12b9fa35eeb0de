"""Communicator results and byte/message counters for P = 1..4 (tests/mpi/comm_check.py)."""
import os
import subprocess
import sys

import pytest

from sparse_asr.comm.mpi import YIELD_VARIABLE, oversubscribed, ranks_on_this_node
from tests.mpi_helpers import MPIEXEC, REPO, check_mpi

MODULE = ["-m", "tests.mpi.comm_check"]


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_communicator_under_mpiexec(nprocs):
    assert f"ok communicator P={nprocs}" in check_mpi(nprocs, MODULE, timeout=120)


@pytest.mark.mpi
@pytest.mark.parametrize("cores, user, expected", [(1, None, "1"), (2, None, None), (1, "0", "0")],
                         ids=["more-ranks-than-cores", "a-core-each", "the-users-value"])
def test_waiting_ranks_sleep_only_where_the_node_has_more_ranks_than_cores(cores, user, expected):
    """sparse_asr.comm.mpi: two ranks on one core wait by sleeping (MPICH's yield setting, decided before MPI
    initializes), two ranks with a core each keep MPICH's default, and a value the user set is kept."""
    if len(os.sched_getaffinity(0)) < cores:
        pytest.skip(f"needs {cores} cores")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop(YIELD_VARIABLE, None)
    if user is not None:
        env[YIELD_VARIABLE] = user
    script = ("import os; from sparse_asr.comm import Communicator; c = Communicator(); "
              f"seen = c.allgather_object(os.environ.get({YIELD_VARIABLE!r})); c.rank or print(c.size, *seen)")
    proc = subprocess.run(["taskset", "-c", f"0-{cores - 1}", MPIEXEC, "-n", "2", sys.executable, "-c", script],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.split() == ["2", str(expected), str(expected)], proc.stdout


@pytest.mark.unit
def test_oversubscribed_is_ranks_on_the_node_over_cores():
    assert oversubscribed(ranks_on_this_node({"MPI_LOCALNRANKS": "4"}), cores=2)
    assert not oversubscribed(ranks_on_this_node({"MPI_LOCALNRANKS": "2"}), cores=2)
    assert not oversubscribed(ranks_on_this_node({}), cores=1)  # not MPICH's launcher: nothing known, nothing changed
    assert not oversubscribed(ranks_on_this_node({"MPI_LOCALNRANKS": "many"}), cores=1)


@pytest.mark.tooling
@pytest.mark.parametrize("flags", [[], ["--no-mpi"]], ids=["singleton", "without-mpi4py"])
def test_communicator_one_process_without_mpiexec(flags):
    """P = 1 works when started as a plain `python` (MPI singleton) and when mpi4py is missing."""
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, *MODULE, *flags], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok communicator P=1" in proc.stdout


@pytest.mark.unit
def test_cuda_aware_buffers_wait_for_the_current_stream(monkeypatch):
    """distributed.cuda_aware_mpi: a device tensor goes to MPI as it is, so the kernels queued on the
    current stream (which produce it, or last used its memory) must finish first; host tensors never
    touch CUDA. No GPU here: a stand-in tensor and a recording torch.cuda.current_stream."""
    import numpy as np
    import torch

    from sparse_asr.comm import Communicator

    calls = []

    class Stream:
        def synchronize(self):
            calls.append("synchronize")

    def current_stream(device=None):
        calls.append(("current_stream", device))
        return Stream()

    monkeypatch.setattr(torch.cuda, "current_stream", current_stream)
    comm = Communicator(cuda_aware=True)
    host = torch.arange(4.0)
    assert isinstance(comm._buf(host), np.ndarray) and calls == []

    class DeviceTensor:  # what _buf reads of a CUDA tensor
        is_cuda = True
        device = "cuda:1"

    tensor = DeviceTensor()
    assert comm._buf(tensor) is tensor
    assert calls == [("current_stream", "cuda:1"), "synchronize"]


@pytest.mark.mpi
def test_the_yield_benchmark_prints_both_settings_beside_the_floor():
    proc = subprocess.run([sys.executable, "bench/mpi_yield.py", "--ranks", "3", "--seconds", "0.05", "--rounds", "3"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in proc.stdout.splitlines()
            if line.startswith("| 3 |")]
    assert [row[1] for row in rows] == ["one at a time", "all at once"], proc.stdout
    for _, pattern, floor, spinning, sleeping, ratio in rows:
        # no pattern beats its floor (the work is CPU time, not wall time); the ratio is of rounded figures
        assert float(spinning) >= float(floor) * 0.95 and float(sleeping) >= float(floor) * 0.95, proc.stdout
        assert float(ratio) == pytest.approx(float(spinning) / float(sleeping), rel=0.1), proc.stdout
