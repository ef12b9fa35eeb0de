"""PowerSGD (Vogels, Karimireddy & Jaggi, NeurIPS 2019), the algorithm of PyTorch's DDP communication hook
`torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook.powerSGD_hook`, through our Communicator.

Every parameter tensor of shape (d0, d1, ...) is viewed as a matrix M of d0 rows and d1*... columns, as the
hook does. A matrix is approximated with rank r = min(rows, cols, matrix_approximation_rank) when that
saves at least `min_compression_rate` (r (rows + cols) * min_compression_rate < rows * cols); the others
(at a rate >= 1, every 1-D tensor: biases, norms) are averaged uncompressed. One step on every rank:
  1. acc = gradient + error (error feedback: the part of earlier inputs the approximation left out);
  2. one allreduce of the uncompressed tensors, concatenated, / P;
  3. Q: drawn from N(0, 1) on the first step (every step without `warm_start`), else last step's Q;
     orthogonalised; P = M Q for every matrix; one allreduce of all P's;
  4. P orthogonalised; Q = M^T P; one allreduce of all Q's, / P;
  5. update M = P Q^T (the projection of the ranks' mean M on span(P)); error = acc - update on the
     compressed matrices (zero on the uncompressed tensors, whose average is exact).
Orthogonalisation is the hook's `_orthogonalize`: Gram-Schmidt for r <= 2, QR above. Where a column is
exactly zero and orthogonalization_epsilon is 0, the hook divides 0 by 0 (NaN, its try/except never
fires for tensors); here that column stays zero, which changes nothing else.

Volume per rank per step: three ring allreduces, 2(P-1)/P (sum of r (rows + cols) + uncompressed entries)
words (`cost`, from the shapes: k plays no part). StepStats count those entries as `selected_*`, so
the logged density is 1 / the compression rate (the figure of the hook's compression_stats).

PyTorch's `start_powerSGD_iter` is our `compression.warmup_steps` (DenseWarmup): the first steps are
plain allreduce, the error starts at zero and Q is first drawn on the first compressed step. PyTorch
asks for start_powerSGD_iter >= 2 because DDP rebuilds its buckets after iteration 1; our flat buffer
never changes, so any warm-up, 0 included, is fine.

`torch_compatible` makes the numerics those of the hook on ONE bucket holding our flat gradient (DDP
cuts the gradient into several buckets, each with its own matrices, allreduces and draws):
  - Q is drawn as the hook draws it: a seed from numpy's RandomState(random_seed).randint(1e9) per draw,
    then torch.randn on a CPU generator with that seed, matrix by matrix in the hook's order (matrices of
    equal shape together). By default Q comes from one torch.Generator seeded with random_seed, on the
    compressor's device, in one call;
  - the error covers the whole bucket: on uncompressed tensors it is acc - mean, which sums to zero over
    ranks and only changes the next average by rounding. By default it is zero there.
Everything else is the same in both modes (orthogonalisation, order of operations, the rest of the
error); tests/mpi/powersgd_check.py holds ours to the hook's outputs and error buffers.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from sparse_asr.compression.base import Compressor, Cost, StepStats
from sparse_asr.compression.memory import ErrorFeedback, copy_checked
from sparse_asr.settings import natural, positive, setting


@dataclass(frozen=True)
class PowerSGDOptions:
    # r (PyTorch's default 1; the hook's docs suggest 1, 2, 4, ...)
    matrix_approximation_rank: int = setting(1, positive, "must be >= 1")
    # a matrix is compressed only if that divides its entries by more
    min_compression_rate: float = setting(2.0, natural, "must be >= 0")
    use_error_feedback: bool = setting(True)
    warm_start: bool = setting(True)  # reuse last step's Q instead of a fresh random one
    orthogonalization_epsilon: float = setting(0.0, natural, "must be >= 0")  # added to column norms in Gram-Schmidt
    random_seed: int = setting(0, lambda v: 0 <= v < 2**32, "must be in [0, 2**32)")
    # the hook's draws of Q and its error on uncompressed tensors (module docstring)
    torch_compatible: bool = setting(False)


@dataclass(frozen=True)
class LowRankMatrix:
    offset: int  # of the tensor in the flat gradient
    rows: int
    cols: int
    rank: int
    p_offset: int  # of its P (rows x rank) in the P buffer
    q_offset: int  # of its Q (cols x rank) in the Q buffer


@dataclass(frozen=True)
class Layout:
    """Which tensors are approximated and where their P and Q live; the same on every rank."""

    matrices: tuple[LowRankMatrix, ...]  # in the hook's order: equal (rows, cols) together, first seen first
    uncompressed: tuple[tuple[int, int], ...]  # (offset, numel) in flat order
    p_words: int
    q_words: int
    uncompressed_words: int

    @property
    def words(self) -> int:
        """Entries each rank contributes to the allreduces."""
        return self.p_words + self.q_words + self.uncompressed_words


def plan(shapes, rank: int, min_compression_rate: float) -> Layout:
    """The hook's split of the tensors (its _should_compress) and its P/Q memory layout."""
    groups: dict[tuple[int, int], list[tuple[int, int, int, int]]] = {}
    uncompressed = []
    offset = 0
    for shape in shapes:
        shape = torch.Size(shape)
        numel = shape.numel()
        rows = shape[0] if len(shape) > 0 else 1
        cols = numel // rows if rows else 0
        r = min(rows, cols, rank)
        if numel and r * (rows + cols) * min_compression_rate < rows * cols:
            groups.setdefault((rows, cols), []).append((offset, rows, cols, r))
        elif numel:
            uncompressed.append((offset, numel))
        offset += numel
    matrices, p_words, q_words = [], 0, 0
    for offset, rows, cols, r in (m for group in groups.values() for m in group):
        matrices.append(LowRankMatrix(offset, rows, cols, r, p_words, q_words))
        p_words += rows * r
        q_words += cols * r
    return Layout(tuple(matrices), tuple(uncompressed), p_words, q_words, sum(n for _, n in uncompressed))


