"""The training loss, in one place for the trainer, the evaluation and every bench (they must measure what
training optimises): CTC with the blank label, summed over the batch's utterances; the trainer and the
gradient benches divide by the number of utterances. zero_infinity: an utterance whose labels the output
frames cannot align counts as 0 instead of inf (start-up warns about such utterances by name)."""
from __future__ import annotations

import torch

from sparse_asr.data.text import BLANK

_CTC = torch.nn.CTCLoss(blank=BLANK, reduction="sum", zero_infinity=True)


def ctc_loss_sum(log_probs: torch.Tensor, output_lengths: torch.Tensor, targets: torch.Tensor,
                 target_lengths: torch.Tensor) -> torch.Tensor:
    """CTC loss summed over the utterances (log_probs (T, N, C), any float dtype: computed in float32)."""
    return _CTC(log_probs.float(), targets, output_lengths, target_lengths)


def batch_loss(log_probs: torch.Tensor, output_lengths: torch.Tensor, batch) -> torch.Tensor:
    """The training loss of a collated batch: CTC summed over its utterances / their number."""
    return ctc_loss_sum(log_probs, output_lengths, batch.targets, batch.target_lengths) / len(batch)
