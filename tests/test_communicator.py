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
