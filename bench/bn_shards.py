"""How much per-rank BatchNorm statistics change the gradient of data-parallel training.

    .venv/bin/python bench/bn_shards.py [--model lstman4_small] [--global-batch 16] [--ranks 1 2 4 8]

With P ranks each rank normalises with the statistics of its own global_batch/P utterances, so
the averaged gradient of dense data parallelism is not the gradient of the whole global batch
(as it would be without BatchNorm). For one real AN4 global batch and the untrained model, this
prints, per P, the cosine similarity and norm ratio between the mean of the P shard gradients
and the whole-batch gradient (P = 1 is the reference: cosine 1). Single process, no MPI: the
shards are computed one after another, exactly as P ranks would.
"""
import argparse
import sys
from pathlib import Path

import torch

from sparse_asr.data.dataset import BucketingSampler, SpeechDataset, collate
from sparse_asr.models import build_model


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="lstman4_small")
    parser.add_argument("--manifest", default="manifests/an4_train.csv")
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    dataset = SpeechDataset(args.manifest)
    sampler = BucketingSampler(dataset.durations, args.global_batch, seed=args.seed)
    batches = sampler.global_batches()
    batch = batches[len(batches) // 2].tolist()  # a median-length global batch
    model = build_model(args.model)
    loss_fn = torch.nn.CTCLoss(blank=0, reduction="sum", zero_infinity=True)

    def gradient(ids: list[int]) -> torch.Tensor:
        model.zero_grad()
        b = collate([dataset[i] for i in ids])
        log_probs, out_lengths = model(b.features, b.feature_lengths)
        (loss_fn(log_probs, b.targets, out_lengths, b.target_lengths) / len(b)).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    whole = gradient(batch)
    print(f"{args.model}, one global batch of {len(batch)} AN4 utterances, untrained model (train mode)\n")
    print("| P | utterances per rank | cosine(mean of shard gradients, whole-batch gradient) | norm ratio |")
    print("|---|---|---|---|")
    for P in args.ranks:
        if len(batch) % P:
            continue
        per = len(batch) // P
        mean = sum(gradient(batch[r * per:(r + 1) * per]) for r in range(P)) / P
        cosine = torch.nn.functional.cosine_similarity(mean, whole, dim=0).item()
        print(f"| {P} | {per} | {cosine:.3f} | {mean.norm().item() / whole.norm().item():.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
