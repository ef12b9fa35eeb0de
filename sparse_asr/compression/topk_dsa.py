"""TopkDSA (SparCML-style dynamic sparse allreduce, DESIGN 4).

1. Exact local top-k' (k' = min(k, n)) of |acc|.
2. Reduce-scatter: the index space is cut into P static, equal, contiguous regions
   (region j = [j*n//P, (j+1)*n//P)); each rank sends the pairs of region j to rank j (alltoallv)
   and each owner sums what arrives (duplicate indices summed).
3. Allgather of the reduced regions. A region whose reduced entry count exceeds
   `dense_switch` times its length (default 1/3) is sent as its dense float32 values instead of
   (index, value) pairs -- fill-in makes pairs the more expensive form. Every rank learns every
   region's count (one small allgather, counted as 'meta'), so everyone knows each region's format
   and byte size.

The global update is the sum of every rank's local top-k' (the same as TopkA); only the route
differs. For a region sent dense, the update's indices are its nonzero entries (an entry whose
sum is exactly 0 changes nothing either way). Every local selection reaches its owner, so
`applied` is the local selection.

Volume per rank (paper's model, in 4-byte words, regions equally loaded): reduce-scatter
2k(P-1)/P, allgather between 2k(P-1)/P (all ranks chose the same indices) and
min(2k(P-1), n(P-1)/P) (no overlap, or dense regions).
"""
from dataclasses import dataclass

import torch

from sparse_asr.compression.base import (Cost, SparseUpdate, SparseCompressor, Timer, pack_pairs, pair_bytes, sum_pairs,
                                         unpack_pairs)
from sparse_asr.compression.selection import topk_indices
from sparse_asr.settings import setting


@dataclass(frozen=True)
class TopkDSAOptions:
    # a region whose union fills more than this fraction is sent dense
    dense_switch: float = setting(1 / 3, lambda v: 0 < v <= 1, "must be in (0, 1]")


class TopkDSA(SparseCompressor):
    name = "topkdsa"
    Options = TopkDSAOptions

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.dense_switch = self.options.dense_switch
        P = self.comm.size
        self.bounds = [j * self.numel // P for j in range(P + 1)]  # region j = [bounds[j], bounds[j+1])

    @staticmethod
    def cost(n: int, k: int, P: int, shapes=None, options=None) -> Cost:
        """Reduce-scatter of k pairs, then an allgather of the union U: k pairs per rank when all ranks
        selected the same entries, the whole union (or dense regions) when they are disjoint. Typical:
        independent selections, U = n(1 - (1 - k/n)^P), gathered dense once U > n/3."""
        union = n * (1 - (1 - k / n) ** P)
        typical = (2 * k + (2 * union if union <= n / 3 else n)) * (P - 1) / P
        return Cost(4 * k * (P - 1) / P, 2 * k * (P - 1) / P + min(2 * k * (P - 1), n * (P - 1) / P), typical,
                    2 * (P - 1), "[4k(P-1)/P, 2k(P-1)/P + min(2k(P-1), n(P-1)/P)]")

    def exchange(self, acc: torch.Tensor) -> SparseUpdate:
        P, r = self.comm.size, self.comm.rank
        pb = pair_bytes(self.index_dtype)
        with Timer() as t:
            local = topk_indices(acc, self.k)
            cuts = torch.searchsorted(local, torch.tensor(self.bounds, device=local.device))
            per_region = (cuts[1:] - cuts[:-1]).tolist()
            send = pack_pairs(local.to(self.index_dtype), acc[local])

        # Reduce-scatter: my region's pairs from every rank, summed.
        received, _ = self.comm.alltoallv(send, [c * pb for c in per_region])
        mine, sums = sum_pairs(*unpack_pairs(received, self.index_dtype))

        # Allgather of the reduced regions, each as pairs or dense values.
        reduced = self.comm.allgather_int(mine.numel())
        lengths = [self.bounds[j + 1] - self.bounds[j] for j in range(P)]
        dense = [reduced[j] > self.dense_switch * lengths[j] for j in range(P)]
        sizes = [lengths[j] * 4 if dense[j] else reduced[j] * pb for j in range(P)]
        if dense[r]:
            region = torch.zeros(lengths[r], dtype=torch.float32, device=acc.device)
            region[mine - self.bounds[r]] = sums
            part = region.view(torch.uint8)
        else:
            part = pack_pairs(mine.to(self.index_dtype), sums)
        gathered, _ = self.comm.allgatherv(part, counts=sizes)

        indices, values, offset = [], [], 0
        for j in range(P):
            chunk = gathered[offset : offset + sizes[j]]
            offset += sizes[j]
            if dense[j]:
                dense_values = chunk.clone().view(torch.float32)
                nonzero = torch.nonzero(dense_values).flatten()
                indices.append(nonzero + self.bounds[j])
                values.append(dense_values[nonzero])
            else:
                j_idx, j_val = unpack_pairs(chunk, self.index_dtype)
                indices.append(j_idx.long())
                values.append(j_val)
        return SparseUpdate(
            torch.cat(indices),
            torch.cat(values),
            applied=local,
            selected_local=local.numel(),
            seconds_select=t.seconds,
            extra={"dense_regions": float(sum(dense)), "reduced_pairs": float(sum(reduced))},
        )
