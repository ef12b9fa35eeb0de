"""Under mpiexec: synchronized BatchNorm on P ranks computes what one process computes on the whole global batch.

    mpiexec -n P python -m tests.mpi.syncbn_check MANIFEST_DIR GLOBAL_BATCH OUT_DIR

A global batch of real AN4 training utterances spread over the range of durations, each rank given its
contiguous share as BucketingSampler gives it (so each pads to its own longest utterance), lstman4_tiny
with random BatchNorm state. The reference is ONE process on the whole global batch, with torch's own
batch_norm over exactly the valid frames (tests/batchnorm_reference.py), in float64.

With model.sync_batchnorm, in float64 (to 1e-6) and float32 (to 1e-3): the mean of the ranks' losses,
the gradient after DenseAllreduce (sum / P) and the running statistics equal the reference; the
running statistics are bit-identical on every rank; the Communicator counted exactly the BatchNorm
allreduces under "syncbn" (per layer: 2C+1 float64 forward, 2C backward). Without it (per-rank
BatchNorm, unchanged): the running statistics differ between ranks and the averaged gradient is
another one. Then a short train.py run with sync on: buffers identical on all ranks in the checkpoint
(no epoch-end averaging) and comm/syncbn_bytes_recv logged per step, exactly.
Any failure aborts the whole job (non-zero exit).
"""
import hashlib
import sys
from pathlib import Path

import torch

from sparse_asr.comm import Communicator
from sparse_asr.compression.dense import DenseAllreduce
from sparse_asr.models import build_model
from sparse_asr.models.sync_batchnorm import COUNT_AS, SyncBatchNorm
from sparse_asr.training.checkpoint import load_training_state
from sparse_asr.training.runtime import run_or_abort
from tests.batchnorm_reference import (batchnorm_buffers, loss_and_gradient, randomize_batchnorms, rank_share,
                                       relative_error, spread_utterances, valid_frames_model)
from tests.mpi.train_common import read_metrics, run_training, tiny_overrides
from tests.reference import ring_allreduce_bytes

MODEL = "lstman4_tiny"
# Relative. The model's log-probabilities, and so CTC, are float32 in either dtype: float64 shards
# differ from the whole batch by CTC's float32 rounding (~3e-8 measured at P = 3, 7e-14 at P = 2, 4).
TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-3}


def buffers_hash(buffers: dict) -> str:
    digest = hashlib.sha256()
    for key in sorted(buffers):
        digest.update(key.encode() + buffers[key].cpu().numpy().tobytes())
    return digest.hexdigest()


def syncbn_bytes(model, P: int, grad_itemsize: int) -> int:
    """What one forward + backward of `model` must move per rank: per SyncBatchNorm of C channels,
    a ring allreduce of 2C+1 float64 statistics and one of 2C gradient sums."""
    return sum(ring_allreduce_bytes(2 * m.num_features + 1, P, 8)
               + ring_allreduce_bytes(2 * m.num_features, P, grad_itemsize)
               for m in model.modules() if isinstance(m, SyncBatchNorm))


def averaged(comm, loss: float, grad: torch.Tensor) -> tuple[float, torch.Tensor]:
    """(mean of the ranks' losses, the gradient after the trainer's dense allreduce: sum / P)."""
    total = comm.allreduce_(torch.tensor([loss], dtype=torch.float64)).item()
    DenseAllreduce(comm, grad.numel()).step(grad)
    return total / comm.size, grad


