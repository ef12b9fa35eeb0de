"""Under mpiexec: a job that dies mid-epoch and is resumed from its run directory continues exactly
like an uninterrupted run, with every rank's own state (compressor residuals and thresholds,
BatchNorm statistics) taken from its own shard of the checkpoint.

    mpiexec -n P python -m tests.mpi.train_resume MANIFEST_DIR OUT_DIR ALGORITHM [MEMORY]

MEMORY dgc or ef21: DGC's memory (momentum and velocity per rank) or EF21-SGDM's (momentum, rank estimate, global
estimate) behind a density warm-up over the first epoch instead of dense warm-up steps; the crash then falls in the
second epoch's schedule.

'full' trains 2 epochs (4 steps each) with a checkpoint every 3 steps; 'crashed' is the same run, but
every rank raises after step 7, one step after the mid-epoch checkpoint of step 6 (whose BatchNorm
statistics differ between ranks); it is then resumed with `--resume RUN_DIR` and its own config.
Every rank compares its state in both final checkpoints; rank 0 the per-step losses, dev/test results
and metrics.jsonl (one row per kind and step). With P > 1, resuming a copy whose rank1.pt has one
flipped byte is refused on every rank naming that file, and leaves the copy unchanged.
"""
import shutil
import sys
from pathlib import Path

import torch

from sparse_asr.comm import Communicator
from sparse_asr.training.checkpoint import CheckpointError, load_training_state
from sparse_asr.training.runtime import run_or_abort
from sparse_asr.training.trainer import Trainer
from tests.mpi.train_common import (assert_one_row_per_kind_and_step, flip_byte, read_metrics, run_training,
                                   step_losses, tiny_overrides, tree_digest)


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


def crash_after_step_7(original):
    def train_step(self, batch):
        if self.progress.step == 7:  # every rank, as when the job is killed
            raise RuntimeError("simulated crash")
        return original(self, batch)
    return train_step


def main(comm, manifests, out_dir, algorithm, memory="residual"):
    torch.set_num_threads(1)
    out = Path(out_dir)
    settings = dict(compression__algorithm=algorithm, compression__density=0.05, compression__warmup_steps=2,
                    train__epochs=2, train__global_batch_size=4 * comm.size, optim__lr=1e-3,
                    data__max_train_utterances=16 * comm.size, train__eval_every_epochs=1,
                    train__checkpoint_every_steps=3)
    if memory != "residual":  # a memory that carries the momentum: no dense steps
        settings.update(compression__memory=memory, compression__warmup_steps=0, compression__density_warmup_epochs=1)
    full = run_training(tiny_overrides(manifests, out, "full", **settings), comm)

    original = Trainer.train_step
    Trainer.train_step = crash_after_step_7(original)
    try:
        run_training(tiny_overrides(manifests, out, "crashed", **settings), comm)
        raise AssertionError("the crashed run did not crash")
    except RuntimeError as e:
        assert "simulated crash" in str(e), e
    finally:
        Trainer.train_step = original
    crashed = out / "crashed"
    mid = load_training_state(comm, crashed)
    assert (mid.progress.step, mid.progress.epoch, mid.progress.batch_in_epoch) == (6, 1, 2), mid.progress
    bn_sums = comm.allgather_object(sum(float(v.double().sum()) for v in mid.mine.buffers.values()))
    if comm.size > 1:  # what makes the order of broadcast and restore matter
        assert len(set(bn_sums)) == comm.size, f"mid-epoch BatchNorm statistics should differ per rank: {bn_sums}"
    resumed = run_training([], comm, resume=str(crashed), config=None)

    a, b = load_training_state(comm, out / "full"), load_training_state(comm, crashed)
    state = a.mine.compressor.get("inner", a.mine.compressor)  # (inside the dense warm-up's state)
    owed = state["memory"][{"residual": "residual", "dgc": "velocity", "ef21": "difference"}[memory]] \
        if "memory" in state else state["worker_error"]  # a selection's memory, or the 1-bit exchange's errors
    assert owed.abs().sum() > 0, "nothing owed after sparse steps"
    assert_same(a.mine.compressor, b.mine.compressor, f"rank {comm.rank} compressor")
    assert_same(a.mine.buffers, b.mine.buffers, f"rank {comm.rank} BatchNorm statistics")
    assert_same(a.mine.meter, b.mine.meter, "the meter's counters")
    assert_same(a.model, b.model, "model")
    assert_same(a.optimizer, b.optimizer, "optimizer")
    assert_same(vars(a.progress), vars(b.progress), "progress")
    assert_same(full, resumed, "dev/test results")
    if comm.rank == 0:
        la, lb = step_losses(out / "full"), step_losses(crashed)
        assert sorted(la) == sorted(lb) == list(range(1, 9)), (sorted(la), sorted(lb))
        for step in la:
            assert abs(la[step] - lb[step]) <= 1e-6 * abs(la[step]), (step, la[step], lb[step])
        assert_one_row_per_kind_and_step(crashed)
        assert len(read_metrics(crashed)) == len(read_metrics(out / "full"))
        if memory != "residual":  # target 0.05^(1/2) in epoch 0, then 0.05 (TopkA's union holds up to P times k)
            density = {r["epoch"]: r["comm/density"] for r in read_metrics(crashed) if r["kind"] == "train"}
            assert density[0] > 2.5 * density[1] and density[1] <= 0.05 * comm.size, density
        print(f"{algorithm} {memory}: P={comm.size} resume after a mid-epoch crash == uninterrupted over {len(la)} "
              f"steps (dev {resumed['dev']['loss']:.6f}, test {resumed['test']['loss']:.6f})", flush=True)

    if comm.size > 1 and memory == "residual":  # (the files are checked alike whatever they hold)
        copy = out / "corrupt"
        if comm.rank == 0:
            shutil.copytree(crashed, copy, symlinks=True)
            flip_byte(copy / "checkpoints" / "last" / "rank1.pt")
        comm.barrier()
        before = tree_digest(copy) if comm.rank == 0 else None
        try:
            run_training(["train.epochs=3"], comm, resume=str(copy), config=None)
            raise AssertionError("a corrupted shard was accepted")
        except CheckpointError as e:
            assert "rank1.pt is corrupted" in str(e), e
        comm.barrier()
        if comm.rank == 0:
            assert tree_digest(copy) == before
            print(f"P={comm.size}: a flipped byte in rank1.pt is refused on every rank; run directory unchanged",
                  flush=True)


if __name__ == "__main__":
    comm = Communicator()
    run_or_abort(comm, main, comm, *sys.argv[1:5])
