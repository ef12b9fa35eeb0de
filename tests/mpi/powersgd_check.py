"""Under mpiexec: PowerSGD against PyTorch's own DDP hook, and its properties, at whatever P it runs with.

    mpiexec -n P python -m tests.mpi.powersgd_check

1. PyTorch's hook as the reference: a gloo process group beside MPI (same ranks), PowerSGDState +
   powerSGD_hook on one bucket holding the same per-rank gradients as ours (torch_compatible), for
   STEPS steps of which the first are dense (start_powerSGD_iter = our warm-up): the averaged outputs
   and the error buffers agree to float tolerance on every rank, for several option sets (rank 1, 2 and
   4 (QR), warm start on and off, epsilon, no error feedback).
2. In numpy float64 from all ranks' inputs: uncompressed tensors are the ranks' mean; each compressed
   one is the projection of the ranks' mean on span(P), P orthonormal; outputs bitwise equal on all
   ranks; mass conservation, sum_r (gradient + old error) == P * output + sum_r new error.
3. Exact resume: a state_dict round trip (torch.save) mid-run continues with identical bits, in both
   ways of drawing Q, with and without warm start.
4. Volume: bytes sent and received equal three ring allreduces of the sizes the shapes give, and the
   closed form `PowerSGD.cost`; a non-finite gradient raises and leaves the error untouched.
Any failure aborts all ranks with a non-zero exit code.
"""
import gc
import io

import numpy as np
import torch
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook

from sparse_asr.comm import Communicator
from sparse_asr.compression import build_compressor
from sparse_asr.compression.powersgd import PowerSGD
from sparse_asr.training.runtime import run_or_abort
from tests import reference as ref
from tests.mpi.gloo import gloo_group

# lstman4's kinds of tensors, small: conv weight (4-D) + bias + BatchNorm, a bidirectional LSTM layer
# (its weight shapes recur out of order, so the hook's grouping of equal shapes reorders its draws), an
# LSTM layer, lookahead conv (3-D), a classifier, and a matrix too small to compress.
SHAPES = [torch.Size(s) for s in [
    (8, 1, 41, 11), (8,), (8,), (8,),
    (128, 96), (128, 32), (128,), (128,), (128, 96), (128, 32), (128,), (128,),
    (128, 64), (128, 32), (128,), (128,),
    (32, 1, 5), (29, 64), (3, 3),
]]
N = sum(s.numel() for s in SHAPES)
STEPS = 10
WARMUP = 2
CASES = [  # PowerSGD options (besides torch_compatible), warm-up steps
    ({}, WARMUP),  # PyTorch's defaults: rank 1, warm start, epsilon 0, min_compression_rate 2, seed 0
    ({"matrix_approximation_rank": 2, "warm_start": False, "orthogonalization_epsilon": 1e-2, "random_seed": 123},
     WARMUP),
    ({"matrix_approximation_rank": 4, "min_compression_rate": 1.0, "random_seed": 7}, WARMUP),  # QR
    ({"use_error_feedback": False, "warm_start": False}, 0),  # PyTorch allows no warm-up only like this
]


STRENGTHS = np.array([1.0, 0.7, 0.5, 0.35])  # distinct: the rank-4 approximation is well determined


def gradient(step: int, rank: int) -> torch.Tensor:
    """A component shared by all ranks (rank 4 per tensor: real gradients are nearly low-rank) plus per-rank
    noise, with scales differing between tensors."""
    shared, own = np.random.default_rng([7, step]), np.random.default_rng([8, step, rank])
    parts = []
    for i, s in enumerate(SHAPES):
        rows = s[0]
        cols = s.numel() // rows
        low_rank = shared.standard_normal((rows, 4)) @ (STRENGTHS[:, None] * shared.standard_normal((4, cols)))
        parts.append((10.0 ** (i % 3 - 1)) * (low_rank + 0.3 * own.standard_normal((rows, cols))).ravel())
    return torch.from_numpy(np.concatenate(parts).astype(np.float32))


