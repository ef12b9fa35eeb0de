"""How per-rank BatchNorm statistics change the gradient of data-parallel training, and what
synchronized BatchNorm (model.sync_batchnorm) does about it.

    .venv/bin/mpiexec -n 8 .venv/bin/python bench/bn_shards.py [--model lstman4_small] [--global-batch 16] \
        [--ranks 1 2 4 8]

With P ranks each rank normalises with the statistics of its own global_batch/P utterances, so
the averaged gradient of dense data parallelism is not the gradient of the whole global batch
(as it would be without BatchNorm). For one real AN4 global batch and the untrained model, per P:
  per-rank: cosine similarity and norm ratio between the mean of the P shard gradients and the
      whole-batch gradient (the shards computed one after another on rank 0, exactly as P ranks
      would; P = 1 is the reference: cosine 1);
  synchronized: the same for P real ranks (the first P of this job) with synchronized BatchNorm,
      after the trainer's dense allreduce average, against one process with synchronized
      BatchNorm on the whole batch (whose conv BatchNorm ignores padded steps; how much that
      alone changes the gradient is printed above the table).
Needs as many MPI ranks as the largest P.
"""
import argparse
import sys

import torch

from sparse_asr.comm import Communicator
from sparse_asr.compression.dense import DenseAllreduce
from sparse_asr.data.dataset import BucketingSampler, SpeechDataset, collate
from sparse_asr.models import build_model
from sparse_asr.training.launch import setup_process
from sparse_asr.training.loss import batch_loss


def gradient(model, dataset, ids: list[int]) -> torch.Tensor:
    """The trainer's loss (CTC sum / batch size) on these utterances -> the flat gradient."""
    model.zero_grad()
    b = collate([dataset[i] for i in ids])
    log_probs, out_lengths = model(b.features, b.feature_lengths)
    batch_loss(log_probs, out_lengths, b).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def compare(got: torch.Tensor, whole: torch.Tensor) -> str:
    """'cosine | norm ratio' (float64: float32's cosine of long vectors can exceed 1)."""
    got, whole = got.double(), whole.double()
    cosine = torch.nn.functional.cosine_similarity(got, whole, dim=0).item()
    return f"{cosine:.4f} | {got.norm().item() / whole.norm().item():.4f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="lstman4_small")
    parser.add_argument("--manifest", default="manifests/an4_train.csv")
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    world = Communicator()
    ranks = [P for P in args.ranks if args.global_batch % P == 0]
    if world.size < max(ranks):
        if world.rank == 0:
            print(f"bn_shards: run with mpiexec -n {max(ranks)} (the largest P), not {world.size}", file=sys.stderr)
        return 2
    setup_process(world, "cpu", threads=1)
    torch.manual_seed(args.seed)  # the same initial model on every rank
    dataset = SpeechDataset(args.manifest)
    sampler = BucketingSampler(dataset.durations, args.global_batch, seed=args.seed)
    batches = sampler.global_batches()
    batch = batches[len(batches) // 2].tolist()  # a median-length global batch
    model = build_model(args.model)
    state = {k: v.clone() for k, v in model.state_dict().items()}

    def synced_model(comm):
        synced = build_model(args.model, sync_bn=comm)
        synced.load_state_dict(state)
        return synced

    lines, one = [], world.split(1)
    if world.rank == 0:
        whole = gradient(model, dataset, batch)
        synced_whole = gradient(synced_model(one), dataset, batch)
        lines = [f"{args.model}, one global batch of {len(batch)} AN4 utterances, untrained model (train mode)",
                 f"synchronized BatchNorm in one process vs per-rank BatchNorm in one process (the conv BatchNorm "
                 f"ignoring padded steps): cosine | norm ratio {compare(synced_whole, whole)}", "",
                 "| P | utterances per rank | per-rank BatchNorm: cosine(mean of shard gradients, "
                 "whole-batch gradient) | norm ratio | synchronized BatchNorm: cosine(averaged gradient, "
                 "whole-batch gradient) | norm ratio |",
                 "|---|---|---|---|---|---|"]
    for P in ranks:
        per = len(batch) // P
        shards = [batch[r * per:(r + 1) * per] for r in range(P)]
        comm = world.split(P)
        if comm is None:
            continue
        synced = gradient(synced_model(comm), dataset, shards[comm.rank])
        DenseAllreduce(comm, synced.numel()).step(synced)
        if comm.rank == 0:
            per_rank = sum(gradient(model, dataset, shard) for shard in shards) / P
            lines.append(f"| {P} | {per} | {compare(per_rank, whole)} | {compare(synced, synced_whole)} |")
    if world.rank == 0:
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
