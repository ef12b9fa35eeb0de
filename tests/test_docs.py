"""DESIGN.md's layout names every module of the package, and the README stays a page a newcomer reads."""
import re

import pytest

from tests.conftest import REPO


@pytest.mark.unit
def test_design_map_names_every_module():
    layout = (REPO / "DESIGN.md").read_text().split("## 1. Layout", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"[A-Za-z0-9_]+\.py", layout))
    modules = {p.name for p in (REPO / "sparse_asr").rglob("*.py") if p.name != "__init__.py"}
    assert modules - named == set(), f"DESIGN.md's layout does not name {sorted(modules - named)}"
    around = (REPO, REPO / "scripts", REPO / "tests", REPO / "bench")  # the command lines the layout may name too
    outside = {"__init__.py"} | {p.name for d in around for p in d.glob("*.py")}
    assert named - modules - outside == set(), \
        f"DESIGN.md's layout names files the package does not have: {sorted(named - modules)}"


@pytest.mark.unit
def test_readme_is_a_page_and_copies_no_result_figures():
    """README <= 200 lines; its Results section points at docs/results.md instead of copying figures (they go
    stale there): no WER, time or ratio figures in it."""
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 200, len(readme.splitlines())
    results = readme.split("\n## Results\n", 1)[1].split("\n## ", 1)[0]
    assert "docs/results.md" in results
    assert not re.findall(r"\b0\.\d{2,}\b|\d+(\.\d+)? ?(ms|min|s)\b|\d+(\.\d+)?x\b", results), results


@pytest.mark.tooling
def test_an_unmarked_test_fails_collection(tmp_path):
    """tests/conftest.py: a test that names no tier stops the run instead of landing in the quick tier."""
    import shutil
    import subprocess
    import sys

    shutil.copytree(REPO / "tests", tmp_path / "tests", ignore=shutil.ignore_patterns("test_*.py", "__pycache__"))
    (tmp_path / "tests" / "test_unmarked.py").write_text("def test_anything():\n    assert True\n")
    (tmp_path / "pytest.ini").write_text((REPO / "pytest.ini").read_text())
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "no tier: tests/test_unmarked.py::test_anything" in proc.stdout + proc.stderr, \
        proc.stdout + proc.stderr


@pytest.mark.unit
def test_every_script_and_bench_sets_its_process_up_through_setup_process():
    """Threads and devices are chosen in one place (training/launch.py's setup_process), not per script."""
    entry_points = [REPO / "train.py", REPO / "evaluate.py", *(REPO / "bench").glob("*.py"),
                    *(REPO / "scripts").glob("*.py")]
    for path in entry_points:
        text = path.read_text()
        assert "set_num_threads(" not in text and "set_num_interop_threads(" not in text, \
            f"{path.name} sets torch's threads itself: use launch.setup_process"
    torch_users = [p.name for p in (REPO / "bench").glob("*.py") if "import torch" in p.read_text()
                   and '__name__ == "__main__"' in p.read_text()  # a bench run as a program, not a module of one
                   and p.name not in ("gpu_report.py",  # only reads what the device is
                                      "startup.py")]  # imports torch only in the processes it times
    assert all("setup_process(" in (REPO / "bench" / name).read_text() or name in ("project_scaling.py",)
               for name in torch_users), \
        [n for n in torch_users if "setup_process(" not in (REPO / "bench" / n).read_text()]