class Bucket:
    """What powerSGD_hook reads of a torch.distributed.GradBucket (which has no Python constructor): the
    only bucket (index 0, hence the last), whose per-parameter gradients are views of its flat buffer,
    as DDP's are."""

    def __init__(self, flat: torch.Tensor, shapes):
        self.flat, self.shapes = flat, shapes

    def buffer(self) -> torch.Tensor:
        return self.flat

    def index(self) -> int:
        return 0

    def is_last(self) -> bool:
        return True

    def gradients(self) -> list[torch.Tensor]:
        views, offset = [], 0
        for s in self.shapes:
            views.append(self.flat[offset:offset + s.numel()].view(s))
            offset += s.numel()
        return views


def close(ours: torch.Tensor, theirs: torch.Tensor, P: int, where: str) -> float:
    """The largest difference relative to the largest entry. At P <= 2 it must be 0: a sum of two is the
    same in any order, so ours and the hook compute the same bits. Beyond, gloo and MPI sum in different
    orders, and the rounding differences grow a little through 8 steps of error feedback."""
    diff = (ours - theirs).abs().max().item() / max(theirs.abs().max().item(), 1e-30)
    assert diff <= (0.0 if P <= 2 else 1e-4), f"{where}: differs from PyTorch's hook by {diff:.3g} (relative)"
    return diff


def against_pytorch(comm, options: dict, warmup: int) -> float:
    rank = comm.rank
    state = PowerSGDState(
        process_group=None, start_powerSGD_iter=warmup,
        matrix_approximation_rank=options.get("matrix_approximation_rank", 1),
        min_compression_rate=options.get("min_compression_rate", 2),
        use_error_feedback=options.get("use_error_feedback", True), warm_start=options.get("warm_start", True),
        orthogonalization_epsilon=options.get("orthogonalization_epsilon", 0),
        random_seed=options.get("random_seed", 0),
    )
    ours = build_compressor("powersgd", comm, N, shapes=SHAPES, warmup=warmup, torch_compatible=True, **options)
    inner = ours.inner if warmup else ours
    worst = 0.0
    for step in range(STEPS):
        where = f"{options} P={comm.size} rank={rank} step={step}"
        grad = gradient(step, rank)
        theirs = powerSGD_hook(state, Bucket(grad.clone(), SHAPES)).wait()
        mine = grad.clone()
        stats = ours.step(mine)
        assert stats.algorithm == ("dense" if step < warmup else "powersgd"), (where, stats.algorithm)
        worst = max(worst, close(mine, theirs, comm.size, where))
        if step >= warmup and inner.error is not None:
            worst = max(worst, close(inner.error, state.error_dict[0], comm.size, f"{where} error buffer"))
    assert state.iter == STEPS, state.iter
    return worst


def expected_words(shapes, rank: int, min_compression_rate: float) -> tuple[int, int, int]:
    """(P, Q, uncompressed) entries, from the rule of PyTorch's _should_compress."""
    p = q = u = 0
    for s in shapes:
        rows, cols = s[0], s.numel() // s[0]
        r = min(rows, cols, rank)
        if r * (rows + cols) * min_compression_rate < rows * cols:
            p, q = p + rows * r, q + cols * r
        else:
            u += s.numel()
    return p, q, u


