"""The quantized exchanges (bf16, fp16, onebit, randomk, qsgd): bf16 and fp16 against PyTorch's DDP hooks under real
MPI ranks (tests/mpi/half_check.py), and local checks: QSGD unbiased within a bound derived from its range,
random-k's draws, the closed forms against the reference's volumes, exact resume, options. Their updates, memories,
conservation and bytes against the numpy references: tests/mpi/compressor_check.py (tests/test_compressors.py)."""
import io
import math

import numpy as np
import pytest
import torch

from sparse_asr.comm import Communicator
from sparse_asr.compression import COMPRESSORS, build_compressor
from sparse_asr.compression.onebit import compress, decode, encode
from sparse_asr.compression.qsgd import QSGDOptions
from sparse_asr.compression.randomk import draw_indices
from tests import reference as ref
from tests.mpi_helpers import check_mpi


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_half_precision_matches_pytorchs_hooks(nprocs):
    out = check_mpi(nprocs, ["-m", "tests.mpi.half_check"], timeout=240)
    assert f"ok hook bf16 P={nprocs}" in out and f"ok hook fp16 P={nprocs}" in out, out
    assert f"ok overflow P={nprocs}" in out, out


@pytest.mark.parametrize("levels", [1, 4])
@pytest.mark.unit
def test_qsgd_is_unbiased(levels):
    """The mean of T independent quantizations of one vector is the vector. Each decoded entry lies in an interval
    of width N / s (two adjacent levels), so by Hoeffding its mean over T draws is within
    t = (N / s) sqrt(ln(2 m / delta) / (2 T)) of its expectation for all m entries but with probability delta.
    A rounding that is not stochastic (to nearest, or down) is off by up to half a level, far beyond t."""
    m, T, delta, bucket = 64, 4000, 1e-9, 32
    v = torch.from_numpy(np.random.default_rng(levels).standard_normal(m).astype(np.float32))
    qsgd = build_compressor("qsgd", Communicator(), m, levels=levels, bucket_size=bucket, seed=3)
    total = torch.zeros(m, dtype=torch.float64)
    for _ in range(T):
        update = v.clone()
        qsgd.step(update)
        total += update.double()
    norms = np.repeat([np.linalg.norm(v.numpy()[i:i + bucket].astype(np.float64)) for i in range(0, m, bucket)], bucket)
    bound = norms / levels * math.sqrt(math.log(2 * m / delta) / (2 * T))
    gap = np.abs(total.numpy() / T - v.numpy())
    assert np.all(gap <= bound), (gap / bound).max()
    assert qsgd.steps == T


@pytest.mark.unit
def test_qsgd_variance_within_the_papers_bound():
    """E ||Q(v) - v||^2 <= min(d / s^2, sqrt(d) / s) ||v||^2 (QSGD, Lemma 3.1), per bucket of d entries: the
    empirical mean over T draws, with room for its own sampling error (a factor 1.5 at T = 400)."""
    d, s, T = 256, 4, 400
    v = torch.from_numpy(np.random.default_rng(0).standard_t(3, d).astype(np.float32))
    qsgd = build_compressor("qsgd", Communicator(), d, levels=s, bucket_size=d)
    errors = []
    for _ in range(T):
        update = v.clone()
        qsgd.step(update)
        errors.append(float(((update - v).double() ** 2).sum()))
    bound = min(d / s**2, math.sqrt(d) / s) * float((v.double() ** 2).sum())
    assert 0 < np.mean(errors) <= 1.5 * bound, (np.mean(errors), bound)


@pytest.mark.unit
def test_random_indices_are_shared_distinct_and_uniform():
    """k distinct indices, ascending, the same for the same (seed, step), others for another step or seed; every
    index drawn about k / n of the time (binomial counts over R draws, within 6 standard deviations)."""
    n, k, R = 200, 10, 3000
    a, b = draw_indices(n, k, 0, 5), draw_indices(n, k, 0, 5)
    assert torch.equal(a, b) and a.numel() == k and torch.equal(a, torch.unique(a))
    assert not torch.equal(a, draw_indices(n, k, 0, 6)) and not torch.equal(a, draw_indices(n, k, 1, 5))
    assert torch.equal(draw_indices(n, n, 0, 0), torch.arange(n))  # k = n: the permutation's draw, everything
    counts = np.zeros(n)
    for step in range(R):
        counts[draw_indices(n, k, 7, step).numpy()] += 1
    p = k / n
    assert np.all(np.abs(counts - R * p) <= 6 * math.sqrt(R * p * (1 - p))), counts


