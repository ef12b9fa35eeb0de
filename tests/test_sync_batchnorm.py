"""Synchronized BatchNorm in one process: it equals torch's own batch_norm on the valid positions
(real AN4 batch, unequal lengths), equals nn.BatchNorm where nothing is padded, is plain BatchNorm
in eval mode, and its backward is the true gradient (gradcheck). Several ranks: tests/mpi/syncbn_check.py."""
import pytest
import torch

from sparse_asr.comm import Communicator
from sparse_asr.models import build_model
from sparse_asr.models.sync_batchnorm import COUNT_AS, SyncBatchNorm, SyncBatchNormFunction
from tests.mpi_helpers import check_mpi
from tests.batchnorm_reference import (batchnorm_buffers, loss_and_gradient, randomize_batchnorms, relative_error,
                                       spread_utterances, valid_frames_model)

MODEL = "lstman4_tiny"


@pytest.fixture(scope="module")
def utterances(an4_manifests):
    return spread_utterances(an4_manifests / "an4_train.csv", 6)


# Against the reference in float64: float64 shows the arithmetic is exact; float32 (what training runs)
# is as close as float32 gets (relative gradient error ~5e-5 here, the plain model's own float32 error
# ~4e-5), against ~0.7 for per-rank statistics. (torch's batch_norm over the gathered frames in float32
# is itself off by 2e-3: the reference runs in float64.)
TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-3}


def models(comm, dtype=torch.float32):
    """(plain model with random BatchNorm state, the same as a synchronized model)."""
    torch.manual_seed(0)
    plain = build_model(MODEL)
    randomize_batchnorms(plain, seed=1)
    synced = build_model(MODEL, sync_bn=comm)
    synced.load_state_dict(plain.state_dict())
    return plain.to(dtype), synced.to(dtype)


def assert_close_buffers(a: dict, b: dict, tolerance: float):
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key].to(a[key].dtype), rtol=tolerance, atol=tolerance,
                                   msg=lambda text: f"{key}: {text}")


@pytest.mark.unit
def test_same_parameters_and_buffers_as_the_plain_model():
    plain, synced = models(Communicator())
    assert {k: v.shape for k, v in plain.state_dict().items()} == {k: v.shape for k, v in synced.state_dict().items()}
    assert sum(isinstance(m, SyncBatchNorm) for m in synced.modules()) == 4  # 2 conv + 1 sequence-wise + output
    assert not any(isinstance(m, SyncBatchNorm) for m in plain.modules())  # sync off: torch's own, as before
    plain.load_state_dict(synced.state_dict())  # checkpoints load either way


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_one_process_equals_batchnorm_over_the_valid_frames(utterances, one_thread, dtype):
    lengths = [item[0].shape[1] for item in utterances]
    assert len(set(lengths)) == len(lengths), lengths  # padding differs per utterance
    plain, synced = models(Communicator(), dtype)
    reference = valid_frames_model(MODEL, plain.state_dict()).double()
    loss, grad = loss_and_gradient(synced, utterances)
    ref_loss, ref_grad = loss_and_gradient(reference, utterances)
    tolerance = TOLERANCE[dtype]
    assert loss == pytest.approx(ref_loss, rel=tolerance)
    assert relative_error(grad, ref_grad) < tolerance
    assert_close_buffers(batchnorm_buffers(synced), batchnorm_buffers(reference), tolerance)
    # the per-rank BatchNorm2d counts the padded steps: another gradient (the reference tells them apart)
    _, plain_grad = loss_and_gradient(plain, utterances)
    assert relative_error(plain_grad, ref_grad) > 100 * tolerance


