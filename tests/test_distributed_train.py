"""Training under real MPI ranks (mpiexec): replicas stay identical with dense and every sparse
compressor, the loss falls, resume is exact with per-rank compressor state, a failing rank ends the
job promptly, and ranks with different configs are refused. Tiny model, a few dozen utterances."""
import re
import time

import pytest

from sparse_asr.compression import COMPRESSORS
from tests.mpi_helpers import check_mpi, run_mpi

pytestmark = pytest.mark.mpi


def test_every_algorithm_trains_on_two_ranks(an4_manifests, tmp_path):
    out = check_mpi(2, ["-m", "tests.mpi.train_algorithms", str(an4_manifests), str(tmp_path), "3", "32",
                        "--loss-must-fall"])
    for algorithm in COMPRESSORS:
        assert f"{algorithm}: P=2 epoch losses" in out, out


@pytest.mark.parametrize("nprocs", [3, 4])
def test_replicas_stay_identical(an4_manifests, tmp_path, nprocs):
    out = check_mpi(nprocs, ["-m", "tests.mpi.train_algorithms", str(an4_manifests), str(tmp_path), "2",
                             str(8 * nprocs)])
    assert out.count("replicas identical") == len(COMPRESSORS), out


def test_resume_after_a_mid_epoch_crash_is_exact_on_two_ranks(an4_manifests, tmp_path):
    """Ok-Topk on 2 ranks: train, dev and test loss, parameters, residuals and each rank's BatchNorm
    statistics equal the uninterrupted run's; a corrupted shard is refused. Then the 2-rank checkpoint
    resumed by 1 rank is refused before anything in the run directory changes."""
    out = check_mpi(2, ["-m", "tests.mpi.train_resume", str(an4_manifests), str(tmp_path), "oktopk"])
    assert "oktopk residual: P=2 resume after a mid-epoch crash == uninterrupted over 8 steps" in out, out
    assert "P=2: a flipped byte in rank1.pt is refused on every rank; run directory unchanged" in out, out

    from sparse_asr.training.checkpoint import CheckpointError
    from tests.mpi.train_common import run_training, tree_digest

    before = tree_digest(tmp_path / "crashed")
    with pytest.raises(CheckpointError, match="written by 2 ranks but this job has 1"):
        run_training([], resume=str(tmp_path / "crashed"), config=None)
    assert tree_digest(tmp_path / "crashed") == before


def test_dgc_memory_and_its_density_warmup_resume_exactly_on_three_ranks(an4_manifests, tmp_path):
    """TopkA with DGC's memory and density warm-up (the paper's setup) on 3 ranks: a mid-epoch crash in the second
    epoch resumes to the uninterrupted run's momentum, velocity, parameters, losses and density schedule."""
    out = check_mpi(3, ["-m", "tests.mpi.train_resume", str(an4_manifests), str(tmp_path), "topka", "dgc"])
    assert "topka dgc: P=3 resume after a mid-epoch crash == uninterrupted over 8 steps" in out, out


def test_ef21_memory_resumes_exactly_on_two_ranks(an4_manifests, tmp_path):
    """Ok-Topk with EF21-SGDM's memory on 2 ranks: a mid-epoch crash resumes to the uninterrupted run's momentum,
    rank and global estimates, parameters and losses."""
    out = check_mpi(2, ["-m", "tests.mpi.train_resume", str(an4_manifests), str(tmp_path), "oktopk", "ef21"])
    assert "oktopk ef21: P=2 resume after a mid-epoch crash == uninterrupted over 8 steps" in out, out


@pytest.mark.parametrize("algorithm, nprocs", [("onebit", 3), ("randomk", 2)])
def test_quantized_exchanges_resume_exactly(an4_manifests, tmp_path, algorithm, nprocs):
    """The 1-bit exchange (worker and server errors, uneven chunks at P = 3) and random-k (its residual and the step
    count its shared draws follow): a mid-epoch crash resumes to the uninterrupted run's state and losses."""
    out = check_mpi(nprocs, ["-m", "tests.mpi.train_resume", str(an4_manifests), str(tmp_path), algorithm])
    assert f"{algorithm} residual: P={nprocs} resume after a mid-epoch crash == uninterrupted over 8 steps" in out, out


