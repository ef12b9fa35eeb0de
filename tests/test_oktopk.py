"""Ok-Topk: exact against a numpy reference, invariants over 200 realistic steps, the original's
unsorted-intersection bug, the 6k(P-1)/P volume bound and exact resume, on P = 1..4 real ranks
(tests/mpi/oktopk_check.py), plus single-process checks of the pieces."""
import pytest
import torch

from sparse_asr.comm import Communicator
from sparse_asr.compression import build_compressor
from sparse_asr.compression.oktopk import MAX_NUDGE, NUDGE, OkTopk, balanced_regions, nudged
from tests.mpi_helpers import check_mpi


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_oktopk_ranks(nprocs):
    out = check_mpi(nprocs, ["-m", "tests.mpi.oktopk_check", "exact", "unsorted", "resume", "volume", "default"], timeout=240)
    for check in ("exact", "unsorted", "resume", "volume", "default"):
        assert f"ok {check} P={nprocs}" in out, out


def test_registry_and_options():
    comm = Communicator()
    comp = build_compressor("oktopk", comm, 1000, 0.05, local_threshold_interval=4, repartition_interval=8)
    assert isinstance(comp, OkTopk) and comp.k == 50 and comp.local_threshold_interval == 4
    with pytest.raises(ValueError, match="global_threshold_interval"):
        OkTopk(comm, 1000, 0.05, global_threshold_interval=0)
    with pytest.raises(ValueError, match="threshold_interval_typo"):
        build_compressor("oktopk", comm, 1000, 0.05, threshold_interval_typo=3)


def test_state_dict_rejects_other_world_size():
    comp = OkTopk(Communicator(), 1000, 0.05)
    state = comp.state_dict()
    state["boundaries"] = [0, 500, 1000]  # saved by 2 ranks, loaded by 1
    with pytest.raises(ValueError, match="boundaries"):
        comp.load_state_dict(state)


def test_nudge_grows_while_out_of_band_and_resets():
    k = 1000
    t, step = nudged(1.0, 0.0, 2000, k)
    assert step == NUDGE and t == pytest.approx(1 + NUDGE)
    sizes = []
    for _ in range(8):
        t, step = nudged(t, step, 1900, k)
        sizes.append(step)
    assert sizes[:4] == pytest.approx([2 * NUDGE, 4 * NUDGE, 8 * NUDGE, 16 * NUDGE]) and max(sizes) == MAX_NUDGE
    t2, step = nudged(t, step, 100, k)  # crossed over: small step down again
    assert step == -NUDGE and t2 == pytest.approx(t * (1 - NUDGE))
    assert nudged(t2, step, 1100, k) == (t2, 0.0)  # in band: keep


def test_balanced_regions():
    hist = torch.tensor([0, 100, 0, 0, 300, 0, 0, 0], dtype=torch.int32)  # bins of 10 over [0, 80)
    bounds = balanced_regions(hist, 80, 4)
    assert bounds == [0, 20, 43, 47, 80]  # 100 per region (interpolated inside bin 4)
    assert balanced_regions(torch.zeros(8, dtype=torch.int32), 80, 3) == [0, 26, 53, 80]
    assert balanced_regions(hist, 80, 1) == [0, 80]


def test_p1_zero_gradient_and_fewer_nonzeros_than_k():
    comp = OkTopk(Communicator(), 1000, 0.1)
    g = torch.zeros(1000)
    stats = comp.step(g)
    assert stats.selected_global == 0 and g.abs().sum() == 0 and comp.residual.abs().sum() == 0
    g = torch.zeros(1000)
    g[[3, 500, 999]] = torch.tensor([1.0, -2.0, 3.0])
    stats = comp.step(g.clone())  # k = 100 but only 3 nonzeros: exactly those move, no zeros sent
    assert stats.selected_local == 3 and stats.selected_global == 3
    assert comp.residual.abs().sum() == 0