def check_model(comm, manifests: Path, global_batch: int) -> None:
    P = comm.size
    items = spread_utterances(manifests / "an4_train.csv", global_batch)
    mine = rank_share(items, comm.rank, P)
    torch.manual_seed(0)
    plain = build_model(MODEL)
    randomize_batchnorms(plain, seed=1)
    state = plain.state_dict()
    if comm.rank == 0:  # computed once, for every rank
        reference = valid_frames_model(MODEL, state).double()
        expected = (*loss_and_gradient(reference, items), batchnorm_buffers(reference))
    ref_loss, ref_grad, ref_buffers = comm.bcast_object(expected if comm.rank == 0 else None)

    for dtype, tolerance in TOLERANCE.items():
        synced = build_model(MODEL, sync_bn=comm)
        synced.load_state_dict(state)
        synced.to(dtype)
        before = comm.counts(COUNT_AS)
        loss, grad = loss_and_gradient(synced, mine)
        moved = comm.counts(COUNT_AS) - before
        loss, grad = averaged(comm, loss, grad)
        assert abs(loss - ref_loss) <= tolerance * abs(ref_loss), (dtype, loss, ref_loss)
        error = relative_error(grad.double(), ref_grad)
        assert error < tolerance, (dtype, error)
        buffers = batchnorm_buffers(synced)
        for key, value in buffers.items():
            torch.testing.assert_close(value, ref_buffers[key].to(value.dtype), rtol=tolerance, atol=tolerance,
                                       msg=lambda text: f"{dtype} {key}: {text}")
        hashes = comm.allgather_object(buffers_hash(buffers))
        assert len(set(hashes)) == 1, f"{dtype}: running statistics differ between ranks"
        expected = syncbn_bytes(synced, P, torch.tensor([], dtype=dtype).element_size())
        layers = sum(isinstance(m, SyncBatchNorm) for m in synced.modules())
        assert (moved.bytes_sent, moved.bytes_recv) == (expected, expected), (dtype, moved, expected)
        assert (moved.msgs_sent, moved.msgs_recv) == (4 * layers * (P - 1),) * 2, (dtype, moved)
        if comm.rank == 0:
            print(f"P={P} sync {dtype}: loss {loss:.6f} (one process {ref_loss:.6f}), gradient relative error "
                  f"{error:.1e}, running statistics identical on all ranks, {expected} syncbn bytes per step",
                  flush=True)

    per_rank = build_model(MODEL)
    per_rank.load_state_dict(state)
    loss, grad = averaged(comm, *loss_and_gradient(per_rank, mine))
    hashes = comm.allgather_object(buffers_hash(batchnorm_buffers(per_rank)))
    error = relative_error(grad.double(), ref_grad)
    if P > 1:
        assert len(set(hashes)) == P, "per-rank BatchNorm: every rank must keep its own statistics"
        assert error > 1e-3, f"per-rank BatchNorm gave the whole-batch gradient (relative error {error:.1e})"
    if comm.rank == 0:
        print(f"P={P} per-rank: loss {loss:.6f}, gradient relative error {error:.3f}, "
              f"{len(set(hashes))} different running statistics", flush=True)


def check_training(comm, manifests: Path, out_dir: Path) -> None:
    """A short real run with sync on: what the trainer does with it."""
    P = comm.size
    name = f"syncbn-p{P}"
    run_training(tiny_overrides(manifests, out_dir, name, model__sync_batchnorm="true", train__epochs=1,
                                train__global_batch_size=4 * P, data__max_train_utterances=8 * P,
                                train__eval_every_epochs=0, data__test_manifest="''"), comm)
    hashes = set(comm.allgather_object(buffers_hash(load_training_state(comm, out_dir / name).mine.buffers)))
    if comm.rank != 0:
        return
    assert len(hashes) == 1, "running statistics differ between ranks after training with sync BatchNorm"
    logged = [m["comm/syncbn_bytes_recv"] for m in read_metrics(out_dir / name) if m["kind"] == "train"]
    expected = syncbn_bytes(build_model(MODEL, sync_bn=comm), P, 4)
    assert len(logged) == 2 and all(value == expected for value in logged), (logged, expected)
    print(f"P={P} train.py with model.sync_batchnorm: running statistics identical on all ranks, "
          f"{expected} syncbn bytes per step logged", flush=True)


def main(comm, manifests: Path, global_batch: int, out_dir: Path) -> None:
    torch.set_num_threads(1)
    check_model(comm, manifests, global_batch)
    check_training(comm, manifests, out_dir)


if __name__ == "__main__":
    comm = Communicator()
    run_or_abort(comm, main, comm, Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
