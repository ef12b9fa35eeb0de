"""Under mpiexec: a short real-AN4 training run per registered algorithm (dense and every sparse one).

    mpiexec -n P python -m tests.mpi.train_algorithms MANIFEST_DIR OUT_DIR EPOCHS UTTERANCES [--loss-must-fall]

Checks, for every algorithm: replicas stay bit-identical (the trainer's checksum every step, plus an
independent hash of all parameters at the end, compared over ranks); after the dense warm-up the
update is compressed (comm/dense 0, fewer bytes than dense; density well below 1 where it is set) and Ok-Topk's own
figures are logged (comm/oktopk/*); optionally the loss falls.
Once: a replica perturbed on the last rank is caught by training.replicas.check_replicas on every rank.
Any failure aborts the whole job (non-zero exit).
"""
import hashlib
import sys
from pathlib import Path

import torch

from sparse_asr.comm import Communicator
from sparse_asr.compression import COMPRESSORS
from tests.mpi.train_common import epoch_losses, read_metrics, tiny_overrides, train_and_keep
from sparse_asr.training.runtime import run_or_abort
from sparse_asr.training import replicas

WARMUP = 2


def parameter_hash(trainer) -> str:
    return hashlib.sha256(torch.cat([p.detach().flatten() for p in trainer.params]).numpy().tobytes()).hexdigest()


def main(comm, manifests, out_dir, epochs, utterances, loss_must_fall):
    torch.set_num_threads(1)
    P = comm.size
    for algorithm in sorted(COMPRESSORS):
        name = f"{algorithm}-p{P}"
        trainer = train_and_keep(tiny_overrides(manifests, out_dir, name, compression__algorithm=algorithm,
                                    compression__density=0.05, compression__warmup_steps=WARMUP,
                                    train__epochs=epochs, train__global_batch_size=4 * P,
                                    data__max_train_utterances=utterances, train__eval_every_epochs=0,
                                    data__test_manifest="''", optim__lr=1e-3), comm)
        hashes = comm.allgather_object(parameter_hash(trainer))
        assert len(set(hashes)) == 1, f"{algorithm}: replicas differ after training: {hashes}"
        if comm.rank == 0:
            metrics = [m for m in read_metrics(Path(out_dir) / name) if m["kind"] == "train"]
            assert len(metrics) == epochs * utterances // (4 * P), (algorithm, len(metrics))
            for m in metrics[WARMUP:] if algorithm != "dense" else []:
                assert m["comm/dense"] == 0.0, (algorithm, m)
                if COMPRESSORS[algorithm].uses_density:  # (the quantized exchanges send every entry, in fewer bits)
                    assert m["comm/density"] < 0.25, (algorithm, m)
                if P > 1:
                    assert m["comm/compression_ratio"] > 1.0, (algorithm, m)
                if algorithm == "oktopk":  # the compressor's own StepStats.extra reach the log too
                    assert m["comm/oktopk/local_count"] > 0 and m["comm/oktopk/global_count"] > 0, m
            losses = epoch_losses(Path(out_dir) / name)
            if loss_must_fall:
                assert losses[-1] < 0.9 * losses[0], f"{algorithm}: loss did not fall: {losses}"
            print(f"{algorithm}: P={P} epoch losses {[round(x, 2) for x in losses]}, replicas identical", flush=True)

    with torch.no_grad():  # a perturbed replica must be caught, on every rank
        trainer.params[0].view(-1)[0] += 1e-3 if comm.rank == P - 1 else 0.0
    try:
        replicas.check_replicas(comm, trainer.params, trainer.progress.step)
        caught = P == 1
    except RuntimeError as e:
        caught = "replicas differ" in str(e)
    assert caught, "check_replicas missed a perturbed replica"


if __name__ == "__main__":
    comm = Communicator()
    args = sys.argv[1:]
    run_or_abort(comm, main, comm, args[0], args[1], int(args[2]), int(args[3]), "--loss-must-fall" in args)
