"""Random-k with error feedback (`randomk`; e.g. Stich, Cordonnier & Jaggi, "Sparsified SGD with Memory",
NeurIPS 2018; GRACE's RandomK): the k indices of a step are drawn uniformly without replacement from a generator
seeded alike on every rank (compression.options.seed and the step count), so no index travels: one allreduce of
the k values of acc = gradient + residual there. Every rank applies all k entries (they leave every residual).

The draws of step t follow from (seed, t) alone (`draw_indices`, compression/wire.py's step_generator); the step
count is state (state_dict), so a resumed run continues the same draws. Volume per rank: a ring allreduce of k
float32 values, 2k(P-1)/P words: the least of any sparse exchange here, for entries picked blind.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from sparse_asr.compression.base import Cost, SparseCompressor, SparseUpdate, Timer
from sparse_asr.compression.wire import step_generator
from sparse_asr.settings import setting


@dataclass(frozen=True)
class RandomkOptions:
    seed: int = setting(0, lambda v: 0 <= v < 2**32, "must be in [0, 2**32)")  # the same on every rank


def draw_indices(numel: int, k: int, seed: int, step: int, device="cpu") -> torch.Tensor:
    """k distinct indices in [0, numel), ascending, uniform over the k-subsets, from (seed, step) alone. Few
    (k <= numel / 4): draw the missing count with replacement and keep the distinct ones until there are k (each
    new distinct index is uniform over those not yet drawn); many: a permutation's first k."""
    generator = step_generator(torch.device(device), seed, step)
    k = min(k, numel)
    if 4 * k > numel:
        return torch.randperm(numel, generator=generator, device=device)[:k].sort().values
    chosen = torch.empty(0, dtype=torch.int64, device=device)
    while chosen.numel() < k:
        more = torch.randint(numel, (k - chosen.numel(),), generator=generator, device=device)
        chosen = torch.unique(torch.cat([chosen, more]))  # sorted, distinct
    return chosen


class Randomk(SparseCompressor):
    name = "randomk"
    Options = RandomkOptions

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sparse_steps = 0  # exchanges done so far: the draws follow it (checkpointed)

    @staticmethod
    def cost(n: int, k: int, P: int, shapes=None, options=None) -> Cost:
        words = 2 * min(k, n) * (P - 1) / P
        return Cost(words, words, words, 2 * (P - 1), "2k(P-1)/P (no indices)")

    def describe(self) -> str:
        return f"{self.name} (shared random indices, seed {self.options.seed}) at density {self.density:g}"

    def exchange(self, acc: torch.Tensor) -> SparseUpdate:
        with Timer() as t:
            indices = draw_indices(self.numel, self.k, self.options.seed, self.sparse_steps, acc.device)
            values = acc[indices]  # a copy: the residual buffer is not touched by the allreduce
        self.comm.allreduce_(values)
        self.sparse_steps += 1
        indices = indices.to(self.index_dtype)
        return SparseUpdate(indices=indices, values=values, applied=indices, selected_local=indices.numel(),
                            seconds_select=t.seconds)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "sparse_steps": self.sparse_steps}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.sparse_steps = int(state["sparse_steps"])
