"""Shared fixtures: AN4 prepared from the project's copy of the archive (required by the suite), one torch thread;
and the test tiers. Every test is in a tier (pytest -m TIER; an mpiexec test in a tooling module is in both):
  unit     in-process, no AN4 audio, no MPI launch: the edit-test loop (bash scripts/test.sh --quick)
  data     reads the real AN4 corpus (uses one of DATA_FIXTURES), in process
  mpi      launches ranks with mpiexec (marked where the test is written)
  tooling  drives the project's scripts, entry points and bundles in subprocesses, as a user would
mpi and tooling are marked by hand (and data where a test reads the corpus without a fixture); otherwise data
and unit follow from the fixtures a test uses, so they cannot drift."""
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
    for item in items:
        marked = [tier for tier in ("mpi", "tooling", "data") if item.get_closest_marker(tier)]
        if not marked:
            item.add_marker("data" if DATA_FIXTURES & set(item.fixturenames) else "unit")


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
