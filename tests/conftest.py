"""Shared fixtures: AN4 prepared from the project's copy of the archive (required by the suite), one torch thread;
and the test tiers. Every test is in a tier (pytest -m TIER; an mpiexec test in a tooling module is in both):
  unit     in-process, no AN4 audio, no MPI launch: the edit-test loop (bash scripts/test.sh --quick)
  data     reads the real AN4 corpus (uses one of DATA_FIXTURES), in process
  mpi      launches ranks with mpiexec (marked where the test is written)
  tooling  drives the project's scripts, entry points and bundles in subprocesses, as a user would
unit, mpi and tooling are marked by hand (and data where a test reads the corpus without a fixture); data
follows from the corpus fixtures a test uses, so it cannot drift. A test with no tier fails collection.
scripts/test.sh runs the suite on two pytest-xdist workers, each test where a worker is free (holding the mpi tests
to one launch at a time made the suite slower, docs/results.md). Each worker builds the module fixtures its tests
use, so the tests sharing an expensive one are one xdist group, which runs on one worker: test_offline_bundle.py (a
bundle packed and unpacked), test_accuracy_bench.py's tiny benchmark, test_runtime.py's trained run."""
from pathlib import Path

import pytest
import torch

from sparse_asr.data.an4 import prepare_an4
from sparse_asr.data.manifest import read_manifest, write_manifest

REPO = Path(__file__).resolve().parent.parent
AN4_ARCHIVE = REPO.parent / "shared" / "data" / "an4_sphere.tar.gz"
DATA_DIR = REPO / "datasets"  # gitignored; the extraction is reused across runs
TEST_MANIFESTS = DATA_DIR / "test_manifests"  # never the user's manifests/


DATA_FIXTURES = {"an4_prepared", "an4_manifests", "tiny_manifest"}
TIERS = ("unit", "data", "mpi", "tooling")


def pytest_collection_modifyitems(items):
    """data follows from the corpus fixtures; every other test names its tier. An unmarked test is an error
    (it would otherwise land in the quick tier whatever it does), and so is a unit test that reads AN4."""
    unmarked, misplaced = [], []
    for item in items:
        reads_an4 = bool(DATA_FIXTURES & set(item.fixturenames))
        if reads_an4 and not item.get_closest_marker("data"):
            item.add_marker("data")
        if item.get_closest_marker("unit") and (reads_an4 or any(item.get_closest_marker(t) for t in TIERS[1:])):
            misplaced.append(item.nodeid)
        elif not any(item.get_closest_marker(tier) for tier in TIERS):
            unmarked.append(item.nodeid)
    if unmarked or misplaced:
        raise pytest.UsageError(
            "every test names its tier (@pytest.mark.unit / data / mpi / tooling, or a module's pytestmark; "
            "tests/conftest.py):" + "".join(f"\n  no tier: {n}" for n in unmarked)
            + "".join(f"\n  unit, but reads AN4 or is also in another tier: {n}" for n in misplaced))


@pytest.fixture(scope="session")
def an4_prepared() -> dict:
    """prepare_an4's result (paths) for AN4 extracted under datasets/, manifests in datasets/test_manifests/."""
    if not AN4_ARCHIVE.is_file():
        pytest.fail(f"the AN4 archive {AN4_ARCHIVE} is required by the test suite and is missing "
                    f"(it is CMU's an4_sphere.tar.gz; see ../shared/data/README.md)")
    return prepare_an4(AN4_ARCHIVE, DATA_DIR, TEST_MANIFESTS)


@pytest.fixture(scope="session")
def an4_manifests(an4_prepared) -> Path:
    """Directory holding an4_train.csv, an4_dev.csv and an4_test.csv."""
    return an4_prepared["train"].parent


@pytest.fixture(scope="session")
def tiny_manifest(an4_manifests, tmp_path_factory) -> Path:
    """A manifest (our format) of the 8 shortest real AN4 training utterances, under pytest's tmp dir."""
    train = read_manifest(an4_manifests / "an4_train.csv")
    tiny = train.sort_values(["duration", "utt_id"], kind="stable").head(8)
    path = tmp_path_factory.mktemp("tiny") / "tiny.csv"
    write_manifest(tiny, path)
    return path


@pytest.fixture
def one_thread():
    """One torch thread for the test (restored after): training tests share 2 cores with MPI ranks."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
