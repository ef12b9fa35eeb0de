"""Sharded evaluation: every rank scores a disjoint share of the set, the error sums are allreduced.

Decoded by one or more decoders (sparse_asr/decoding; greedy unless told); corpus WER/CER and the mean per-utterance
WER from sparse_asr.training.scoring (DESIGN 7). Used by the trainer (dev every few epochs, test at the end) and by
evaluate.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sparse_asr.data.dataset import BucketingSampler, make_loader
from sparse_asr.decoding import GreedyDecoder
from sparse_asr.training.loss import ctc_loss_sum
from sparse_asr.training.scoring import ErrorCounts, word_errors


@dataclass
class EvalResult:
    summary: dict  # wer, cer, wer_utt_mean, loss (absent when undefined, never NaN), of the first decoder
    utterances: int
    decoder: str = "greedy"  # the first decoder's name
    by_decoder: dict = field(default_factory=dict)  # every decoder's name -> its summary
    rows: list = field(default_factory=list)  # (utt_id, word_edits, words, ref, hyp), all ranks, rank 0 only
    emissions: list = field(default_factory=list)  # (utt_id, (T, C) log-probs), the set's order, rank 0 only


@torch.no_grad()
def evaluate(model, dataset, comm, device, global_batch_size: int = 32, num_workers: int = 0,
             keep_rows: bool = False, keep_emissions: bool = False, decoders=None, progress=None) -> EvalResult:
    """Collective: every rank must call it. The model is put in eval mode and restored afterwards.
    decoders: a list of decoders (default: greedy alone), each scored; rows and `summary` are the first's.
    keep_rows=True gathers every utterance's (utt_id, edits, words, ref, hyp) on rank 0; keep_emissions=True
    every utterance's log-probabilities (training/emissions.py), in the set's order. progress(done, total), if
    given, is called after every batch with this rank's utterances times the ranks (an estimate of the set's)."""
    was_training = model.training
    model.eval()
    decoders = list(decoders or [GreedyDecoder()])
    batch_size = -(-global_batch_size // comm.size) * comm.size  # round up to a multiple of P
    sampler = BucketingSampler(dataset.durations, batch_size, comm.rank, comm.size, shuffle=False, drop_last=False)
    counts, rows, emissions, done = [ErrorCounts() for _ in decoders], [], [], 0
    for batch in make_loader(dataset, sampler, num_workers):
        batch = batch.to(device)
        log_probs, out_lengths = model(batch.features, batch.feature_lengths)
        loss = ctc_loss_sum(log_probs, out_lengths, batch.targets, batch.target_lengths)
        if keep_emissions:
            emissions += [(i, log_probs[: int(n), b].cpu()) for b, (i, n) in enumerate(zip(batch.indices, out_lengths))]
        for k, (decoder, tally) in enumerate(zip(decoders, counts)):
            tally.add_loss(float(loss), len(batch))
            for i, hyp in zip(batch.indices, decoder.decode(log_probs, out_lengths)):
                ref = dataset.transcripts[i]
                tally.add(ref, hyp)
                if keep_rows and k == 0:
                    rows.append((dataset.utt_ids[i], *word_errors(ref, hyp), ref, hyp))
        done += len(batch)
        if progress is not None:
            progress(min(done * comm.size, len(dataset)), len(dataset))
    model.train(was_training)
    summed = comm.allreduce_(torch.stack([tally.to_tensor() for tally in counts]))  # one reduction for all
    by_decoder = {d.name: ErrorCounts.from_tensor(row).summary() for d, row in zip(decoders, summed)}
    totals = ErrorCounts.from_tensor(summed[0])
    if keep_rows:
        gathered = comm.gather_object(rows, root=0)
        rows = [row for part in gathered for row in part] if comm.rank == 0 else []
    if keep_emissions:
        gathered = comm.gather_object(emissions, root=0)
        emissions = (sorted((pair for part in gathered for pair in part), key=lambda pair: pair[0])
                     if comm.rank == 0 else [])
        emissions = [(dataset.utt_ids[i], log_probs) for i, log_probs in emissions]
    return EvalResult(totals.summary(), totals.utts, decoders[0].name, by_decoder, rows, emissions)
