"""CLT-k: cyclic local top-k, a shared index set (Chen et al., "ScaleCom: Scalable Sparsified Gradient
Compression for Communication-Efficient Distributed Training", NeurIPS 2020).

One step, with acc = grad + residual on every rank and k = density * n:
  1. the leader of this step, rank (step mod P), selects the k largest |acc| of its own accumulator;
  2. it broadcasts those k indices;
  3. every rank contributes its acc at exactly those indices, and one allreduce of the k values sums them.
The update is the exact mean over ranks of acc on the leader's index set, and every rank applies all k
entries (they all leave every rank's residual). Why it is here: with few utterances per rank, each
rank's own top-k is driven by its own residual noise, so under Ok-Topk or TopkA a globally selected
entry carries about one rank's value and the rest stays owed (docs/results.md, "Why does Ok-Topk lose
accuracy as P grows?"); with a shared index set every applied entry carries all P ranks' values. Its
cost: the leader's picks are one rank's view, which error feedback corrects over the rotation.

Volume per rank: the broadcast (k int32 words, received by the P-1 others) and a ring allreduce of k
float32 values, 2k(P-1)/P words: below Ok-Topk's typical 4k(P-1)/P.
"""
from __future__ import annotations

import torch

from sparse_asr.compression.base import Cost, SparseCompressor, SparseUpdate, Timer
from sparse_asr.compression.selection import topk_indices


class CLTk(SparseCompressor):
    name = "cltk"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sparse_steps = 0  # exchanges done so far: the leader rotates with it (checkpointed)

    @staticmethod
    def cost(n: int, k: int, P: int, shapes=None, options=None) -> Cost:
        """Broadcast of k indices (received by P-1 of the P ranks: k(P-1)/P words on average, k on the others,
        0 on the leader) and a ring allreduce of k values, 2k(P-1)/P."""
        mean = 3 * k * (P - 1) / P
        return Cost(2 * k * (P - 1) / P, 2 * k * (P - 1) / P + (k if P > 1 else 0), mean, 2 * (P - 1),
                    "2k(P-1)/P + k on every rank but the leader")

    def describe(self) -> str:
        return f"{self.name} (leader's top-k, rotating) at density {self.density:g}"

    def leader(self) -> int:
        return self.sparse_steps % self.comm.size

    def exchange(self, acc: torch.Tensor) -> SparseUpdate:
        comm, leader = self.comm, self.leader()
        k = min(self.k, self.numel)
        indices = torch.empty(k, dtype=self.index_dtype, device=acc.device)
        with Timer() as t:
            if comm.rank == leader:
                indices.copy_(topk_indices(acc, k))
        comm.bcast_(indices, root=leader)
        values = acc[indices.long()]  # a copy: acc (the residual buffer) is not touched by the allreduce
        comm.allreduce_(values)
        self.sparse_steps += 1
        return SparseUpdate(indices=indices, values=values, applied=indices, selected_local=k,
                            seconds_select=t.seconds, extra={"leader": float(leader)})

    def state_dict(self) -> dict:
        return {**super().state_dict(), "sparse_steps": self.sparse_steps}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.sparse_steps = int(state["sparse_steps"])