def orthogonalize_(matrices: torch.Tensor, epsilon: float = 0.0) -> None:
    """Orthonormal columns for a batch (B, n, r), in place: PyTorch's powerSGD_hook._orthogonalize
    (Gram-Schmidt for r <= 2, where epsilon applies, QR otherwise), except that an all-zero column
    with epsilon 0 stays zero instead of becoming NaN."""
    rank = matrices.shape[2]
    if rank > 2:
        r_factor = torch.empty(matrices.shape[0], rank, rank, device=matrices.device, dtype=matrices.dtype)
        torch.linalg.qr(matrices, out=(matrices, r_factor))
        return
    for i in range(rank):
        col = matrices[:, :, i:i + 1]
        norm = torch.linalg.vector_norm(col, dim=1, keepdim=True)
        col /= torch.where(norm > 0, norm, 1.0) if epsilon == 0 else norm + epsilon
        if i + 1 < rank:
            rest = matrices[:, :, i + 1:]
            rest -= torch.sum(col * rest, dim=1, keepdim=True) * col


class PowerSGD(Compressor):
    name = "powersgd"
    uses_density = False  # the volume follows from the shapes and the rank
    Options = PowerSGDOptions

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        o = self.options
        self.layout = plan(self.shapes, o.matrix_approximation_rank, o.min_compression_rate)
        f32 = dict(dtype=torch.float32, device=self.device)
        # Everything below is state a checkpoint must carry to resume exactly.
        self.memory = ErrorFeedback(self.numel, self.device) if o.use_error_feedback else None
        self.p_memory = torch.zeros(self.layout.p_words, **f32)
        self.q_memory = torch.zeros(self.layout.q_words, **f32)
        self.q_drawn = False  # Q holds last step's (averaged) Q, to start from with warm_start
        if o.torch_compatible:
            self.seeds = np.random.RandomState(o.random_seed)
        else:
            self.generator = torch.Generator(device=self.device).manual_seed(o.random_seed)
        # Per matrix, (1, n, r) views of the P and Q buffers: batches of one, as the hook computes.
        self.ps = [self.p_memory[m.p_offset:m.p_offset + m.rows * m.rank].view(1, m.rows, m.rank)
                   for m in self.layout.matrices]
        self.qs = [self.q_memory[m.q_offset:m.q_offset + m.cols * m.rank].view(1, m.cols, m.rank)
                   for m in self.layout.matrices]

    @staticmethod
    def cost(n: int, k: int, P: int, shapes=None, options: PowerSGDOptions | None = None) -> Cost:
        """Three ring allreduces (uncompressed tensors, P's, Q's): 2(P-1)/P words per entry. The volume
        depends on the parameter shapes and the rank (options), not on k; without `shapes` the gradient is
        one vector, which PowerSGD sends whole (the constructor's default too)."""
        o = options if options is not None else PowerSGDOptions()
        layout = plan(shapes if shapes is not None else [torch.Size([n])], o.matrix_approximation_rank,
                      o.min_compression_rate)
        words = 2 * layout.words * (P - 1) / P
        buffers = sum(1 for size in (layout.uncompressed_words, layout.p_words, layout.q_words) if size)
        return Cost(words, words, words, 2 * (P - 1) * buffers, "2(P-1)/P (sum of r(rows+cols) + uncompressed)")

    def describe(self) -> str:
        o, layout = self.options, self.layout
        return (f"PowerSGD rank {o.matrix_approximation_rank}: {len(layout.matrices)} of {len(self.shapes)} tensors "
                f"low-rank, {layout.words:,} of {self.numel:,} entries sent per rank per step"
                f"{' (torch_compatible)' if o.torch_compatible else ''}")

    # ------------------------------------------------------------------ one step
    @property
    def error(self) -> torch.Tensor | None:
        """The error fed back (None without error feedback)."""
        return None if self.memory is None else self.memory.residual

    @property
    def owed(self) -> torch.Tensor | None:
        return self.error

    def step(self, flat_grad: torch.Tensor) -> StepStats:
        layout = self.layout
        with self.comm.measure() as moved:
            t0 = time.perf_counter()
            self.compress_(flat_grad)
            seconds = time.perf_counter() - t0
        words = layout.words
        return self.stats(moved, words, words, seconds - moved.seconds, k=words,  # selection: compression compute
                          extra={"compressed_tensors": float(len(layout.matrices)),
                                 "uncompressed_entries": float(layout.uncompressed_words),
                                 "compression_rate": self.numel / words if words else 1.0})

    def compress_(self, flat_grad: torch.Tensor) -> None:
        """flat_grad (+ the error fed back) becomes its rank-r approximation averaged over ranks, in place."""
        comm, layout, eps = self.comm, self.layout, self.options.orthogonalization_epsilon
        if self.memory is not None:
            flat_grad.copy_(self.memory.accumulate(flat_grad))  # acc, in both until the update is known
        matrices = [flat_grad[m.offset:m.offset + m.rows * m.cols].view(1, m.rows, m.cols) for m in layout.matrices]

        if layout.uncompressed:
            uncompressed = torch.cat([flat_grad[o:o + n] for o, n in layout.uncompressed])
            comm.allreduce_(uncompressed)
            uncompressed /= comm.size
            start = 0
            for o, n in layout.uncompressed:
                flat_grad[o:o + n] = uncompressed[start:start + n]
                start += n

        if layout.matrices:
            if self.q_drawn and self.options.warm_start:
                for q in self.qs:
                    orthogonalize_(q, eps)
            else:
                self._draw_q()
            for m, q, p in zip(matrices, self.qs, self.ps):
                torch.bmm(m, q, out=p)
            comm.allreduce_(self.p_memory)  # no / P: P is orthogonalised next
            for p in self.ps:
                orthogonalize_(p, eps)
            for m, p, q in zip(matrices, self.ps, self.qs):
                torch.bmm(m.transpose(1, 2), p, out=q)
            comm.allreduce_(self.q_memory)
            self.q_memory /= comm.size
            for p, q, m in zip(self.ps, self.qs, matrices):
                torch.bmm(p, q.transpose(1, 2), out=m)

        if self.memory is not None:
            self.memory.applied_update(flat_grad)
            if not self.options.torch_compatible:  # an exact average leaves no error to feed back
                for o, n in layout.uncompressed:
                    self.memory.residual[o:o + n] = 0.0

    def _draw_q(self) -> None:
        """Fresh orthonormal Q's, the same on every rank (same seed, same draws)."""
        if self.options.torch_compatible:
            generator = torch.Generator().manual_seed(int(self.seeds.randint(1_000_000_000)))
            for q in self.qs:
                q.copy_(torch.randn(q.shape, generator=generator, dtype=q.dtype))
        else:
            self.q_memory.normal_(generator=self.generator)
        for q in self.qs:
            orthogonalize_(q, self.options.orthogonalization_epsilon)
        self.q_drawn = True

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        state = {"q_memory": self.q_memory.detach().cpu().clone(), "q_drawn": self.q_drawn}
        if self.memory is not None:
            state["memory"] = self.memory.state_dict()
        if self.options.torch_compatible:
            kind, keys, pos, has_gauss, cached = self.seeds.get_state()
            state["seeds"] = {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                              "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
        else:
            state["generator"] = self.generator.get_state()
        return state

    def load_state_dict(self, state: dict) -> None:
        copy_checked(self.q_memory, state["q_memory"], f"{self.name} q_memory")
        if self.memory is not None:
            self.memory.load_state_dict(state["memory"])
        self.q_drawn = bool(state["q_drawn"])
        if self.options.torch_compatible:
            s = state["seeds"]
            self.seeds.set_state(("MT19937", s["keys"].numpy().astype(np.uint32), s["pos"], s["has_gauss"],
                                  s["cached_gaussian"]))
        else:
            self.generator.set_state(state["generator"])
