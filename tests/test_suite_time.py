"""bench/suite_time.py: as a pytest plugin on xdist workers it records each test's wall and CPU seconds, the CPU of
the processes a test waited for included; its report tables them by file and by test. Checked on a probe module:
a test whose child process burns CPU, and one that sleeps."""
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.tooling

BURN_S = 0.8
PROBE = f'''import subprocess
import sys
import time


def test_child_burns_cpu():
    subprocess.run([sys.executable, "-c", "import time\\nt = time.process_time()\\n"
                    "while time.process_time() - t < {BURN_S}: pass"], check=True)


def test_sleeps():
    time.sleep({BURN_S})
'''


def report(folder, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "bench/suite_time.py", str(folder), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60)


def test_records_each_tests_own_and_childrens_cpu_on_xdist_workers(tmp_path):
    (tmp_path / "test_probe.py").write_text(PROBE)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    record = tmp_path / "times"

    def suite(folder):
        return subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider",
                               "-p", "bench.suite_time", "--suite-time-dir", str(folder), str(tmp_path)],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(REPO)})

    proc = suite(record)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {}
    for path in record.glob("*.tsv"):
        for line in path.read_text().splitlines():
            node, wall, cpu = line.split("\t")
            rows[node.split("::")[1]] = (float(wall), float(cpu))
    assert set(rows) == {"test_child_burns_cpu", "test_sleeps"}, rows
    wall, cpu = rows["test_child_burns_cpu"]
    assert cpu >= BURN_S and wall >= 0.9 * cpu, rows  # the child's CPU is the test's
    wall, cpu = rows["test_sleeps"]
    assert wall >= BURN_S and cpu < BURN_S / 2, rows  # sleeping is wall time, not CPU

    proc = report(record, "--cores", "2", "--top", "1")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("2 tests on ") and "2 cores x " in lines[0], proc.stdout
    by_file = next(line for line in lines if line.startswith("| test_probe.py |")).split(" | ")
    total_cpu = sum(cpu for _, cpu in rows.values())
    assert by_file[1] == "2" and abs(float(by_file[3]) - total_cpu) < 0.1 and by_file[4] == "100.0% |", by_file
    top = [line for line in lines if line.startswith("| test_probe.py::")]
    assert len(top) == 1 and "test_child_burns_cpu" in top[0], proc.stdout
    # a second run into the same folder would add its rows to the first's: refused before any test runs
    proc = suite(record)
    assert proc.returncode == 4 and "holds the times of another run" in proc.stderr, proc.stdout + proc.stderr
    assert sum(len(path.read_text().splitlines()) for path in record.glob("*.tsv")) == 2
    # a file where the folder should be: one line before any test runs, not an error in every test
    a_file = next(record.glob("*.tsv"))
    proc = suite(a_file)
    said = f"--suite-time-dir: the folder {a_file} exists and is not a directory"
    assert proc.returncode == 4 and said in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and "passed" not in proc.stdout, proc.stdout + proc.stderr


def test_report_refuses_what_it_cannot_read(tmp_path):
    proc = report(tmp_path)
    assert proc.returncode == 1 and proc.stderr.strip() == (
        f"suite_time.py: error: no *.tsv in {tmp_path} (record with: bash scripts/test.sh -p bench.suite_time "
        f"--suite-time-dir {tmp_path})")
    (tmp_path / "1.tsv").write_text("tests/test_a.py::test_x\t1.0\t0.5\ntests/test_a.py::test_y\tslow\t0.5\n")
    proc = report(tmp_path)
    assert proc.returncode == 1 and f"{tmp_path / '1.tsv'}:2: expected" in proc.stderr, proc.stderr
    proc = report(tmp_path / "1.tsv")
    assert proc.returncode == 2 and "is not a directory" in proc.stderr