def properties(comm, options: dict) -> None:
    P, rank = comm.size, comm.rank
    comp = build_compressor("powersgd", comm, N, shapes=SHAPES, **options)
    o = comp.options
    sizes = expected_words(SHAPES, o.matrix_approximation_rank, o.min_compression_rate)
    volume = sum(ref.ring_allreduce_bytes(size, P) for size in sizes if size)
    cost = PowerSGD.cost(N, 0, P, shapes=SHAPES, options=o)
    for step in range(STEPS):
        where = f"{options} P={P} rank={rank} step={step}"
        grad = gradient(step, rank)
        error_before = comp.error.clone() if comp.error is not None else torch.zeros(N)
        flat = grad.clone()
        stats = comp.step(flat)
        everyone = comm.allgather_object((grad.numpy() + error_before.numpy().astype(np.float64), flat.numpy(),
                                          comp.error.numpy().astype(np.float64) if comp.error is not None else 0.0))
        assert all(np.array_equal(out, flat.numpy()) for _, out, _ in everyone), f"{where}: ranks disagree"

        # The update from all ranks' inputs, per tensor, in float64.
        mean = np.mean([acc for acc, _, _ in everyone], axis=0)
        out = flat.numpy().astype(np.float64)
        compressed = {m.offset: m for m in comp.layout.matrices}
        offset = 0
        for s in SHAPES:
            rows, cols, span = s[0], s.numel() // s[0], slice(offset, offset + s.numel())
            if offset in compressed:
                m = compressed[offset]
                basis = comp.p_memory[m.p_offset:m.p_offset + rows * m.rank].view(rows, m.rank).double().numpy()
                np.testing.assert_allclose(basis.T @ basis, np.eye(m.rank), atol=1e-5,
                                           err_msg=f"{where}: P not orthonormal")
                projection = basis @ (basis.T @ mean[span].reshape(rows, cols))
                np.testing.assert_allclose(out[span].reshape(rows, cols), projection, rtol=1e-4,
                                           atol=1e-5 * np.abs(projection).max(), err_msg=f"{where}: not the projection")
            else:
                np.testing.assert_allclose(out[span], mean[span], rtol=1e-6, atol=1e-6 * np.abs(mean[span]).max(),
                                           err_msg=f"{where}: uncompressed tensor is not the mean")
            if comp.error is not None:  # error = acc - update, on uncompressed tensors only as the hook keeps it
                acc = everyone[rank][0][span]
                error = comp.error.numpy()[span]
                if offset in compressed or o.torch_compatible:
                    np.testing.assert_allclose(error, acc - out[span], rtol=1e-6, atol=1e-6 * np.abs(acc).max(),
                                               err_msg=f"{where}: error is not acc - update")
                else:
                    assert not error.any(), f"{where}: error on an exactly averaged tensor"
            offset += s.numel()

        # Error feedback conserves mass.
        if comp.error is not None:
            inflow = np.sum([acc for acc, _, _ in everyone], axis=0)
            outflow = P * out + np.sum([error for _, _, error in everyone], axis=0)
            np.testing.assert_allclose(outflow, inflow, rtol=1e-6, atol=1e-6 * np.abs(inflow).max(),
                                       err_msg=f"{where}: mass not conserved")

        # Volume: three ring allreduces of the sizes the shapes give; the closed form.
        assert stats.bytes_sent == stats.bytes_recv == volume, (where, stats.bytes_recv, volume, sizes)
        assert abs(cost.low * 4 - volume) < 3 and (P not in (1, 2, 4) or cost.low * 4 == volume), (where, cost, volume)
        assert stats.messages == cost.messages == 2 * (P - 1) * sum(1 for size in sizes if size), \
            (where, stats.messages)
        assert stats.selected_global == sum(sizes), where


def resume(comm, options: dict) -> None:
    """state_dict -> torch.save -> a new compressor -> load_state_dict at step 4 continues with the same bits."""

    def build():
        return build_compressor("powersgd", comm, N, shapes=SHAPES, warmup=WARMUP, **options)

    whole, parts = build(), build()
    for step in range(STEPS):
        if step == 4:
            buffer = io.BytesIO()
            torch.save(parts.state_dict(), buffer)
            parts = build()
            buffer.seek(0)
            parts.load_state_dict(torch.load(buffer, weights_only=True))
        a, b = gradient(step, comm.rank), gradient(step, comm.rank)
        whole.step(a)
        parts.step(b)
        assert torch.equal(a, b), f"{options} step {step}: resumed run differs"
    assert torch.equal(whole.inner.error, parts.inner.error) and torch.equal(whole.inner.q_memory, parts.inner.q_memory)



def main(comm):
    torch.set_num_threads(1)
    with gloo_group(comm):  # tests/mpi/gloo.py: garbage is collected only here, between cases
        for options, warmup in CASES:
            worst = against_pytorch(comm, options, warmup)
            gc.collect()
            if comm.rank == 0:
                print(f"ok hook {options} P={comm.size}: largest relative difference {worst:.3g}", flush=True)
    for options in [{}, {"torch_compatible": True}, {"matrix_approximation_rank": 4, "warm_start": False},
                    {"use_error_feedback": False}]:
        properties(comm, options)
    for options in [{}, {"warm_start": False}, {"torch_compatible": True, "warm_start": False},
                    {"torch_compatible": True, "matrix_approximation_rank": 2}]:
        resume(comm, options)
    if comm.rank == 0:
        print(f"ok properties and resume P={comm.size}", flush=True)


if __name__ == "__main__":
    comm = Communicator()
    run_or_abort(comm, main, comm)
