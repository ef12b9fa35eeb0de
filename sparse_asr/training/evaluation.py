"""Sharded evaluation: every rank scores a disjoint share of the set, the error sums are allreduced.

Greedy CTC decoding; corpus WER/CER and the mean per-utterance WER from sparse_asr.training.scoring (DESIGN 7).
Used by the trainer (dev every few epochs, test at the end) and by evaluate.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sparse_asr.data.dataset import BucketingSampler, make_loader
from sparse_asr.data.text import greedy_decode
from sparse_asr.training.loss import ctc_loss_sum
from sparse_asr.training.scoring import ErrorCounts, word_errors


@dataclass
class EvalResult:
    summary: dict  # wer, cer, wer_utt_mean, loss (absent when undefined, never NaN)
    utterances: int
    rows: list = field(default_factory=list)  # (utt_id, word_edits, words, ref, hyp), all ranks, rank 0 only
    emissions: list = field(default_factory=list)  # (utt_id, (T, C) log-probs), the set's order, rank 0 only


@torch.no_grad()
def evaluate(model, dataset, comm, device, global_batch_size: int = 32, num_workers: int = 0,
             keep_rows: bool = False, keep_emissions: bool = False) -> EvalResult:
    """Collective: every rank must call it. The model is put in eval mode and restored afterwards.
    keep_rows=True gathers every utterance's (utt_id, edits, words, ref, hyp) on rank 0; keep_emissions=True
    every utterance's log-probabilities (training/emissions.py), in the set's order."""
    was_training = model.training
    model.eval()
    batch_size = -(-global_batch_size // comm.size) * comm.size  # round up to a multiple of P
    sampler = BucketingSampler(dataset.durations, batch_size, comm.rank, comm.size, shuffle=False, drop_last=False)
    counts, rows, emissions = ErrorCounts(), [], []
    for batch in make_loader(dataset, sampler, num_workers):
        batch = batch.to(device)
        log_probs, out_lengths = model(batch.features, batch.feature_lengths)
        loss = ctc_loss_sum(log_probs, out_lengths, batch.targets, batch.target_lengths)
        counts.add_loss(float(loss), len(batch))
        if keep_emissions:
            emissions += [(i, log_probs[: int(n), b].cpu()) for b, (i, n) in enumerate(zip(batch.indices, out_lengths))]
        for i, hyp in zip(batch.indices, greedy_decode(log_probs, out_lengths)):
            ref = dataset.transcripts[i]
            counts.add(ref, hyp)
            if keep_rows:
                rows.append((dataset.utt_ids[i], *word_errors(ref, hyp), ref, hyp))
    model.train(was_training)
    totals = ErrorCounts.from_tensor(comm.allreduce_(counts.to_tensor()))
    if keep_rows:
        gathered = comm.gather_object(rows, root=0)
        rows = [row for part in gathered for row in part] if comm.rank == 0 else []
    if keep_emissions:
        gathered = comm.gather_object(emissions, root=0)
        emissions = (sorted((pair for part in gathered for pair in part), key=lambda pair: pair[0])
                     if comm.rank == 0 else [])
        emissions = [(dataset.utt_ids[i], log_probs) for i, log_probs in emissions]
    return EvalResult(totals.summary(), totals.utts, rows, emissions)
