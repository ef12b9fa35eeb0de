"""Model registry: build_model(name, sync_bn=comm or None) -> DeepSpeech with that name's spec."""
import torch

from sparse_asr.models.deepspeech import DeepSpeech, DeepSpeechSpec

MODELS = {
    # The paper's model (DESIGN 5): 27,569,568 parameters in 40 tensors.
    "lstman4": DeepSpeechSpec(),
    # CPU training runs: thin convs (conv2 dominates CPU time at 32 channels), 3 LSTM layers of 256.
    "lstman4_small": DeepSpeechSpec(conv_channels=(8, 8), rnn_layers=3, rnn_hidden=256, lookahead_context=20),
    # Bidirectional CPU variant (no lookahead: the backward direction already sees the future).
    "lstman4_small_bi": DeepSpeechSpec(conv_channels=(8, 8), rnn_layers=3, rnn_hidden=160, bidirectional=True,
                                       lookahead_context=0),
    # Tests and smoke runs: seconds per step.
    "lstman4_tiny": DeepSpeechSpec(conv_channels=(4, 4), rnn_layers=2, rnn_hidden=48, lookahead_context=4),
}


def build_model(name: str, num_classes: int = 29, sync_bn=None) -> DeepSpeech:
    """sync_bn: a Communicator to synchronize every BatchNorm over its ranks (None = per-rank BatchNorm)."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(sorted(MODELS))}")
    return DeepSpeech(MODELS[name], num_classes=num_classes, sync_bn=sync_bn)


def model_with_numel(numel: int) -> tuple[str, list[torch.Size]] | None:
    """(name, parameter shapes) of the registered model with exactly `numel` parameters, else None: the
    benchmarks that take a gradient size (lstman4: 27,569,568) give per-tensor algorithms its real shapes."""
    for name in MODELS:
        shapes = [p.shape for p in build_model(name).parameters()]
        if sum(s.numel() for s in shapes) == numel:
            return name, shapes
    return None
