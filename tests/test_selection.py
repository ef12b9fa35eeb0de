"""Selection helpers: exact thresholds equal torch.topk's k-th value on both device paths (the CUDA
path run on CPU tensors), threshold scans agree with torch, intersections ignore order."""
import numpy as np
import pytest
import torch

from sparse_asr.compression.selection import (
    SCAN_CHUNK,
    intersect_unique,
    intersect_unique_torch,
    kth_largest_magnitude,
    kth_largest_magnitude_radix,
    sample_positions,
    select_by_sample,
    select_by_topk,
    threshold_indices,
    threshold_indices_torch,
    threshold_select,
    topk_indices,
    topk_threshold_select,
)

pytestmark = pytest.mark.unit


def heavy_tailed(n, seed):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(n, generator=g) / torch.rand(n, generator=g).clamp(min=1e-3) ** 0.4  # Student-like tail
    return t * torch.exp(torch.randn(n, generator=g))


CASES = [
    ("normal", lambda: torch.randn(10_000, generator=torch.Generator().manual_seed(1)), [1, 7, 100, 9_999, 10_000]),
    ("heavy", lambda: heavy_tailed(200_000, 2), [1, 2_000, 4_000, 50_000]),
    ("ties", lambda: torch.randint(-5, 6, (5_000,), generator=torch.Generator().manual_seed(3)).float(),
     [1, 10, 600, 2_500, 4_999]),
    ("mostly_zero",
     lambda: torch.cat([torch.zeros(9_000), torch.randn(1_000, generator=torch.Generator().manual_seed(4))]),
     [10, 999, 1_000, 1_001, 5_000]),
    ("all_zero", lambda: torch.zeros(300), [1, 300]),
    ("tiny", lambda: torch.tensor([0.5, -2.0, 1e-30, -0.0, 3.0]), [1, 2, 3, 4, 5]),
]


@pytest.mark.parametrize("name,make,ks", CASES, ids=[c[0] for c in CASES])
def test_exact_threshold_equals_topk(name, make, ks):
    x = make()
    for k in ks:
        ref = torch.topk(x.abs(), k).values[-1].item()
        assert kth_largest_magnitude(x, k) == ref, (name, k)
        assert kth_largest_magnitude_radix(x, k) == ref, (name, k)
        idx, t = topk_threshold_select(x, k)
        assert t == ref
        assert torch.equal(idx, torch.nonzero(x.abs() >= ref).flatten()), "selection must be every |x| >= t, sorted"
        assert idx.numel() >= k
        # Both device paths (CUDA's torch.topk, CPU's sample and refine) give the same answer.
        for method in (select_by_topk, select_by_sample):
            m_idx, m_t = method(x, k)
            assert m_t == ref and torch.equal(m_idx, idx), (method.__name__, name, k)


def test_unlucky_sample_still_exact():
    """Put the large values exactly where the sample looks: the first estimate is far too high,
    too few candidates pass, and the retry must still give the exact answer."""
    n, k, s = 100_000, 5_000, 1_000
    x = torch.rand(n, generator=torch.Generator().manual_seed(5))
    x[sample_positions(n, s, "cpu")] += 10.0
    idx, t = topk_threshold_select(x, k, sample_size=s)
    assert t == torch.topk(x, k).values[-1].item() and idx.numel() == k


def test_radix_union_smaller_than_k_is_zero():
    x = torch.randn(50, generator=torch.Generator().manual_seed(6))
    assert kth_largest_magnitude_radix(x, 51) == 0.0
    assert kth_largest_magnitude_radix(x, 50) == x.abs().min().item()


def test_radix_with_summed_histograms_int32():
    """`sum_counts` sees each round's histogram: doubling every count is the union of two
    identical ranks, whose 2k-th largest is the k-th largest of one."""
    x = heavy_tailed(20_000, 7)
    seen = []

    def twice(h):
        seen.append(h.dtype)
        return 2 * h

    for k in (1, 300, 7_000):
        assert kth_largest_magnitude_radix(x, 2 * k, twice, torch.int32) == torch.topk(x.abs(), k).values[-1].item()
    assert set(seen) == {torch.int32} and len(seen) == 12  # 4 rounds per call


