import pytest
import torch

from sparse_asr.models import MODELS, build_model
from sparse_asr.models.deepspeech import DeepSpeech, DeepSpeechSpec
from tests.batchnorm_reference import randomize_batchnorms

pytestmark = pytest.mark.unit

torch.set_num_threads(1)


def test_lstman4_parameter_count_and_tensors():
    model = build_model("lstman4")
    params = list(model.parameters())
    assert len(params) == 40
    assert sum(p.numel() for p in params) == 27_569_568
    assert all(p.requires_grad for p in params)
    # The trainer puts all gradients in one flat buffer: parameters must not share storage,
    # and no buffer may require grad.
    assert len({p.data_ptr() for p in params}) == len(params)
    assert not any(b.requires_grad for b in model.buffers())
    # DESIGN 5 shapes of the layers that decide the count.
    assert model.rnns[0].input_size == 32 * 41 and model.rnns[0].hidden_size == 800
    assert len(model.rnns) == 5 and len(model.rnn_norms) == 4
    assert tuple(model.lookahead.conv.weight.shape) == (800, 1, 21)
    assert tuple(model.classifier.weight.shape) == (29, 800) and model.classifier.bias is None


def test_unknown_model_name_lists_known_ones():
    with pytest.raises(ValueError) as error:
        build_model("lstman5")
    for name in MODELS:
        assert name in str(error.value)


def test_every_variant_builds_and_runs():
    features = torch.randn(2, 1, 161, 40)
    lengths = torch.tensor([40, 25])
    for name in MODELS:
        model = build_model(name).eval()
        log_probs, out_lengths = model(features, lengths)
        assert log_probs.shape == (20, 2, 29), name
        assert out_lengths.tolist() == [20, 13], name


def reference_output_length(length):
    """Time length after the two convs, computed with real Conv2d layers on a zero input."""
    x = torch.zeros(1, 1, 1, length)
    x = torch.nn.Conv2d(1, 1, kernel_size=(1, 11), stride=(1, 2), padding=(0, 5))(x)
    x = torch.nn.Conv2d(1, 1, kernel_size=(1, 11), stride=(1, 1), padding=(0, 5))(x)
    return x.shape[-1]


def test_lstman4_output_shapes_and_lengths():
    model = build_model("lstman4").eval()
    lengths = torch.tensor([121, 120, 77, 31, 1], dtype=torch.int64)
    features = torch.randn(len(lengths), 1, 161, 121)
    with torch.no_grad():
        log_probs, out_lengths = model(features, lengths)
    expected = [reference_output_length(int(n)) for n in lengths]
    assert expected == [61, 60, 39, 16, 1]
    assert out_lengths.dtype == torch.int64 and out_lengths.tolist() == expected
    assert log_probs.dtype == torch.float32 and log_probs.shape == (61, len(lengths), 29)
    # log_softmax over classes within each sample's length; padding positions are zero.
    for b, n in enumerate(expected):
        assert torch.allclose(log_probs[:n, b].logsumexp(-1), torch.zeros(n), atol=1e-5)
        assert torch.all(log_probs[n:, b] == 0)


@pytest.mark.parametrize("name", ["lstman4", "lstman4_small_bi", "lstman4_tiny"])
def test_padding_does_not_change_a_samples_output(name):
    torch.manual_seed(0)
    model = build_model(name)
    randomize_batchnorms(model, seed=1)
    model.eval()
    short = torch.randn(1, 1, 161, 57)
    long = torch.randn(1, 1, 161, 90)
    with torch.no_grad():
        alone, alone_lengths = model(short, torch.tensor([57]))
        # Batch with a longer sample; the short one's padding is garbage, not zeros.
        padded_short = torch.cat([short, 100 * torch.randn(1, 1, 161, 33)], dim=-1)
        batch, batch_lengths = model(torch.cat([long, padded_short]), torch.tensor([90, 57]))
    n = int(alone_lengths[0])
    assert batch_lengths[1] == n == alone.shape[0]
    assert batch.shape[0] > n
    assert torch.allclose(batch[:n, 1], alone[:, 0], atol=1e-5, rtol=1e-5), \
        (batch[:n, 1] - alone[:, 0]).abs().max()


def packed_reference_forward(model, features, lengths):
    """The model's forward with every LSTM on packed sequences and every sequence-wise BatchNorm on the packed
    frames (PyTorch's own handling of variable lengths), written out here: the model must compute the same."""
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    from sparse_asr.models.deepspeech import CONV_GEOMETRY, conv_output_size, mask_time

    x = mask_time(features, lengths)
    for (conv, norm, activation), (kernel, stride, padding) in zip(model.conv_blocks, CONV_GEOMETRY):
        lengths = conv_output_size(lengths, kernel[1], stride[1], padding[1])
        x = mask_time(activation(norm(conv(x))), lengths)
    batch, channels, freq, steps = x.shape
    x = pack_padded_sequence(x.view(batch, channels * freq, steps).permute(2, 0, 1), lengths)
    for i, rnn in enumerate(model.rnns):
        if i > 0:
            x = x._replace(data=model.rnn_norms[i - 1](x.data))
        x, _ = rnn(x)
    x, _ = pad_packed_sequence(x, total_length=steps)
    if model.lookahead is not None:
        x = torch.nn.functional.hardtanh(model.lookahead(x), 0, 20)
    x = pack_padded_sequence(x, lengths)
    x = x._replace(data=torch.log_softmax(model.classifier(model.output_norm(x.data)), dim=-1))
    return pad_packed_sequence(x, total_length=steps)[0]


