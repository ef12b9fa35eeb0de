"""Seeded synthetic gradients for the benches and checks that study the exchanges without running a model
(bench/comm_volume.py, bench/oktopk_pieces.py, tests/mpi/oktopk_check.py).

The flat vector is cut into 40 "layers" (seeded sizes) with log-uniform scales over three decades, as gradient
magnitudes differ between tensors. g(rank, step) = scale_layer * (0.5 * m + e(rank, step)) where m is a Laplace
component shared by all ranks and all steps (the persistent true gradient: consecutive steps and different ranks
select overlapping indices, as in training) and e is Student-t (3 degrees of freedom, heavy-tailed) noise, a fixed
per-rank draw (seeded by rank) rolled by a random offset every step (fresh noise without redrawing 27M numbers per
step)."""
import numpy as np
import torch

LAYERS = 40


class GradientSource:
    """Seeded synthetic gradients (see the module docstring). Shared parts use seed `seed`; the
    noise uses seed + 1 + rank; the per-step roll offsets depend on (seed, rank, step)."""

    def __init__(self, numel: int, rank: int, seed: int = 0):
        shared = np.random.default_rng(seed)
        weights = shared.lognormal(0.0, 1.0, LAYERS)
        bounds = np.concatenate([[0], np.round(np.cumsum(weights) / weights.sum() * numel)]).astype(np.int64)
        self.layer_sizes = np.diff(bounds).tolist()
        layer_scales = 10.0 ** shared.uniform(-3.0, 0.0, LAYERS)
        self.scale = torch.from_numpy(np.repeat(layer_scales, np.diff(bounds)).astype(np.float32))
        self.shared = torch.from_numpy((0.5 * shared.laplace(0.0, 1.0, numel)).astype(np.float32))
        self.noise = torch.from_numpy(np.random.default_rng(seed + 1 + rank).standard_t(3, numel).astype(np.float32))
        self.seed, self.rank, self.numel = seed, rank, numel

    def gradient(self, step: int) -> torch.Tensor:
        shift = int(np.random.default_rng([self.seed, self.rank, step]).integers(self.numel))
        g = torch.roll(self.noise, shift)
        g += self.shared
        g *= self.scale
        return g