def test_sample_positions_spread():
    pos = sample_positions(1_000_003, 65_536, "cpu")
    assert pos.min() >= 0 and pos.max() < 1_000_003
    assert pos.unique().numel() == 65_536
    counts = torch.bincount(pos * 64 // 1_000_003, minlength=64)  # even coverage of the index space
    assert counts.min() >= 1000 and counts.max() <= 1050


def test_intersect_any_order():
    g = torch.Generator().manual_seed(8)
    x = torch.randn(5_000, generator=g)
    a = torch.topk(x.abs(), 300, sorted=False).indices  # topk order: not sorted by index
    b = torch.randperm(5_000, generator=g)[:2_000]
    assert not torch.equal(a, a.sort().values) and not torch.equal(b, b.sort().values)
    expected = torch.tensor(sorted(set(a.tolist()) & set(b.tolist())))
    for intersect in (intersect_unique, intersect_unique_torch):  # CPU and device paths
        assert torch.equal(intersect(a, b), expected)
        assert torch.equal(intersect(a.sort().values, b.int().sort().values), expected)  # mixed dtypes
        assert intersect(a, b[:0]).numel() == 0 and intersect(a[:0], b).numel() == 0


@pytest.mark.parametrize("n", [0, 1, SCAN_CHUNK - 1, SCAN_CHUNK, 3 * SCAN_CHUNK + 5])
def test_threshold_scan_matches_torch(n):
    """The chunked numpy scan (CPU) and the torch scan (other devices) select the same entries, in
    order, also at thresholds between two float32 values and at chunk borders."""
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g) * torch.exp(2 * torch.randn(n, generator=g))
    x[::11] = 0.0
    if n:
        x[n // 2] = float(np.nextafter(np.float32(1.5), np.float32(2)))
    for t in (0.0, 1e-40, 0.3, 1.5, (1.5 + float(np.nextafter(np.float32(1.5), np.float32(2)))) / 2, 1e9):
        expected = threshold_indices_torch(x, t)
        assert torch.equal(threshold_indices(x, t), expected), t
        idx, vals = threshold_select(x, t)
        assert idx.dtype == torch.int64 and torch.equal(idx, expected) and torch.equal(vals, x[expected]), t
    assert torch.equal(threshold_indices(x.double(), 0.3), threshold_indices_torch(x.double(), 0.3))


def test_radix_centred_on_a_guess():
    """A first round centred on a guess (the reused threshold) finds the same value: in 2 rounds of
    4096 bins when the guess is within a factor 2, one or two more when it is not."""
    x = heavy_tailed(100_000, 9)
    for k in (1, 2_000, 60_000):
        ref = torch.topk(x.abs(), k).values[-1].item()
        for guess, rounds in ((ref, 2), (ref * 1.9, 2), (ref / 1.9, 2), (ref * 10, 4), (ref / 10, 4), (1e-38, 4)):
            seen = []
            t = kth_largest_magnitude_radix(x, k, lambda h: seen.append(h.numel()) or h, near=guess, max_bins=4096)
            assert t == ref and len(seen) <= rounds, (k, guess, len(seen))
    assert kth_largest_magnitude_radix(x, 100_001, near=1.0, max_bins=4096) == 0.0
    with pytest.raises(ValueError, match="power of two"):
        kth_largest_magnitude_radix(x, 5, max_bins=1000)


def test_existing_helpers_unchanged():
    x = torch.tensor([0.1, -3.0, 2.0, 0.0, -0.5])
    assert topk_indices(x, 2).tolist() == [1, 2]
    assert threshold_indices(x, 0.5).tolist() == [1, 2, 4]


@pytest.mark.parametrize("k", [1, 37, 2_000, 99_999, 100_000, 100_001])
def test_topk_indices_is_torch_topks_set_ascending(k):
    """The baselines' local top-k (TopkA, TopkDSA, gTopk, CLT-k) by sample and refine on the CPU: the
    same set as torch.topk, ascending, exactly min(k, n) entries."""
    x = heavy_tailed(100_000, 3)
    got = topk_indices(x, k)
    expected = torch.topk(x.abs(), min(k, x.numel())).indices.sort().values
    assert got.dtype == torch.int64 and torch.equal(got, expected)


def test_topk_indices_ties_keep_the_lowest_indices():
    x = torch.tensor([1.0, -2.0, 1.0, 0.5, -1.0, 1.0])
    assert topk_indices(x, 3).tolist() == [0, 1, 2]  # 2.0, then the first two of the four 1.0s
    assert topk_indices(x, 5).tolist() == [0, 1, 2, 4, 5]
    assert topk_indices(torch.zeros(10), 4).tolist() == [0, 1, 2, 3]
    assert topk_indices(x, 0).numel() == 0
