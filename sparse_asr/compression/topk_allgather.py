"""TopkA: exact local top-k, allgather of the (index, value) pairs, scatter-add (DESIGN 4).

Every rank selects exactly k' = min(k, n) entries, so every rank knows every message size and
the allgatherv needs no size exchange. Volume per rank: it sends its k' pairs to the P-1 others
and receives the others' (P-1)k' pairs (2k(P-1) words in the paper's model).
"""
import torch

from sparse_asr.compression.base import (Cost, SparseUpdate, SparseCompressor, Timer, pack_pairs, pair_bytes, sum_pairs,
                                         unpack_pairs)
from sparse_asr.compression.selection import topk_indices


class TopkAllgather(SparseCompressor):
    name = "topka"

    @staticmethod
    def cost(n: int, k: int, P: int, shapes=None, options=None) -> Cost:
        words = 2 * k * (P - 1)
        return Cost(words, words, words, P - 1, "2k(P-1)")

    def exchange(self, acc: torch.Tensor) -> SparseUpdate:
        with Timer() as t:
            local = topk_indices(acc, self.k)
            send = pack_pairs(local.to(self.index_dtype), acc[local])
        nbytes = local.numel() * pair_bytes(self.index_dtype)  # identical on every rank
        received, _ = self.comm.allgatherv(send, counts=[nbytes] * self.comm.size)
        indices, values = sum_pairs(*unpack_pairs(received, self.index_dtype), numel=self.numel)
        return SparseUpdate(indices, values, applied=local, selected_local=local.numel(), seconds_select=t.seconds)
