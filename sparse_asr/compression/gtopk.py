"""gTopk: tree merge of local top-k sets keeping the top-k of every merge (DESIGN 4).

Every rank selects its exact local top-k' (k' = min(k, n)). The sets are merged up a binomial
tree rooted at rank 0, which works for any P: in round r (d = 2**r), rank i with i % 2d == d sends
its set to rank i - d and is done going up; rank i with i % 2d == 0 receives from i + d when that
rank exists, sums the two sets (duplicate indices summed) and keeps the k' entries of largest
|sum|. After ceil(log2 P) rounds rank 0 holds the final set F, which goes back down the same tree.
A union of two k'-sets has at least k' entries, so every set, and every message, has exactly k'
pairs: message sizes are known in advance and no size exchange is needed.

Error feedback must conserve mass exactly. A contribution dropped at an intermediate merge is
lost even if its index reaches F through another branch, so a rank may clear from its residual
only the entries whose value survived EVERY merge on its way to the root. That information
travels down with F: each message down carries F's pairs plus a bit mask over F marking the
entries whose value at the receiver's subtree root (what it sent up) reached the root. A node
with mask M (its set after its last merge) walks its merges backwards: for the merge with child
c, the child's mask is M & (F in c's set), and before that merge M becomes M & (F in its own set
before the merge). What remains at the bottom is the rank's `applied` set.

Volume per rank (paper's model, 4-byte words): at most 2k' per round up and 2k' per round down
(plus k'/32 words of mask), i.e. 4k log2 P at the root.
"""
import math

import torch

from sparse_asr.compression.base import (Cost, SparseUpdate, SparseCompressor, Timer, pack_pairs, pair_bytes, sum_pairs,
                                         unpack_pairs)
from sparse_asr.compression.selection import topk_indices

TAG_UP, TAG_DOWN = 201, 202


def pack_bits(mask: torch.Tensor) -> torch.Tensor:
    """Bool mask (m,) -> uint8 (ceil(m/8),), bit b of byte i = mask[8i + b]."""
    m = mask.numel()
    padded = torch.zeros(-(-m // 8) * 8, dtype=torch.uint8, device=mask.device)
    padded[:m] = mask
    weights = torch.tensor([1 << b for b in range(8)], dtype=torch.uint8, device=mask.device)
    return (padded.view(-1, 8) * weights).sum(dim=1, dtype=torch.uint8)


def unpack_bits(packed: torch.Tensor, m: int) -> torch.Tensor:
    shifts = torch.arange(8, dtype=torch.uint8, device=packed.device)
    return ((packed.unsqueeze(1) >> shifts) & 1).flatten()[:m].bool()


def merge_topk(a_idx, a_val, b_idx, b_val, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum two sparse sets and keep the k entries of largest |sum| (indices ascending)."""
    idx, val = sum_pairs(torch.cat([a_idx, b_idx]), torch.cat([a_val, b_val]))
    keep = topk_indices(val, k)
    return idx[keep], val[keep]


class GTopk(SparseCompressor):
    name = "gtopk"

    @staticmethod
    def cost(n: int, k: int, P: int, shapes=None, options=None) -> Cost:
        """Critical path at the root: k pairs up and k pairs down per round."""
        rounds = math.ceil(math.log2(P)) if P > 1 else 0
        return Cost(4 * k * rounds, 4 * k * rounds, 4 * k * rounds, 2 * rounds, "4k ceil(log2 P)")

    def exchange(self, acc: torch.Tensor) -> SparseUpdate:
        P, i = self.comm.size, self.comm.rank
        kk = min(self.k, self.numel)
        pb = pair_bytes(self.index_dtype)
        rounds = math.ceil(math.log2(P)) if P > 1 else 0
        with Timer() as t:
            local = topk_indices(acc, self.k)
            s_idx, s_val = local, acc[local]

        # Up the tree. merges: (child, child's indices, my indices before the merge), in order.
        merges, parent = [], None
        for r in range(rounds):
            d = 1 << r
            if i % (2 * d) == d:
                parent = i - d
                send = pack_pairs(s_idx.to(self.index_dtype), s_val)
                self.comm.waitall([self.comm.isend(send, parent, TAG_UP)])
                break
            if i + d < P:
                buf = torch.empty(kk * pb, dtype=torch.uint8, device=acc.device)
                self.comm.waitall([self.comm.irecv(buf, i + d, TAG_UP)])
                c_idx, c_val = unpack_pairs(buf, self.index_dtype)
                merges.append((i + d, c_idx.long(), s_idx))
                s_idx, s_val = merge_topk(s_idx, s_val, c_idx.long(), c_val, kk)

        # Down the tree: F and my mask over F, then each child's mask.
        if parent is None:
            f_idx, f_val = s_idx, s_val
            mask = torch.ones(kk, dtype=torch.bool, device=acc.device)
        else:
            buf = torch.empty(kk * pb + -(-kk // 8), dtype=torch.uint8, device=acc.device)
            self.comm.waitall([self.comm.irecv(buf, parent, TAG_DOWN)])
            f_idx, f_val = unpack_pairs(buf[: kk * pb], self.index_dtype)
            f_idx = f_idx.long()
            mask = unpack_bits(buf[kk * pb :], kk)
        f_pairs = pack_pairs(f_idx.to(self.index_dtype), f_val)
        requests = []
        for child, c_idx, own_before in reversed(merges):
            child_mask = mask & torch.isin(f_idx, c_idx)
            requests.append(self.comm.isend(torch.cat([f_pairs, pack_bits(child_mask)]), child, TAG_DOWN))
            mask = mask & torch.isin(f_idx, own_before)
        self.comm.waitall(requests)
        return SparseUpdate(
            f_idx,
            f_val,
            applied=f_idx[mask],
            selected_local=local.numel(),
            seconds_select=t.seconds,
            extra={"rounds": float(rounds), "applied_local": float(mask.sum().item())},
        )
