"""sparse_asr/compression/synthetic.py: the benches' seeded gradients are what their docstring says, the same for
the same (seed, rank, step) from a fresh source, and different ranks share the persistent component."""
import numpy as np
import pytest
import torch

from sparse_asr.compression.synthetic import LAYERS, GradientSource

pytestmark = pytest.mark.unit


def test_layers_tile_the_vector_with_scales_over_three_decades():
    source = GradientSource(10_000, rank=0)
    assert len(source.layer_sizes) == LAYERS and sum(source.layer_sizes) == 10_000
    scales = torch.unique(source.scale).numpy()
    assert len(scales) <= LAYERS and 1e-3 <= scales.min() and scales.max() <= 1.0
    assert source.gradient(0).dtype == torch.float32 and source.gradient(0).shape == (10_000,)


def test_seeded_per_rank_and_step():
    a, again, other = GradientSource(5_000, 1, seed=3), GradientSource(5_000, 1, seed=3), GradientSource(5_000, 2, 3)
    assert torch.equal(a.gradient(7), again.gradient(7))  # a fresh object: the same draw
    assert not torch.equal(a.gradient(7), a.gradient(8))  # a new step: the noise rolled
    assert not torch.equal(a.gradient(7), other.gradient(7))  # another rank: its own noise
    # g = scale * (shared + rolled noise): two ranks differ by their noise only, shared part and scales alike
    assert torch.equal(a.scale, other.scale) and torch.equal(a.shared, other.shared)
    rolled = np.roll(a.noise.numpy(), int(np.random.default_rng([3, 1, 7]).integers(5_000)))
    np.testing.assert_allclose(a.gradient(7).numpy(), (rolled + a.shared.numpy()) * a.scale.numpy(), rtol=1e-6)
