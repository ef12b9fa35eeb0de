"""Selection helpers: exact thresholds equal torch.topk's k-th value, intersections ignore order."""
import pytest
import torch

from sparse_asr.compression.selection import (
    isin_sorted,
    kth_largest_magnitude,
    kth_largest_magnitude_radix,
    sample_positions,
    threshold_indices,
    topk_indices,
    topk_threshold_select,
)


def heavy_tailed(n, seed):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(n, generator=g) / torch.rand(n, generator=g).clamp(min=1e-3) ** 0.4  # Student-like tail
    return t * torch.exp(torch.randn(n, generator=g))


CASES = [
    ("normal", lambda: torch.randn(10_000, generator=torch.Generator().manual_seed(1)), [1, 7, 100, 9_999, 10_000]),
    ("heavy", lambda: heavy_tailed(200_000, 2), [1, 2_000, 4_000, 50_000]),
    ("ties", lambda: torch.randint(-5, 6, (5_000,), generator=torch.Generator().manual_seed(3)).float(), [1, 10, 600, 2_500, 4_999]),
    ("mostly_zero", lambda: torch.cat([torch.zeros(9_000), torch.randn(1_000, generator=torch.Generator().manual_seed(4))]), [10, 999, 1_000, 1_001, 5_000]),
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


def test_isin_sorted_any_order():
    g = torch.Generator().manual_seed(8)
    x = torch.randn(5_000, generator=g)
    a = topk_indices(x, 300)  # topk order: not sorted by index
    b = torch.randperm(5_000, generator=g)[:2_000]
    assert not torch.equal(a, a.sort().values) and not torch.equal(b, b.sort().values)
    expected = torch.tensor([int(i) in set(b.tolist()) for i in a])
    assert torch.equal(isin_sorted(a, b), expected)
    assert torch.equal(isin_sorted(a.int(), b.int()), expected)
    assert isin_sorted(a, b[:0]).sum() == 0 and isin_sorted(a[:0], b).numel() == 0


def test_existing_helpers_unchanged():
    x = torch.tensor([0.1, -3.0, 2.0, 0.0, -0.5])
    assert sorted(topk_indices(x, 2).tolist()) == [1, 2]
    assert threshold_indices(x, 0.5).tolist() == [1, 2, 4]
