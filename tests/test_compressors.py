"""Every registered algorithm against the numpy references in tests/reference.py,
for P = 1..4: the update, the residual, mass conservation, exact volumes, non-finite input
(tests/mpi/compressor_check.py). Plus local checks of the helpers that need no MPI."""
import math

import numpy as np
import pytest
import torch

from sparse_asr.compression import COMPRESSORS, build_compressor
from sparse_asr.compression.gtopk import merge_topk, pack_bits, unpack_bits
from tests import reference as ref
from tests.mpi_helpers import check_mpi


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_compressors_match_reference(nprocs):
    out = check_mpi(nprocs, ["-m", "tests.mpi.compressor_check"], timeout=240)
    for name in COMPRESSORS:
        assert f"ok {name} " in out, out
    assert f"ok dense_1d oktopk P={nprocs}" in out and f"ok dense_1d topka P={nprocs}" in out, out
    for what in ("dgc topka", "dgc oktopk", "dgc density 1"):  # DGC's memory: its mirror and dense momentum SGD
        assert f"ok {what} P={nprocs}" in out, out


@pytest.mark.unit
def test_registry_names():
    assert {"dense", "topka", "topkdsa", "gtopk", "gaussiank"} <= set(COMPRESSORS)


@pytest.mark.unit
def test_bad_options_are_refused():
    from sparse_asr.comm import Communicator

    comm = Communicator()
    with pytest.raises(ValueError, match="compression.options.no_such_option"):
        build_compressor("topka", comm, 100, 0.1, no_such_option=1)
    with pytest.raises(ValueError, match="algorithm 'oktopk': compression.options.repartition_interval must be int"):
        build_compressor("oktopk", comm, 100, 0.1, repartition_interval=2.5)
    with pytest.raises(ValueError, match="candidate_factor needs complete_values"):
        build_compressor("oktopk", comm, 100, 0.1, candidate_factor=2.0)
    with pytest.raises(ValueError, match="dense_switch"):
        build_compressor("topkdsa", comm, 100, 0.1, dense_switch=0.0)
    with pytest.raises(ValueError, match="tolerance"):
        build_compressor("gaussiank", comm, 100, 0.1, tolerance=0.5)


@pytest.mark.unit
def test_bit_mask_round_trip():
    rng = np.random.default_rng(0)
    for m in (0, 1, 7, 8, 9, 1000):
        mask = torch.from_numpy(rng.random(m) < 0.3)
        packed = pack_bits(mask)
        assert packed.numel() == (m + 7) // 8
        assert torch.equal(unpack_bits(packed, m), mask)
        assert np.array_equal(packed.numpy(), np.packbits(mask.numpy(), bitorder="little"))


@pytest.mark.unit
def test_merge_topk_sums_duplicates_and_keeps_largest():
    a_idx, a_val = torch.tensor([1, 5, 9]), torch.tensor([3.0, -1.0, 0.5])
    b_idx, b_val = torch.tensor([5, 7, 9]), torch.tensor([-4.0, 2.0, 0.25])
    idx, val = merge_topk(a_idx, a_val, b_idx, b_val, 3)
    assert idx.tolist() == [1, 5, 7] and val.tolist() == [3.0, -5.0, 2.0]


@pytest.mark.parametrize("pairs", [0, 50, 3_000, 40_000])  # below and above numel / 4 = 2,500
@pytest.mark.unit
def test_sum_pairs_both_ways_give_the_same_bits(pairs):
    """The scatter-add path (many pairs) and the sorting path (few) give the distinct indices ascending and
    bitwise the same sums, which equal the float64 sums to float32 rounding."""
    from sparse_asr.compression.base import sum_pairs

    numel = 10_000
    rng = np.random.default_rng(pairs)
    indices = torch.from_numpy(rng.integers(0, numel, pairs).astype(np.int32))
    values = torch.from_numpy(rng.standard_normal(pairs).astype(np.float32))
    by_sort, by_scatter = sum_pairs(indices, values), sum_pairs(indices, values, numel=numel)
    assert torch.equal(by_sort[0], by_scatter[0]) and torch.equal(by_sort[1], by_scatter[1])
    expected = np.zeros(numel)
    np.add.at(expected, indices.numpy(), values.numpy().astype(np.float64))
    assert np.array_equal(by_sort[0].numpy(), np.unique(indices.numpy()))
    np.testing.assert_allclose(by_sort[1].numpy(), expected[np.unique(indices.numpy())], rtol=1e-5, atol=1e-5)


@pytest.mark.unit
def test_gaussian_quantile_matches_the_stdlib():
    from statistics import NormalDist

    for density in (0.5, 0.02, 0.001):
        z = ref.normal_two_sided_quantile(density)
        assert math.isclose(z, NormalDist().inv_cdf(1 - density / 2), rel_tol=1e-9)


@pytest.mark.unit
def test_a_memory_needs_a_selection_and_dgc_no_dense_steps():
    from sparse_asr.comm import Communicator
    from sparse_asr.compression import MomentumCorrection

    comm = Communicator()
    dgc = MomentumCorrection(100, torch.device("cpu"), 0.9)
    with pytest.raises(ValueError, match="compression.memory=dgc needs a selection .* not .powersgd."):
        build_compressor("powersgd", comm, 100, 0.1, memory=dgc)
    with pytest.raises(ValueError, match="compression.warmup_steps=3"):
        build_compressor("topka", comm, 100, 0.1, warmup=3, memory=dgc)
    with pytest.raises(ValueError, match="memory holds 100 entries, the gradient has 101"):
        build_compressor("topka", comm, 101, 0.1, memory=dgc)
    assert build_compressor("topka", comm, 100, 0.1, memory=dgc, density_warmup_epochs=2).carries_momentum


@pytest.mark.unit
def test_density_warmup_follows_dgc_schedule_and_sets_k_each_epoch():
    """DGC's warm-up (paper: 25%, 6.25%, 1.5625%, 0.4%, then 0.1%) and the compressor's k following it."""
    from sparse_asr.comm import Communicator
    from sparse_asr.compression import warmup_density

    assert ([round(warmup_density(0.001, 4, e), 5) for e in range(6)]
            == [0.25119, 0.0631, 0.01585, 0.00398, 0.001, 0.001])
    assert warmup_density(0.02, 0, 0) == 0.02
    for name in ("oktopk", "topka", "gaussiank"):
        comp = build_compressor(name, Communicator(), 10_000, 0.001, density_warmup_epochs=4, warmup=2)
        for epoch, k in enumerate([2512, 631, 158, 40, 10, 10]):
            comp.start_epoch(epoch)
            assert comp.inner.inner.k == k, (name, epoch, comp.inner.inner.k)
        if name == "oktopk":
            assert comp.inner.inner.k_local == comp.inner.inner.k_global == 10
