"""The suite's scheduling (scripts/test.sh): on its two pytest-xdist workers, a module marked as one xdist_group
(test_offline_bundle.py, whose module fixtures pack and unpack a bundle) runs on one worker, so that its fixtures
are built once. Checked on a probe module run with test.sh's pytest options: a pytest or pytest-xdist release that
stops honouring the groups fails here, not as a suite that silently builds the bundle twice."""
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.tooling

PROBE = '''import pytest

pytestmark = pytest.mark.xdist_group("bundle")

@pytest.mark.parametrize("i", range(6))
def test_grouped(i):
    pass
'''
OTHER = '''import pytest

@pytest.mark.parametrize("i", range(6))
def test_free(i):
    pass
'''


def test_a_module_group_runs_on_one_worker(tmp_path):
    (tmp_path / "test_probe.py").write_text(PROBE)
    (tmp_path / "test_other.py").write_text(OTHER)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    assert "workers=(-n 2 --dist loadgroup)" in (REPO / "scripts/test.sh").read_text()  # the options tried here
    proc = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p",
                           "no:cacheprovider", str(tmp_path)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ran_on = {}  # test function -> the workers that ran it, from lines like "[gw0] [ 25%] PASSED test_probe.py::..."
    for line in proc.stdout.splitlines():
        if " PASSED " in line and line.startswith("[gw"):
            ran_on.setdefault(line.split("::")[1].split("[")[0], set()).add(line.split()[0])
    assert len(ran_on["test_grouped"]) == 1 and "test_grouped[0]@bundle" in proc.stdout, proc.stdout
    assert len(ran_on["test_free"]) >= 1
