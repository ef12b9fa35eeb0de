"""Under mpiexec: 2 epochs == 1 epoch + resume + 1 epoch, with a sparse compressor whose per-rank
state (error-feedback residual, thresholds, ...) must travel through the checkpoint.

    mpiexec -n P python -m tests.mpi.train_resume MANIFEST_DIR OUT_DIR ALGORITHM

Every rank compares its own compressor state in both final checkpoints; rank 0 compares the
per-step losses and the parameters. Any failure aborts the whole job (non-zero exit).
"""
import sys
from pathlib import Path

import torch

from sparse_asr.comm import Communicator
from tests.mpi.train_common import run_training, step_losses, tiny_overrides
from sparse_asr.training.checkpoint import load_checkpoint
from sparse_asr.training.runtime import run_or_abort


def assert_same(a, b, where):
    if torch.is_tensor(a):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=where)
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), (where, a.keys(), b.keys())
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, float):
        assert abs(a - b) <= 1e-6 * max(1.0, abs(a)), (where, a, b)
    else:
        assert a == b, (where, a, b)


def main(comm, manifests, out_dir, algorithm):
    torch.set_num_threads(1)
    out = Path(out_dir)
    settings = dict(compression__algorithm=algorithm, compression__density=0.05, compression__warmup_steps=2,
                    train__epochs=2, train__global_batch_size=4 * comm.size, optim__lr=1e-3,
                    data__max_train_utterances=16 * comm.size, train__eval_every_epochs=1)
    full = run_training(tiny_overrides(manifests, out, "full", **settings), comm)
    run_training(tiny_overrides(manifests, out, "parts", **{**settings, "train__epochs": 1}), comm)
    resumed = run_training(tiny_overrides(manifests, out, "parts", **settings), comm,
                           resume=str(out / "parts" / "checkpoints" / "last.pt"))

    a = load_checkpoint(out / "full" / "checkpoints" / "last.pt")
    b = load_checkpoint(out / "parts" / "checkpoints" / "last.pt")
    mine_a, mine_b = a["ranks"][comm.rank], b["ranks"][comm.rank]
    assert mine_a["compressor"]["inner"]["residual"].abs().sum() > 0, "the residual should hold something after sparse steps"
    assert_same(mine_a["compressor"], mine_b["compressor"], f"rank {comm.rank} compressor")
    assert_same(mine_a["cum_bytes_recv"], mine_b["cum_bytes_recv"], "cum_bytes_recv")
    if comm.rank == 0:
        assert_same(a["model"], b["model"], "model")
        assert_same(a["progress"], b["progress"], "progress")
        la, lb = step_losses(out / "full"), step_losses(out / "parts")
        assert sorted(la) == sorted(lb) == list(range(1, 9)), (sorted(la), sorted(lb))
        for step in la:
            assert abs(la[step] - lb[step]) <= 1e-6 * abs(la[step]), (step, la[step], lb[step])
        assert_same(full, resumed, "dev/test results")
        print(f"{algorithm}: P={comm.size} resume == uninterrupted over {len(la)} steps", flush=True)


if __name__ == "__main__":
    comm = Communicator()
    run_or_abort(comm, main, comm, *sys.argv[1:4])
