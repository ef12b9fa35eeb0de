"""DeepSpeech2-style acoustic model: 2 conv blocks -> stacked LSTMs -> lookahead -> per-frame classifier.

One `DeepSpeech` class serves every named variant; a `DeepSpeechSpec` says how wide/deep it is.
The paper model `lstman4` (DESIGN 5) is the default spec and has 27,569,568 parameters in 40 tensors:

    conv1  Conv2d(1->32, k=(41,11), s=(2,2), p=(20,5)) + bias      14,464  (2 tensors)
    bn     BatchNorm2d(32)                                              64  (2)
    conv2  Conv2d(32->32, k=(21,11), s=(2,1), p=(10,5)) + bias    236,576  (2)
    bn     BatchNorm2d(32)                                              64  (2)
    lstm1  LSTM(1312 -> 800), PyTorch layout: W_ih, W_hh, b_ih, b_hh  6,764,800  (4)
    lstm2-5 each: BatchNorm1d(1600 params) + LSTM(800 -> 800) 4 x 5,128,000  (4 x 6)
    lookahead depthwise Conv1d(800, 800, k=21, groups=800, no bias)  16,800  (1)
    BatchNorm1d(800) + Linear(800 -> 29, no bias)                  24,800  (3)

The first LSTM has no BatchNorm in front of it (as in deepspeech.pytorch's BatchRNN), the
LSTM keeps both PyTorch biases, and the lookahead weight is (800, 1, context + 1) with no bias;
with any of these different the count does not come out.

Padding: every sample's output depends only on its own frames. The input and the output of
each conv block are zeroed beyond the sample's length; a forward LSTM runs on the padded batch
(its output at t sees no later frame), a bidirectional one on packed sequences; the
sequence-wise BatchNorms run on the valid frames only (so in training their statistics
ignore padding); the lookahead sees zeros beyond each sample's end. Output positions at or
beyond `output_lengths` are padding (zeros) and must be ignored, as CTCLoss does.

BatchNorm: per-rank nn.BatchNorm by default; with `sync_bn=comm` every BatchNorm is a
SyncBatchNorm whose training statistics are those of all ranks' valid frames (sync_batchnorm.py).
The conv BatchNorm2d's training statistics include the padded time steps of the batch (each
rank pads to its own longest utterance), so the synchronized one is given the valid time steps
and ignores padding: then P ranks compute exactly what one process does on the whole global
batch, however its lengths are split. The per-rank one keeps its statistics as they always were.
"""
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from sparse_asr.models.sync_batchnorm import SyncBatchNorm

NUM_FREQ_BINS = 161  # n_fft 320 -> 161 spectrogram bins (DESIGN 6)


@dataclass(frozen=True)
class DeepSpeechSpec:
    conv_channels: tuple = (32, 32)  # output channels of conv1 and conv2
    rnn_layers: int = 5
    rnn_hidden: int = 800
    bidirectional: bool = False
    lookahead_context: int = 20  # future frames seen by the lookahead conv; 0 = no lookahead layer

    def __post_init__(self):
        if len(self.conv_channels) != 2 or min(self.conv_channels) < 1:
            raise ValueError(f"conv_channels must be two positive ints, got {self.conv_channels}")
        if self.rnn_layers < 1 or self.rnn_hidden < 1 or self.lookahead_context < 0:
            raise ValueError(f"bad DeepSpeechSpec {self}")


# (kernel, stride, padding) of the two conv layers, as (freq, time) pairs. Fixed by DESIGN 5.
CONV_GEOMETRY = (
    ((41, 11), (2, 2), (20, 5)),
    ((21, 11), (2, 1), (10, 5)),
)


def conv_output_size(size, kernel, stride, padding):
    """Output size of a Conv along one axis (works on ints and int64 tensors)."""
    return (size + 2 * padding - kernel) // stride + 1


def time_mask(x, lengths):
    """(B, 1, 1, T) mask of x (B, C, F, T): 1 at time steps < lengths[b], else 0."""
    steps = torch.arange(x.size(-1), device=x.device)
    keep = steps[None, :] < lengths[:, None]  # (B, T)
    return keep[:, None, None, :].to(x.dtype)


def mask_time(x, lengths):
    """Zero x (B, C, F, T) at time steps >= lengths[b]."""
    return x * time_mask(x, lengths)


def map_valid(module, x, valid):
    """A frame-wise module applied to the valid frames of x (T, B, H) alone (valid: (T, B) bool), zeros elsewhere.
    The frames are taken time-major, in batch order within a step: the order of a PackedSequence's data."""
    frames = module(x[valid])
    out = frames.new_zeros(*x.shape[:2], frames.size(-1))
    out[valid] = frames
    return out


def run_lstm(rnn, x, lengths):
    """An LSTM over x (T, B, H), zero past each sample's end -> (T, B, H'), valid where x is. A forward LSTM's
    output at t sees frames <= t only, so the padding after a sample's end changes nothing before it: it runs on
    the padded batch, one fused kernel per layer (oneDNN, cuDNN). PyTorch's packed path loops over time steps on a
    CPU, and its backward allocates the whole input's gradient at each (a training step 2.7x slower). The backward
    direction of a bidirectional LSTM must start at each sample's own end: packed."""
    if not rnn.bidirectional:
        return rnn(x)[0]  # past each end: values the caller ignores
    y, _ = rnn(pack_padded_sequence(x, lengths.cpu(), enforce_sorted=True))
    return pad_packed_sequence(y, total_length=x.size(0))[0]