def test_max_minutes_is_decided_by_rank_0_for_every_rank(an4_manifests, tmp_path):
    out = check_mpi(2, ["-m", "tests.mpi.train_timed", str(an4_manifests), str(tmp_path)], timeout=180)
    assert "P=2: every rank stopped where rank 0's clock said (3 epochs, then 1)" in out, out


def test_an_exception_on_rank_1_ends_every_rank_promptly(an4_manifests, tmp_path):
    proc = run_mpi(2, ["-m", "tests.mpi.train_fail", str(an4_manifests), str(tmp_path)], timeout=120)
    ended = time.time()
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "rank 1: RuntimeError: injected failure at step 3" in proc.stderr, proc.stdout + proc.stderr
    assert "finished normally" not in proc.stdout
    injected = float(re.search(r"INJECTED (\d+\.\d+)", proc.stderr).group(1))
    assert ended - injected < 10, f"the job took {ended - injected:.1f} s to end after the failure"


def test_ranks_with_different_configs_are_refused(an4_manifests, tmp_path):
    proc = run_mpi(2, ["-m", "tests.mpi.train_mismatch", str(an4_manifests), str(tmp_path)], timeout=120)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "the configuration differs between ranks" in proc.stderr, proc.stderr
    assert "seed: rank 0 has 0, rank 1 has 1" in proc.stderr, proc.stderr
    assert "finished normally" not in proc.stdout
    assert not (tmp_path / "mismatch").exists()  # refused before anything was written


def test_sharded_evaluation_equals_one_process(an4_manifests, tmp_path):
    """evaluate.py under 2 ranks (each scores part of dev, the sums are allreduced) prints exactly the
    single-process figures."""
    from tests.mpi.train_common import run_training, tiny_overrides

    run_training(tiny_overrides(an4_manifests, tmp_path, "ev", train__epochs=1, data__test_manifest="''"))
    args = ["evaluate.py", str(tmp_path / "ev" / "checkpoints" / "last"),
            "--manifest", str(an4_manifests / "an4_dev.csv"), "--worst", "0", "--batch-size", "16"]
    def figures(out):
        pairs = [line.split() for line in out.splitlines() if line.startswith("  ") and len(line.split()) == 2]
        return {key: float(value) for key, value in pairs}

    emissions = {P: tmp_path / f"emissions_p{P}.npz" for P in (1, 2)}
    single, sharded = (figures(check_mpi(P, args + ["--emissions", str(emissions[P])])) for P in (1, 2))
    assert set(single) == {"wer", "cer", "wer_utt_mean", "loss"}, single
    assert ({k: single[k] for k in ("wer", "cer", "wer_utt_mean")}
            == {k: sharded[k] for k in ("wer", "cer", "wer_utt_mean")})
    assert sharded["loss"] == pytest.approx(single["loss"], rel=1e-5)  # float sums in another order

    # the log-probabilities of every dev utterance, in the manifest's order, the same from one rank or two (a
    # code apart at most: another batch, other rounding)
    from sparse_asr.data.manifest import read_manifest
    from sparse_asr.training.emissions import STEP, load_emissions

    (ids1, lp1), (ids2, lp2) = load_emissions(emissions[1]), load_emissions(emissions[2])
    assert ids1 == ids2 == list(read_manifest(an4_manifests / "an4_dev.csv")["utt_id"])
    assert [a.shape for a in lp1] == [b.shape for b in lp2] and lp1[0].shape[1] == 29
    assert max(float((a - b).abs().max()) for a, b in zip(lp1, lp2)) <= STEP
