"""Forward+backward time of each model variant on CPU for one batch of 3-second utterances.

    OMP_NUM_THREADS=1 .venv/bin/python bench/model_speed.py [--threads 1] [--batch 16] [--frames 300]

Prints: variant, parameters, seconds per fwd+bwd (median of --repeats after one warm-up), threads.
Inputs are random features of real shape (161 bins x 300 frames = 3 s at hop 10 ms) with random
label sequences, trained with the CTC loss the trainer uses.
"""
import argparse
import statistics
import time

import torch

from sparse_asr.comm import Communicator
from sparse_asr.models import MODELS, build_model
from sparse_asr.training.launch import setup_process
from sparse_asr.training.loss import ctc_loss_sum


def time_fwd_bwd(name, batch, frames, repeats, seed=0):
    generator = torch.Generator().manual_seed(seed)
    model = build_model(name).train()
    features = torch.randn(batch, 1, 161, frames, generator=generator)
    lengths = torch.full((batch,), frames, dtype=torch.int64)
    targets = torch.randint(1, 29, (batch, 30), generator=generator)
    target_lengths = torch.full((batch,), 30, dtype=torch.int64)
    seconds = []
    for _ in range(repeats + 1):  # the first pass warms up allocators and kernels
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        log_probs, out_lengths = model(features, lengths)
        loss = ctc_loss_sum(log_probs, out_lengths, targets, target_lengths) / batch
        loss.backward()
        seconds.append(time.perf_counter() - start)
    params = sum(p.numel() for p in model.parameters())
    return params, statistics.median(seconds[1:])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="*", default=list(MODELS), help="model names (default: all)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--frames", type=int, default=300, help="time frames per utterance (100 per second)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()
    setup_process(Communicator(), "cpu", threads=args.threads)

    from sparse_asr.training.runtime import cpu_model

    print(f"{cpu_model()}: batch {args.batch} x {args.frames} frames, fwd+bwd, median of {args.repeats}")
    print(f"{'variant':<20} {'parameters':>12} {'sec/batch':>10} {'threads':>8}")
    for name in args.variants:
        params, seconds = time_fwd_bwd(name, args.batch, args.frames, args.repeats)
        print(f"{name:<20} {params:>12,} {seconds:>10.3f} {torch.get_num_threads():>8}", flush=True)


if __name__ == "__main__":
    main()