def test_without_padding_equals_torch_batchnorm(utterances, one_thread):
    shortest = min(item[0].shape[1] for item in utterances)
    cropped = [(features[:, :shortest], target, i) for features, target, i in utterances]
    plain, synced = models(Communicator(), torch.float64)
    loss, grad = loss_and_gradient(synced, cropped)
    ref_loss, ref_grad = loss_and_gradient(plain, cropped)
    assert loss == pytest.approx(ref_loss, rel=1e-9)
    assert relative_error(grad, ref_grad) < 1e-9
    assert_close_buffers(batchnorm_buffers(synced), batchnorm_buffers(plain), 1e-9)


def test_eval_mode_is_plain_batchnorm_and_does_not_communicate(utterances):
    from sparse_asr.data.dataset import collate

    comm = Communicator()
    plain, synced = models(comm)
    batch = collate(utterances)
    with torch.no_grad():
        expected, _ = plain.eval()(batch.features, batch.feature_lengths)
        got, _ = synced.eval()(batch.features, batch.feature_lengths)
    assert torch.equal(got, expected)
    assert COUNT_AS not in comm.per_op()


@pytest.mark.unit
def test_backward_is_the_gradient_of_the_masked_forward():
    """gradcheck in float64 on a (B, C, F, T) map with padded time steps (outputs there are 0)."""
    torch.manual_seed(0)
    comm = Communicator()
    x = torch.randn(3, 2, 4, 5, dtype=torch.float64, requires_grad=True)
    mask = (torch.arange(5)[None, :] < torch.tensor([5, 3, 2])[:, None])[:, None, None, :].double()
    weight = (torch.rand(2, dtype=torch.float64) + 0.5).requires_grad_()
    bias = torch.randn(2, dtype=torch.float64, requires_grad=True)
    running_mean, running_var = torch.zeros(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64)

    def norm(x, weight, bias):
        return SyncBatchNormFunction.apply(x, mask, weight, bias, running_mean, running_var, 1e-5, 0.1, comm)

    assert torch.autograd.gradcheck(norm, (x, weight, bias))
    frames = x[:, :, 0, 0].detach().clone().requires_grad_()  # (N, C) frames, no mask
    assert torch.autograd.gradcheck(lambda f, w, b: SyncBatchNormFunction.apply(
        f, None, w, b, running_mean, running_var, 1e-5, 0.1, comm), (frames, weight, bias))


@pytest.mark.unit
def test_one_value_per_channel_is_refused():
    norm = SyncBatchNorm(3, Communicator())
    with pytest.raises(ValueError, match="more than one value per channel"):
        norm(torch.randn(1, 3))
    with pytest.raises(ValueError, match=r"expects \(N, 3, \.\.\.\)"):
        norm(torch.randn(4, 5))


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 3, 4])
def test_ranks_compute_what_one_process_computes_on_the_global_batch(an4_manifests, tmp_path, nprocs):
    out = check_mpi(nprocs, ["-m", "tests.mpi.syncbn_check", str(an4_manifests), "12", str(tmp_path)])
    for dtype in ("torch.float64", "torch.float32"):
        assert f"P={nprocs} sync {dtype}: " in out and "identical on all ranks" in out, out
    assert f"P={nprocs} per-rank: " in out and f"{nprocs} different running statistics" in out, out
    assert f"P={nprocs} train.py with model.sync_batchnorm: running statistics identical" in out, out


@pytest.mark.mpi
def test_bn_shards_benchmark_shows_the_synchronized_gradient(an4_manifests):
    out = check_mpi(2, ["bench/bn_shards.py", "--model", MODEL, "--global-batch", "4", "--ranks", "1", "2",
                        "--manifest", str(an4_manifests / "an4_train.csv")])
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| 2 |")]
    assert len(rows) == 1, out
    _, per, per_rank_cosine, _, synced_cosine, synced_ratio = (cell.strip() for cell in rows[0])
    assert per == "2" and float(per_rank_cosine) < 0.999, out  # per-rank statistics bend the gradient
    assert float(synced_cosine) >= 0.9999 and abs(float(synced_ratio) - 1) <= 1e-4, out
