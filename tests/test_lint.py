"""The linter (ruff, configured in pyproject.toml: pyflakes and pycodestyle's errors, 120 columns) passes on the whole
tree, and it is the configured linter that runs: a planted 121-column line fails it."""
import subprocess
import sys

import pytest

from tests.mpi_helpers import REPO

pytestmark = pytest.mark.tooling


def ruff(*args, cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_the_tree_passes_the_linter():
    proc = ruff(".")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_line_past_120_columns_fails_it(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("x = 1\n" + "y = 1  # " + "ab " * 36 + "abc\n")  # 9 + 108 + 3 = 120 columns: fine
    assert ruff("--config", str(REPO / "pyproject.toml"), str(planted)).returncode == 0
    planted.write_text("x = 1\n" + "y = 1  # " + "ab " * 36 + "abcd\n")  # 121 columns
    proc = ruff("--config", str(REPO / "pyproject.toml"), str(planted))
    assert proc.returncode == 1 and "E501" in proc.stdout, proc.stdout + proc.stderr
