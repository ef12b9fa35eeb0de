"""compression/kernels.py against its torch references, bit for bit: the fused accumulate + zero + scan, the
scans into records, the linear merges and intersection, scatter and clearing; every sparse algorithm's steps
with the kernels and without; the package without numba. Without numba the kernels run here as plain Python
(the same loops), so these tests check the loops either way."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from sparse_asr.comm import Communicator
from sparse_asr.compression import base, build_compressor, kernels, selection
from sparse_asr.compression.oktopk import sum_sorted_runs

REPO = Path(__file__).resolve().parent.parent
SIZES = (0, 1, 63, 64, 65, 1000, 4099)  # empty, one, around the 64-entry block, and no multiple of anything


@pytest.fixture
def torch_path(monkeypatch):
    """Everything through the torch reference (what runs without numba, or on a GPU)."""
    monkeypatch.setattr(kernels, "ENABLED", False)


def vectors(n: int, seed: int, ties: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(residual, grad) with heavy tails; with `ties`, some of residual + grad land exactly on +-ties."""
    rng = np.random.default_rng(seed)
    residual = rng.standard_t(3, n).astype(np.float32)
    grad = rng.standard_t(3, n).astype(np.float32)
    if ties is not None and n:
        at = rng.choice(n, size=max(1, n // 10), replace=False)
        residual[at] = np.float32(ties) * np.where(rng.random(at.size) < 0.5, -1, 1).astype(np.float32)
        grad[at] = 0.0
    return torch.from_numpy(residual), torch.from_numpy(grad)


def thresholds(acc: torch.Tensor) -> list[float]:
    """Ties (a value present in |acc|), none selected, all selected, 0.1 (not a float32), a typical one."""
    top = float(acc.abs().max()) if acc.numel() else 1.0
    return [1.5, top + 1.0, 0.0, 0.1, float(np.float32(top) * np.float32(0.5)), top, float("inf")]


@pytest.mark.unit
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("capacity", [0, 4096])  # 0: every selection overflows the buffer first
def test_accumulate_select_is_add_zero_and_torch_scan(n, capacity):
    residual0, grad0 = vectors(n, seed=n, ties=1.5)
    acc = residual0 + grad0
    for t in thresholds(acc):
        residual, grad, out = residual0.clone(), grad0.clone(), kernels.PairBuffer(capacity)
        count = kernels.accumulate_select(residual, grad, t, out)
        idx, vals = out.columns(count)
        expected = selection.threshold_indices_torch(acc, t)
        assert torch.equal(idx.long(), expected), t
        assert torch.equal(vals, acc[expected]), t
        assert torch.equal(residual, acc) and not grad.any(), t


@pytest.mark.unit
@pytest.mark.parametrize("n", SIZES)
def test_select_and_threshold_select_match_torch(n):
    x, _ = vectors(n, seed=n + 1, ties=1.5)
    for t in thresholds(x):
        out = kernels.PairBuffer(3)
        idx, vals = out.columns(kernels.select(x, t, out))
        expected = selection.threshold_indices_torch(x, t)
        assert torch.equal(idx.long(), expected) and torch.equal(vals, x[expected]), t
        got_idx, got_vals = selection.threshold_select(x, t)  # through the kernel
        assert got_idx.dtype == torch.int64 and torch.equal(got_idx, expected) and torch.equal(got_vals, x[expected])
        assert selection.count_at_least(x, t) == int((x.abs() >= t).sum()), t


@pytest.mark.unit
@pytest.mark.parametrize("n", SIZES)
def test_select_pairs_and_deviation_match_torch(n):
    values, _ = vectors(n, seed=n + 2, ties=1.5)
    indices = torch.from_numpy(np.sort(np.random.default_rng(n).choice(10 * n + 1, n, replace=False))).int()
    mean = torch.std_mean(values, correction=0)[1] if n else torch.tensor(0.0)
    for t in thresholds(values):
        out = kernels.PairBuffer()
        idx, vals = out.columns(kernels.select_pairs(indices, values, t, out))
        keep = selection.threshold_indices_torch(values, t)
        assert torch.equal(idx, indices[keep]) and torch.equal(vals, values[keep]), t
        deviation = (values - mean).abs()
        assert kernels.count_deviation(values, mean, t) == int((deviation >= t).sum()), t
        assert torch.equal(kernels.select_deviation(values, mean, t), torch.nonzero(deviation >= t).flatten()), t
    if n:  # in place: the records read are the records written
        out = kernels.PairBuffer()
        idx, vals = out.columns(kernels.select(values, 0.0, out))
        keep = selection.threshold_indices_torch(values, 1.0)
        idx2, vals2 = out.columns(kernels.select_pairs(idx, vals, 1.0, out))
        assert torch.equal(idx2.long(), keep) and torch.equal(vals2, values[keep])


def sorted_runs(lengths: list[int], span: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Runs of distinct sorted indices in [0, span) (overlapping across runs) with random values."""
    rng = np.random.default_rng(seed)
    return [(torch.from_numpy(np.sort(rng.choice(span, m, replace=False)).astype(np.int32)),
             torch.from_numpy(rng.standard_normal(m).astype(np.float32))) for m in lengths]


@pytest.mark.unit
@pytest.mark.parametrize("lengths", [[0], [5], [0, 0, 0], [40, 0, 37], [300, 280, 310, 290], [1, 500], [64, 64]])
def test_merge_runs_equals_the_sort_based_merge(lengths, torch_path):
    runs = sorted_runs(lengths, span=max(1, 2 * max(lengths)), seed=len(lengths) + sum(lengths))
    idx, vals = torch.cat([i for i, _ in runs]), torch.cat([v for _, v in runs])
    expected = sum_sorted_runs(idx, vals)
    unique, sums = base.sum_pairs(idx, vals)  # the torch path (torch_path): unique + index_add
    rest_idx = torch.cat([i for i, _ in runs[1:]] + [idx[:0]])
    rest_vals = torch.cat([v for _, v in runs[1:]] + [vals[:0]])
    for compact in (False, True):
        out = (torch.empty(idx.numel(), dtype=torch.int32), torch.empty(idx.numel()))
        written = kernels.merge_runs(runs[0], (rest_idx, rest_vals), lengths[1:], out, compact)
        got = (out[0][:written], out[1][:written])
        want = (unique, sums) if compact else expected
        assert torch.equal(got[0].long(), want[0].long()) and torch.equal(got[1], want[1]), compact
    merged = kernels.sum_runs(idx, vals)  # the runs found by the kernel
    assert torch.equal(merged[0], unique) and torch.equal(merged[1], sums)


@pytest.mark.unit
def test_sum_runs_gives_up_on_many_runs_and_sum_pairs_still_agrees():
    rng = np.random.default_rng(7)
    idx = torch.from_numpy(rng.integers(0, 50, 400).astype(np.int32))  # ~200 runs
    vals = torch.from_numpy(rng.standard_normal(400).astype(np.float32))
    assert kernels.sum_runs(idx, vals) is None
    ordered = torch.sort(idx.long(), stable=True)
    by_runs = kernels.sum_runs(ordered.values, vals[ordered.indices])
    by_sort = base.sum_pairs(ordered.values, vals[ordered.indices], numel=50)
    assert torch.equal(by_runs[0], by_sort[0]) and torch.equal(by_runs[1], by_sort[1])


@pytest.mark.unit
def test_intersect_sorted_matches_torch_and_refuses_unsorted_input():
    rng = np.random.default_rng(3)
    for m_a, m_b in [(0, 5), (5, 0), (1, 1), (300, 200), (1000, 1000)]:
        a = torch.from_numpy(np.sort(rng.choice(2000, m_a, replace=False)).astype(np.int32))
        b = torch.from_numpy(np.sort(rng.choice(2000, m_b, replace=False)))
        assert torch.equal(kernels.intersect_sorted(a, b), selection.intersect_unique_torch(a, b))
        assert torch.equal(selection.intersect_unique(a, b), selection.intersect_unique_torch(a, b))
    a = torch.tensor([5, 1, 9], dtype=torch.int32)
    assert kernels.intersect_sorted(a, torch.tensor([1, 9])) is None
    assert selection.intersect_unique(a, torch.tensor([1, 9])).tolist() == [1, 9]  # the sort takes over
    assert kernels.intersect_sorted(torch.tensor([1, 1, 2], dtype=torch.int32), torch.tensor([1, 2])) is None
    assert kernels.intersect_sorted(torch.tensor([1, 2], dtype=torch.int32), torch.tensor([0, 1, 2, 7, 3])) is None


@pytest.mark.unit
def test_scatter_scaled_and_clear_match_torch():
    rng = np.random.default_rng(5)
    idx = torch.from_numpy(np.sort(rng.choice(1000, 300, replace=False)).astype(np.int32))
    vals = torch.from_numpy(rng.standard_normal(300).astype(np.float32))
    for P in (1, 3, 7):
        got, want = torch.zeros(1000), torch.zeros(1000)
        kernels.scatter_scaled(got, idx, vals, P)
        want[idx.long()] = vals / P
        assert torch.equal(got, want)
    x, y = torch.randn(1000), None
    y = x.clone()
    kernels.clear(x, idx)
    y[idx.long()] = 0.0
    assert torch.equal(x, y)


@pytest.mark.unit
def test_records_are_packed_in_place():
    out = kernels.PairBuffer()
    x = torch.randn(5000)
    idx, vals = out.columns(kernels.select(x, 1.0, out))
    packed = base.pack_pairs(idx, vals)
    assert packed.data_ptr() == out.raw.data_ptr()  # no copy
    assert torch.equal(packed, base.pack_pairs(idx.contiguous(), vals.contiguous()))  # the same bytes
    back = base.unpack_pairs(packed, torch.int32)
    assert torch.equal(back[0], idx) and torch.equal(back[1], vals)
    assert kernels.records_of(idx[1:], vals[:-1]) is None  # not one record's two columns


def steps(name: str, n: int = 3001, count: int = 8, **options):
    comp = build_compressor(name, Communicator(), n, 0.02, **options)
    rng = np.random.default_rng(11)
    out = []
    for _ in range(count):
        flat = torch.from_numpy(rng.standard_t(3, n).astype(np.float32))
        comp.step(flat)
        out.append((flat, comp.residual.clone(), getattr(comp.memory, "applied_count", None)))
    return out


@pytest.mark.parametrize("name, options", [("oktopk", {"local_threshold_interval": 3}), ("oktopk", {}),
                                           ("oktopk", {"complete_values": True, "candidate_factor": 2}),
                                           ("topka", {}), ("topkdsa", {}), ("gtopk", {}), ("gaussiank", {}),
                                           ("cltk", {})])
@pytest.mark.unit
def test_steps_are_the_same_bits_with_and_without_kernels(name, options, monkeypatch):
    fused = steps(name, **options)
    monkeypatch.setattr(kernels, "ENABLED", False)
    reference = steps(name, **options)
    for (flat, residual, applied), (flat_ref, residual_ref, applied_ref) in zip(fused, reference):
        assert torch.equal(flat, flat_ref) and torch.equal(residual, residual_ref) and applied == applied_ref


@pytest.mark.tooling
def test_the_package_runs_without_numba():
    """A GPU image has no numba: everything imports and runs the torch path, with the same results."""
    code = ("import sys; sys.modules['numba'] = None\n"
            "from sparse_asr.compression import kernels\n"
            "assert kernels.numba is None and not kernels.ENABLED\n"
            "from tests.test_kernels import steps\n"
            "import torch; print(sum(float(f.double().abs().sum() + r.double().abs().sum()) for f, r, _ in "
            "steps('oktopk')))\n")
    without = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert without.returncode == 0, without.stderr
    with_numba = sum(float(f.double().abs().sum() + r.double().abs().sum()) for f, r, _ in steps("oktopk"))
    assert float(without.stdout) == with_numba