@pytest.mark.unit
def test_one_bit_sign_of_zero_is_plus_and_scale_is_the_mean_magnitude():
    x = torch.tensor([0.0, -0.0, -2.0, 3.0, -1.0])
    bits, scale = compress(x)
    assert bits.tolist() == [True, True, False, True, False] and scale.item() == pytest.approx(1.2)
    assert decode(encode(bits, scale), 5).tolist() == pytest.approx([1.2, 1.2, -1.2, 1.2, -1.2])
    assert encode(bits, scale).numel() == 1 + 4  # 5 bits in a byte, and the float32 scale
    empty_bits, empty_scale = compress(torch.zeros(0))
    assert empty_bits.numel() == 0 and empty_scale.item() == 0.0


@pytest.mark.parametrize("n", [1, 7, 2999, 27_569_568])
@pytest.mark.parametrize("P", [1, 2, 3, 4, 8])
@pytest.mark.unit
def test_closed_forms_are_the_references_volumes(n, P):
    """cost() in words received per rank: its low / high / typical are the min / max / mean of the reference's
    exact per-rank volumes (tests/reference.py), for chunks of uneven length, empty ones included (n < P)."""
    volumes = {
        "bf16": ref.owner_volumes(n, P, lambda length: 2 * length),
        "fp16": ref.owner_volumes(n, P, lambda length: 2 * length),
        "onebit": ref.owner_volumes(n, P, lambda length: (length + 7) // 8 + 4),
        "qsgd": [((P - 1) * (n + 4 * -(-n // 512)),) * 2] * P,
        "randomk": [(ref.ring_allreduce_bytes(min(n, 5), P),) * 2] * P,
    }
    for name, expected in volumes.items():
        cost = COMPRESSORS[name].cost(n, 5, P, None, COMPRESSORS[name].make_options({}))
        words = [recv / 4 for _, recv in expected]
        slack = 0.25 if name == "randomk" else 0.0  # the ring's 2k(P-1)/P, counted in whole bytes
        assert abs(cost.low - min(words)) <= slack and abs(cost.high - max(words)) <= slack, (name, cost, words)
        assert abs(cost.typical - sum(words) / P) <= slack, (name, cost, words)
        assert cost.messages == (P - 1) * (1 if name == "qsgd" else 2), name  # one allgather; two phases
    if n == 27_569_568 and P == 4:  # onebit: 2n(P-1)/P bits (chunks of whole bytes here) and 2(P-1) scales
        assert COMPRESSORS["onebit"].cost(n, 0, P).typical == 2 * n * (P - 1) / P / 32 + 2 * (P - 1)
    int16_levels = QSGDOptions(levels=300, bucket_size=100)
    assert COMPRESSORS["qsgd"].cost(1000, 0, 3, None, int16_levels).low == 2 * (2000 + 40) / 4


@pytest.mark.parametrize("name, options", [("onebit", {}), ("randomk", {"seed": 9}), ("qsgd", {"levels": 3})])
@pytest.mark.unit
def test_resume_continues_with_the_same_bits(name, options):
    """state_dict -> torch.save -> a new compressor -> load_state_dict at step 3 continues with the same bits."""
    n = 1000
    build = lambda: build_compressor(name, Communicator(), n, 0.05, **options)  # noqa: E731
    whole, parts = build(), build()
    for step in range(7):
        if step == 3:
            buffer = io.BytesIO()
            torch.save(parts.state_dict(), buffer)
            parts = build()
            buffer.seek(0)
            parts.load_state_dict(torch.load(buffer, weights_only=True))
        grad = torch.from_numpy(np.random.default_rng(step).standard_t(3, n).astype(np.float32))
        a, b = grad.clone(), grad.clone()
        whole.step(a)
        parts.step(b)
        assert torch.equal(a, b), f"{name} step {step}: resumed run differs"
    assert same_state(whole.state_dict(), parts.state_dict())  # errors, residual, step counts


def same_state(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_state(a[key], b[key]) for key in a)
    return torch.equal(a, b) if torch.is_tensor(a) else a == b


@pytest.mark.unit
def test_bad_options_and_state_are_refused():
    comm = Communicator()
    for name, options, match in [("qsgd", {"levels": 0}, "levels must be in"),
                                 ("qsgd", {"levels": 40000}, "levels must be in"),
                                 ("qsgd", {"bucket_size": 0}, "bucket_size must be >= 1"),
                                 ("randomk", {"seed": -1}, "seed must be in"),
                                 ("onebit", {"seed": 1}, "compression.options.seed"),
                                 ("bf16", {"levels": 2}, "compression.options.levels")]:
        with pytest.raises(ValueError, match=match):
            build_compressor(name, comm, 100, 0.1, **options)
    state = build_compressor("onebit", comm, 100).state_dict()
    with pytest.raises(ValueError, match="worker_error has 100 entries, this model and rank need 101"):
        build_compressor("onebit", comm, 101).load_state_dict(state)