@pytest.mark.parametrize("name", ["lstman4_small", "lstman4_small_bi", "lstman4_tiny"])
def test_training_forward_and_gradient_equal_the_packed_computation(name):
    """In training mode (BatchNorm on the batch's valid frames), with garbage in the padding: the output and
    every parameter's gradient equal those of the packed reference.

    The output is compared in float32, the kernels training runs. The gradients are compared in float64: the
    lookahead's Hardtanh has a kink at 0, a few of its inputs lie within float32 rounding of it, and where the
    two paths' roundings put one on opposite sides each path takes a different valid subgradient (up to 1.9% of
    the gradient's scale, seen with oneDNN limited to AVX2). In float64 that takes an input within 1e-15 of 0."""
    torch.manual_seed(0)
    model = build_model(name).train()
    randomize_batchnorms(model, seed=1)
    lengths = torch.tensor([90, 71, 57, 40])
    features = torch.randn(len(lengths), 1, 161, 90)
    for b, n in enumerate(lengths):
        features[b, :, :, n:] = 100 * torch.randn(1, 161, 90 - int(n))
    with torch.no_grad():
        ours, reference = model(features, lengths)[0], packed_reference_forward(model, features, lengths)
    assert torch.allclose(ours, reference, atol=1e-5, rtol=1e-5), (ours - reference).abs().max()

    model.double()
    features = features.double()
    # A loss that weighs every output, its weights exact in float32: the model returns float32 log-probabilities.
    targets = torch.randn(ours.shape).double()
    gradients = []
    for forward in (lambda: model(features, lengths)[0], lambda: packed_reference_forward(model, features, lengths)):
        model.zero_grad()
        (forward().double() * targets).sum().backward()
        gradients.append([p.grad.clone() for p in model.parameters()])
    our_grads, reference_grads = gradients
    # A bias in front of a training BatchNorm has a true gradient of 0 (its rounding noise is all there is): each
    # tensor is held to the scale of the whole gradient.
    scale = max(float(r.abs().max()) for r in reference_grads)
    for (pname, _), g, r in zip(model.named_parameters(), our_grads, reference_grads):
        assert float((g - r).abs().max()) <= 1e-10 * scale, (pname, (g - r).abs().max(), scale)


def test_gradients_accumulate_into_one_flat_buffer():
    model = build_model("lstman4_tiny")
    params = list(model.parameters())
    flat = torch.zeros(sum(p.numel() for p in params))
    offset = 0
    for p in params:
        p.grad = flat[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    log_probs, out_lengths = model(torch.randn(2, 1, 161, 50), torch.tensor([50, 42]))
    log_probs.sum().backward()
    assert flat.abs().sum() > 0
    offset = 0
    for p in params:  # every .grad is still the view, and holds the gradient
        assert p.grad.data_ptr() == flat[offset:].data_ptr()
        offset += p.numel()


def test_tiny_model_overfits_two_utterances_with_ctc():
    torch.manual_seed(0)
    model = build_model("lstman4_tiny").train()
    # Two real-shaped utterances: 161 bins x ~2 s, normalised features, 12- and 9-character transcripts.
    features = torch.zeros(2, 1, 161, 200)
    features[0, :, :, :200] = torch.randn(1, 161, 200)
    features[1, :, :, :170] = torch.randn(1, 161, 170)
    lengths = torch.tensor([200, 170])
    targets = torch.randint(1, 29, (2, 12))
    target_lengths = torch.tensor([12, 9])
    ctc = torch.nn.CTCLoss(blank=0, reduction="sum", zero_infinity=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        optimizer.zero_grad()
        log_probs, out_lengths = model(features, lengths)
        loss = ctc(log_probs, targets, out_lengths, target_lengths) / 2
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.05 * losses[0], losses
    # Memorised: greedy CTC decoding (collapse repeats, drop blanks) gives back the targets.
    # (Still in train mode: 30 steps are too few for the BatchNorm running statistics.)
    with torch.no_grad():
        log_probs, out_lengths = model(features, lengths)
    for b in range(2):
        best = log_probs[:out_lengths[b], b].argmax(-1).tolist()
        decoded = [c for i, c in enumerate(best) if c != 0 and (i == 0 or c != best[i - 1])]
        assert decoded == targets[b, :target_lengths[b]].tolist()


def test_spec_validation():
    with pytest.raises(ValueError):
        DeepSpeechSpec(conv_channels=(8,))
    with pytest.raises(ValueError):
        DeepSpeechSpec(rnn_layers=0)
    with pytest.raises(ValueError, match="features must be"):
        DeepSpeech(MODELS["lstman4_tiny"])(torch.zeros(1, 161, 10), torch.tensor([10]))
