"""PowerSGD: against PyTorch's powerSGD_hook under real MPI ranks and its properties (tests/mpi/powersgd_check.py),
plus local checks of its pieces: orthogonalisation, the compression plan and closed form at lstman4's
shapes, options and config."""
import pytest
import torch
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _orthogonalize

from sparse_asr.comm import Communicator
from sparse_asr.compression import COMPRESSORS, DenseWarmup, build_compressor
from sparse_asr.compression.dense import DenseAllreduce
from sparse_asr.compression.powersgd import PowerSGD, orthogonalize_, plan
from sparse_asr.models import build_model
from sparse_asr.training.config import ConfigError, load_config
from tests.mpi_helpers import check_mpi

LSTMAN4_SHAPES = [p.shape for p in build_model("lstman4").parameters()]


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_matches_pytorch_hook_and_keeps_its_properties(nprocs):
    out = check_mpi(nprocs, ["-m", "tests.mpi.powersgd_check"], timeout=240)
    assert out.count("ok hook ") == 4 and f"ok properties and resume P={nprocs}" in out, out


@pytest.mark.parametrize("rank", [1, 2, 4])
@pytest.mark.parametrize("epsilon", [0.0, 1e-3])
@pytest.mark.unit
def test_orthogonalize_is_pytorchs(rank, epsilon):
    batch = torch.randn(3, 50, rank, generator=torch.Generator().manual_seed(rank))
    theirs = batch.clone()
    _orthogonalize(theirs, epsilon)
    orthogonalize_(batch, epsilon)
    assert torch.equal(batch, theirs)


@pytest.mark.unit
def test_a_zero_column_stays_zero_where_pytorch_makes_nan():
    batch = torch.randn(1, 20, 2)
    batch[0, :, 0] = 0.0
    theirs = batch.clone()
    _orthogonalize(theirs)
    orthogonalize_(batch)
    assert theirs[0, :, 0].isnan().all()
    assert not batch[0, :, 0].any() and torch.allclose(batch[0, :, 1].norm(), torch.tensor(1.0))


@pytest.mark.unit
def test_plan_and_closed_form_at_lstman4_size():
    # lstman4 viewed as the hook views it, rank 1: conv (32, 451) + (32, 7392), LSTM (3200, 1312) + nine
    # (3200, 800), lookahead (800, 21), classifier (29, 800) are compressed, r (rows + cols) entries each:
    # 483 + 7424 + 4512 + 9 * 4000 + 821 + 829 = 50,069; the 26 vectors (conv biases and BatchNorms 6 x 32,
    # 8 x 800 sequence norms, 10 x 3200 LSTM biases, 2 x 800 output norm) = 40,192 entries, uncompressed.
    assert sum(s.numel() for s in LSTMAN4_SHAPES) == 27_569_568
    for rank in (1, 2, 4):
        layout = plan(LSTMAN4_SHAPES, rank, 2.0)
        assert len(layout.matrices) == 14 and layout.uncompressed_words == 40_192
        assert layout.p_words + layout.q_words == rank * 50_069
        for P in (2, 4):
            cost = PowerSGD.cost(27_569_568, 0, P, shapes=LSTMAN4_SHAPES,
                                 options=PowerSGD.Options(matrix_approximation_rank=rank))
            assert cost.low == cost.high == cost.typical == 2 * (rank * 50_069 + 40_192) * (P - 1) / P
            assert cost.messages == 3 * 2 * (P - 1)
    # The hook's order: equal (rows, cols) together, first seen first.
    assert [(m.rows, m.cols) for m in plan(LSTMAN4_SHAPES, 1, 2.0).matrices][2:4] == [(3200, 1312), (3200, 800)]
    # Without shapes the gradient is one vector, sent whole: dense's volume.
    ours, dense = PowerSGD.cost(1000, 10, 4), DenseAllreduce.cost(1000, 10, 4)
    assert (ours.low, ours.high, ours.typical, ours.messages) == (dense.low, dense.high, dense.typical, dense.messages)


@pytest.mark.unit
def test_min_compression_rate_decides_as_pytorch():
    # (800, 21) at rank 4: 4 * 821 = 3284 entries against 16,800, a rate of 5.1.
    shapes = [torch.Size([800, 1, 21])]
    assert len(plan(shapes, 4, 5.0).matrices) == 1 and len(plan(shapes, 4, 5.2).matrices) == 0
    assert len(plan([torch.Size([800])], 1, 2.0).matrices) == 0  # (800, 1): nothing to save
    assert len(plan([torch.Size([800])], 1, 0.5).matrices) == 1  # unless asked (the hook does the same)


@pytest.mark.unit
def test_registered_and_wrapped_by_the_dense_warmup():
    comm = Communicator()
    assert COMPRESSORS["powersgd"] is PowerSGD
    compressor = build_compressor("powersgd", comm, 27_569_568, shapes=LSTMAN4_SHAPES, warmup=3)
    assert isinstance(compressor, DenseWarmup) and isinstance(compressor.inner, PowerSGD)
    assert "14 of 40 tensors low-rank, 90,261 of 27,569,568 entries" in compressor.describe()


@pytest.mark.unit
def test_bad_options_and_state_are_refused():
    comm = Communicator()
    shapes = [torch.Size([30, 20]), torch.Size([30])]
    for options, match in [({"matrix_approximation_rank": 0}, "matrix_approximation_rank must be >= 1"),
                           ({"matrix_approximation_rank": 1.5},
                            "algorithm 'powersgd': compression.options.matrix_approximation_rank must be int"),
                           ({"random_seed": -1}, "random_seed"), ({"min_compression_rate": -1}, "min_compression_rate"),
                           ({"orthogonalization_epsilon": -1e-8}, "orthogonalization_epsilon"),
                           ({"warm_start": 1}, "algorithm 'powersgd': compression.options.warm_start must be bool"),
                           ({"rank": 2}, "compression.options.rank")]:
        with pytest.raises(ValueError, match=match):
            build_compressor("powersgd", comm, 630, shapes=shapes, **options)
    with pytest.raises(ValueError, match="shapes hold 630 entries, the gradient has 631"):
        build_compressor("powersgd", comm, 631, shapes=shapes)
    rank2 = build_compressor("powersgd", comm, 630, shapes=shapes, matrix_approximation_rank=2)
    with pytest.raises(ValueError, match="q_memory has 40 entries, this model and rank need 20"):
        build_compressor("powersgd", comm, 630, shapes=shapes).load_state_dict(rank2.state_dict())


@pytest.mark.unit
def test_config_selects_it_with_its_options():
    cfg = load_config("configs/smoke.yaml", ["compression.algorithm=powersgd",
                                             "compression.options.matrix_approximation_rank=2",
                                             "compression.options.torch_compatible=true"])
    assert cfg.compression.options == {"matrix_approximation_rank": 2, "torch_compatible": True}
    with pytest.raises(ConfigError, match=r"compression\.options\.matrix_aproximation_rank"):
        load_config("configs/smoke.yaml", ["compression.algorithm=powersgd",
                                           "compression.options.matrix_aproximation_rank=2"])