class Lookahead(nn.Module):
    """Row convolution of DeepSpeech2: out[t] = sum_j w[:, j] * x[t + j], j = 0..context, per feature."""

    def __init__(self, features, context):
        super().__init__()
        self.context = context
        self.conv = nn.Conv1d(features, features, kernel_size=context + 1, groups=features, bias=False)

    def forward(self, x):  # x: (T, B, H), zero beyond each sample's length
        x = x.permute(1, 2, 0)  # (B, H, T)
        x = F.pad(x, (0, self.context))  # future frames past the end are zeros
        return self.conv(x).permute(2, 0, 1)  # (T, B, H)


class DeepSpeech(nn.Module):
    def __init__(self, spec: DeepSpeechSpec = DeepSpeechSpec(), num_classes: int = 29, sync_bn=None):
        """sync_bn: a Communicator to synchronize every BatchNorm over its ranks, or None (per-rank)."""
        super().__init__()
        self.spec = spec
        if sync_bn is None:
            norm1d, norm2d = nn.BatchNorm1d, nn.BatchNorm2d
        else:
            norm1d = norm2d = lambda features: SyncBatchNorm(features, sync_bn)
        c1, c2 = spec.conv_channels
        blocks = []
        for in_ch, out_ch, (kernel, stride, padding) in zip((1, c1), (c1, c2), CONV_GEOMETRY):
            blocks.append(nn.Sequential(
                nn.Conv2d(in_ch, out_ch, kernel_size=kernel, stride=stride, padding=padding),
                norm2d(out_ch),
                nn.Hardtanh(0, 20, inplace=True),
            ))
        self.conv_blocks = nn.ModuleList(blocks)

        freq = NUM_FREQ_BINS
        for kernel, stride, padding in CONV_GEOMETRY:
            freq = conv_output_size(freq, kernel[0], stride[0], padding[0])
        rnn_input = c2 * freq  # 32 * 41 = 1312 for lstman4

        directions = 2 if spec.bidirectional else 1
        rnn_output = spec.rnn_hidden * directions
        # Sequence-wise BatchNorm in front of every LSTM but the first.
        self.rnn_norms = nn.ModuleList(norm1d(rnn_output) for _ in range(spec.rnn_layers - 1))
        self.rnns = nn.ModuleList(
            nn.LSTM(rnn_input if i == 0 else rnn_output, spec.rnn_hidden, bidirectional=spec.bidirectional)
            for i in range(spec.rnn_layers)
        )
        self.lookahead = Lookahead(rnn_output, spec.lookahead_context) if spec.lookahead_context > 0 else None
        self.output_norm = norm1d(rnn_output)
        self.classifier = nn.Linear(rnn_output, num_classes, bias=False)

    def output_lengths(self, lengths):
        for kernel, stride, padding in CONV_GEOMETRY:
            lengths = conv_output_size(lengths, kernel[1], stride[1], padding[1])
        return lengths

    def forward(self, features, lengths):
        """features (B, 1, 161, T) float, lengths (B,) int64 sorted descending
        -> log_probs (T', B, num_classes) float32, output_lengths (B,) int64."""
        if features.dim() != 4 or features.size(1) != 1 or features.size(2) != NUM_FREQ_BINS:
            raise ValueError(f"features must be (B, 1, {NUM_FREQ_BINS}, T), got {tuple(features.shape)}")
        lengths = lengths.to(device=features.device, dtype=torch.int64)
        x = mask_time(features, lengths)  # the collate's padding value must not matter
        for block, (kernel, stride, padding) in zip(self.conv_blocks, CONV_GEOMETRY):
            conv, norm, activation = block
            x = conv(x)
            lengths = conv_output_size(lengths, kernel[1], stride[1], padding[1])
            x = norm(x, time_mask(x, lengths)) if isinstance(norm, SyncBatchNorm) else norm(x)
            x = mask_time(activation(x), lengths)

        batch, channels, freq, steps = x.shape
        x = x.view(batch, channels * freq, steps).permute(2, 0, 1)  # (T', B, C*F)
        valid = torch.arange(steps, device=x.device)[:, None] < lengths[None, :]  # (T', B)
        for i, rnn in enumerate(self.rnns):
            if i > 0:
                x = map_valid(self.rnn_norms[i - 1], x, valid)
            x = run_lstm(rnn, x, lengths)
        x = x.masked_fill(~valid[..., None], 0.0)  # (T', B, H), zeros past each end

        if self.lookahead is not None:
            x = F.hardtanh(self.lookahead(x), 0, 20)
        log_probs = map_valid(lambda frames: F.log_softmax(self.classifier(self.output_norm(frames)), dim=-1), x, valid)
        return log_probs.float(), lengths
