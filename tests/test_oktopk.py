"""Ok-Topk: exact against a numpy reference, invariants over 200 realistic steps, the original's
unsorted-intersection bug, the 6k(P-1)/P volume bound, exact resume, the count tracking k, the
rebalanced allgather and the complete_values option, on P = 1..4 real ranks (tests/mpi/oktopk_check.py),
plus single-process checks of the pieces."""
import math

import pytest
import torch

from sparse_asr.comm import Communicator
from sparse_asr.compression import build_compressor
from sparse_asr.compression.oktopk import (
    MIN_THRESHOLD,
    CountController,
    OkTopk,
    balanced_regions,
    stable_order,
    stable_order_torch,
    sum_sorted_runs,
)
from tests.mpi_helpers import check_mpi

CHECKS = ("exact", "unsorted", "resume", "volume", "default", "tracks", "rebalance", "complete")


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_oktopk_ranks(nprocs):
    out = check_mpi(nprocs, ["-m", "tests.mpi.oktopk_check", *CHECKS], timeout=300)
    for check in CHECKS:
        assert f"ok {check} P={nprocs}" in out, out


@pytest.mark.unit
def test_registry_and_options():
    comm = Communicator()
    comp = build_compressor("oktopk", comm, 1000, 0.05, local_threshold_interval=4, repartition_interval=8,
                            count_gain=1, rebalance=False)
    assert isinstance(comp, OkTopk) and comp.k == 50 and comp.local_threshold_interval == 4
    assert comp.options.count_gain == 1.0 and comp.options.rebalance is False
    assert OkTopk(comm, 1000, 0.05).options.rebalance is True
    with pytest.raises(ValueError, match="global_threshold_interval"):
        OkTopk(comm, 1000, 0.05, global_threshold_interval=0)
    with pytest.raises(ValueError, match="count_gain"):
        OkTopk(comm, 1000, 0.05, count_gain=1.5)
    with pytest.raises(ValueError, match="rebalance"):
        OkTopk(comm, 1000, 0.05, rebalance="yes")
    with pytest.raises(ValueError, match="threshold_interval_typo"):
        build_compressor("oktopk", comm, 1000, 0.05, threshold_interval_typo=3)


@pytest.mark.unit
def test_state_dict_rejects_other_world_size():
    comp = OkTopk(Communicator(), 1000, 0.05)
    state = comp.state_dict()
    state["boundaries"] = [0, 500, 1000]  # saved by 2 ranks, loaded by 1
    with pytest.raises(ValueError, match="boundaries"):
        comp.load_state_dict(state)


def controlled(control: CountController, k: int, ideal, elasticity: float, steps: int) -> list[float]:
    """count / k per step when a threshold t selects k * (ideal(step) / t)^elasticity entries."""
    ratios = []
    for step in range(steps):
        count = round(k * (ideal(step) / control.threshold) ** elasticity)
        ratios.append(count / k)
        control.update(count, k, elasticity)
    return ratios


@pytest.mark.parametrize("elasticity", [2.0, 5.0, 16.0])
@pytest.mark.unit
def test_controller_lands_on_k_and_follows_a_drift(elasticity):
    """Started 30% too low, it reaches k within a few steps without oscillating, for flat and steep
    tails alike, and then follows a threshold that rises 1% per step with no lasting offset."""
    k = 100_000
    control = CountController(count_gain=0.5, drift_gain=0.3, threshold=0.7)  # ideal: 1.0
    ratios = controlled(control, k, lambda s: 1.0, elasticity, 20)
    assert abs(math.log(ratios[10])) < 0.02 and abs(math.log(ratios[-1])) < 0.002
    errors = [math.log(r) for r in ratios]
    assert all(a * b >= 0 for a, b in zip(errors, errors[1:]) if abs(b) > 1e-3), f"oscillates: {ratios}"
    ratios = controlled(CountController(0.5, 0.3, threshold=1.0), k, lambda s: 1.01**s, elasticity, 40)
    assert max(abs(math.log(r)) for r in ratios[25:]) < 0.01, ratios


@pytest.mark.unit
def test_controller_step_limits_and_resets():
    control = CountController(count_gain=1.0, drift_gain=0.3, threshold=1.0)
    control.update(0, 1000, 2.0)  # nothing selected: at most a factor 2 per step
    assert control.threshold == 0.5
    control.update(10**9, 1000, 1.0)
    assert control.threshold == 1.0
    control.exact(3.0, guard=True)  # the guard recomputed it: the drift is forgotten
    assert (control.threshold, control.drift, control.ideal) == (3.0, 0.0, 0.0)
    floor = CountController(0.5, 0.3, threshold=MIN_THRESHOLD)
    floor.update(3, 1000, 2.0)  # fewer nonzeros than k at the floor: nothing to learn
    assert (floor.threshold, floor.drift) == (MIN_THRESHOLD, 0.0)


@pytest.mark.unit
def test_sum_sorted_runs():
    """Sorted, every repeated index summed into its first position and 0 elsewhere; the stable
    order comes from numpy's timsort on CPU and torch.sort elsewhere: the same permutation."""
    g = torch.Generator().manual_seed(4)
    runs = [torch.randperm(400, generator=g)[:150].sort().values.int() for _ in range(3)]
    indices = torch.cat(runs + [runs[0][:0]])
    values = torch.randn(indices.numel(), generator=g)
    assert torch.equal(stable_order(indices), stable_order_torch(indices))
    expected = {}
    for i, v in zip(indices.tolist(), values.tolist()):
        expected[i] = expected.get(i, 0.0) + v
    idx, vals = sum_sorted_runs(indices, values)
    assert torch.equal(idx, indices.sort().values)
    firsts = torch.ones_like(idx, dtype=torch.bool)
    firsts[1:] = idx[1:] != idx[:-1]
    assert (vals[~firsts] == 0).all()
    got = dict(zip(idx[firsts].tolist(), vals[firsts].tolist()))
    assert got.keys() == expected.keys() and all(got[i] == pytest.approx(expected[i], abs=1e-5) for i in got)
    empty = sum_sorted_runs(indices[:0], values[:0])
    assert empty[0].numel() == 0 and empty[1].numel() == 0


@pytest.mark.unit
def test_balanced_regions():
    hist = torch.tensor([0, 100, 0, 0, 300, 0, 0, 0], dtype=torch.int32)  # bins of 10 over [0, 80)
    bounds = balanced_regions(hist, 80, 4)
    assert bounds == [0, 20, 43, 47, 80]  # 100 per region (interpolated inside bin 4)
    assert balanced_regions(torch.zeros(8, dtype=torch.int32), 80, 3) == [0, 26, 53, 80]
    assert balanced_regions(hist, 80, 1) == [0, 80]


@pytest.mark.unit
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
