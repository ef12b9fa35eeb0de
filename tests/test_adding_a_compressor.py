"""Adding a compressor is its file, one registration in COMPRESSORS and its reference (README, "Adding a
compressor"). A toy compressor added that way and no other way is checked against its reference by
tests/mpi/compressor_check.py, projected by bench/project_scaling.py, measured by bench/comm_volume.py and swept by
scripts/sweep.sh; without a reference, or with a wrong one, the check fails."""
import json
import os
import shlex
import subprocess

import pandas as pd
import pytest

from sparse_asr.analysis import scaling_report
from sparse_asr.comm import ThreadGroup
from sparse_asr.compression import COMPRESSORS
from sparse_asr.compression.topk_allgather import TopkAllgather
from tests import reference as ref
from tests.mpi import compressor_check
from tests.mpi_helpers import REPO, check_mpi


class Toy(TopkAllgather):
    """A new algorithm's file: TopkA under another name."""

    name = "toy"


# The same file and registration for the scripts and benches, run in interpreters of their own: a sitecustomize
# module on PYTHONPATH, which Python imports at start-up.
TOY_MODULE = f'''
from sparse_asr.compression import COMPRESSORS
from sparse_asr.compression.topk_allgather import TopkAllgather


class Toy(TopkAllgather):
    name = {Toy.name!r}


COMPRESSORS[Toy.name] = Toy
'''
TOY_REFERENCE = ref.Reference(ref.topka_expected, [(0.05, {})])  # its reference: the numpy top-k and allgather


@pytest.fixture
def toy_registered(monkeypatch):
    monkeypatch.setitem(COMPRESSORS, Toy.name, Toy)


def checked_cases(monkeypatch) -> list[tuple]:
    """The (algorithm, density, options) cases compressor_check's whole run goes through, at P = 1, recorded
    instead of run (the memories and wrappers it checks too are left out)."""
    cases = []
    monkeypatch.setattr(compressor_check, "check_case", lambda comm, *case: cases.append(case))
    monkeypatch.setattr(compressor_check, "check_memories_and_wrappers", lambda comm: None)
    ThreadGroup(1, timeout_s=60).run(compressor_check.run_cases)
    return cases


@pytest.mark.unit
def test_the_reference_check_takes_a_registered_compressor(toy_registered, monkeypatch):
    with pytest.raises(AssertionError, match="algorithm 'toy' has no entry in tests/reference.py REFERENCES"):
        checked_cases(monkeypatch)
    monkeypatch.setitem(ref.REFERENCES, Toy.name, TOY_REFERENCE)
    assert ("toy", 0.05, {}) in checked_cases(monkeypatch)


@pytest.mark.unit
def test_a_registered_compressor_is_checked_against_its_reference(toy_registered, monkeypatch, one_thread):
    monkeypatch.setitem(ref.REFERENCES, Toy.name, TOY_REFERENCE)
    ThreadGroup(2, timeout_s=120).run(compressor_check.check_algorithm, Toy.name)
    # the check can fail: the same toy against another algorithm's reference
    monkeypatch.setitem(ref.REFERENCES, Toy.name, ref.Reference(ref.dense_expected, [(0.05, {})]))
    with pytest.raises(AssertionError):
        ThreadGroup(2, timeout_s=120).run(compressor_check.check_algorithm, Toy.name)


@pytest.mark.unit
def test_a_registered_compressor_is_projected(toy_registered, tmp_path, capsys):
    assert scaling_report.main(["--out", str(tmp_path), "--ranks", "4", "64"]) == 0
    table = pd.read_csv(tmp_path / "scaling.csv")
    assert list(dict.fromkeys(table.algorithm)) == list(COMPRESSORS) and "toy" in set(table.algorithm)
    toy, topka = (table[table.algorithm == name].drop(columns="algorithm").reset_index(drop=True)
                  for name in ("toy", "topka"))
    pd.testing.assert_frame_equal(toy, topka)  # TopkA's closed form, by inheritance


@pytest.mark.tooling
@pytest.mark.mpi
def test_a_registered_compressor_is_swept_and_measured(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(TOY_MODULE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(["bash", "scripts/sweep.sh", "-c", "tests/configs/cluster.yaml", "--dry-run",
                           "--ranks", "4", "--densities", "0.02"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    swept = {shlex.split(line)[8] for line in proc.stdout.splitlines()}
    assert swept == {f"compression.algorithm={name}" for name in [*COMPRESSORS, "toy"]}

    measured = tmp_path / "comm_volume.json"
    check_mpi(1, ["bench/comm_volume.py", "--numel", "5000", "--steps", "2", "--json", str(measured)],
              env={"PYTHONPATH": env["PYTHONPATH"]}, timeout=300)
    records = json.loads(measured.read_text())["records"]
    assert [r["algorithm"] for r in records] == [*COMPRESSORS, "toy"]
