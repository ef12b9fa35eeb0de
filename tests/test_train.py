"""Single-process training on real AN4 utterances with the tiny model: end-to-end smoke, logging,
the flat gradient buffer, non-finite steps, evaluate.py."""
import copy
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import evaluate
from sparse_asr.data.dataset import BucketingSampler, SpeechDataset, collate
from sparse_asr.data.manifest import read_manifest, write_manifest
from sparse_asr.models import build_model
from tests.mpi.train_common import epoch_losses, read_metrics, run_training, step_losses, tiny_overrides
from sparse_asr.training.config import OptimConfig
from sparse_asr.training.optim import MomentumSGD, attach_flat_grad, learning_rate
from sparse_asr.training.runtime import precision_problem
from sparse_asr.training.trainer import Trainer
from tests.conftest import REPO

TRAIN_TAGS = ["train/loss", "train/lr", "train/grad_norm", "train/samples_per_sec"]
COMM_TAGS = ["comm/density", "comm/bytes_sent", "comm/bytes_recv", "comm/bytes_recv_max", "comm/cum_bytes_recv",
             "comm/compression_ratio", "comm/dense"]
TIME_TAGS = ["time/compute", "time/selection", "time/communication", "time/step"]
EVAL_TAGS = ["dev/wer", "dev/cer", "dev/wer_utt_mean", "dev/loss", "test/wer", "test/cer", "test/wer_utt_mean"]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def tiny_on(manifest, tmp_path, name, **settings):
    """Train, dev and test all on the 8-utterance tiny manifest."""
    return tiny_overrides(manifest.parent, tmp_path, name, data__train_manifest=manifest,
                          data__dev_manifest=manifest, data__test_manifest=manifest, data__max_train_utterances=0,
                          data__max_eval_utterances=0, **settings)


def test_smoke_end_to_end(tiny_manifest, tmp_path):
    results = run_training(tiny_on(tiny_manifest, tmp_path, "smoke", train__epochs=6, optim__lr=1e-3))
    run_dir = tmp_path / "smoke"

    losses = epoch_losses(run_dir)
    assert len(losses) == 6 and losses[-1] < 0.7 * losses[0], losses  # it learns
    assert set(results) == {"dev", "test"} and 0 <= results["test"]["wer"] and "cer" in results["dev"]

    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["model"]["name"] == "lstman4_tiny" and saved["compression"]["algorithm"] == "dense"
    assert saved["distributed"]["world_size"] == 1 and "density" in saved["compression"]

    metrics = read_metrics(run_dir)  # strict parse: NaN/Infinity would raise
    assert {m["kind"] for m in metrics} == {"train", "epoch", "dev", "test"}
    for m in metrics:
        assert {"step", "epoch", "time"} <= set(m)
        assert all(math.isfinite(v) for v in m.values() if isinstance(v, float))
    assert sorted(step_losses(run_dir)) == list(range(1, 13))  # 8 utterances / batch 4 = 2 steps x 6 epochs

    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    tags = set(events.Tags()["scalars"])
    missing = set(TRAIN_TAGS + COMM_TAGS + TIME_TAGS + EVAL_TAGS) - tags
    assert not missing, missing
    assert [e.step for e in events.Scalars("train/loss")] == list(range(1, 13))
    assert [e.step for e in events.Scalars("dev/wer")] == [2, 4, 6, 8, 10, 12]  # after each epoch
    for tag in tags:
        assert all(math.isfinite(e.value) for e in events.Scalars(tag)), tag
    assert all(e.value == 1.0 for e in events.Scalars("comm/dense"))
    assert all(e.value == 1.0 for e in events.Scalars("comm/density"))
    assert (run_dir / "checkpoints" / "last" / "index.json").is_file()
    assert (run_dir / "checkpoints" / "best" / "index.json").is_file()


def test_only_training_features_are_augmented(tiny_manifest, tmp_path, monkeypatch):
    """Every item read during a run with masking on: training items are masked, with the epoch the
    trainer selected; dev and test items never are. Without masking nothing is."""
    original = SpeechDataset.__getitem__
    reads = []

    def getitem(self, i):
        item = original(self, i)
        reads.append((self.source, self.augment is not None, self.epoch, bool((item[0] == 0).all(1).any())))
        return item

    monkeypatch.setattr(SpeechDataset, "__getitem__", getitem)
    for split in ("dev", "test"):  # the same utterances under other names, to tell the reads apart
        write_manifest(read_manifest(tiny_manifest), tmp_path / f"an4_{split}.csv")
    run_training(tiny_overrides(tmp_path, tmp_path, "aug", data__train_manifest=tiny_manifest, train__epochs=2,
                                data__max_train_utterances=0, data__max_eval_utterances=0,
                                data__freq_masks=3, data__freq_mask_width=30))
    train, dev, test = ([r[1:] for r in reads if Path(r[0]).name == name]
                        for name in ("tiny.csv", "an4_dev.csv", "an4_test.csv"))
    assert len(train) == 16 and {r[:2] for r in train} == {(True, 0), (True, 1)}
    assert sum(r[2] for r in train) >= 12  # 3 masks of width 0..30: a zeroed bin in (nearly) every item
    assert len(dev) == 2 * 8 and len(test) == 8 and not any(r[0] or r[2] for r in dev + test)
    reads.clear()
    run_training(tiny_on(tiny_manifest, tmp_path, "plain", train__epochs=1, train__eval_every_epochs=0))
    assert reads and not any(r[1] or r[3] for r in reads)


def test_evaluate_cli(tiny_manifest, tmp_path, capsys):
    run_training(tiny_on(tiny_manifest, tmp_path, "ev", train__epochs=1))
    checkpoint = tmp_path / "ev" / "checkpoints" / "last"
    capsys.readouterr()
    evaluate.main([str(checkpoint), "--manifest", str(tiny_manifest), "--worst", "3"])
    out = capsys.readouterr().out
    for word in ("8 utterances", "wer", "cer", "wer_utt_mean", "worst 3 utterances", "ref:", "hyp:"):
        assert word in out, out
    dataset = SpeechDataset(tiny_manifest)
    evaluate.main([str(checkpoint), "--audio", dataset.audio[0], dataset.audio[1]])
    out = capsys.readouterr().out.splitlines()
    assert out[-2].startswith(dataset.audio[0] + ": ") and out[-1].startswith(dataset.audio[1] + ": ")


@pytest.mark.unit
def test_the_learning_rate_warms_up_holds_and_anneals():
    """Warm-up over the first steps, then lr / anneal**epoch; with lr_hold_epochs = 2 the first two epochs keep the
    full lr and the anneal counts from the third (hand-computed: 0.1 / 2**1 in epoch 3)."""
    plain = OptimConfig(lr=0.1, lr_warmup_steps=4, lr_anneal=2.0)
    held = OptimConfig(lr=0.1, lr_warmup_steps=4, lr_anneal=2.0, lr_hold_epochs=2)
    assert [learning_rate(plain, step, 0) for step in range(5)] == pytest.approx([0.025, 0.05, 0.075, 0.1, 0.1])
    assert [learning_rate(plain, 10, epoch) for epoch in range(4)] == pytest.approx([0.1, 0.05, 0.025, 0.0125])
    assert [learning_rate(held, 10, epoch) for epoch in range(5)] == pytest.approx([0.1, 0.1, 0.1, 0.05, 0.025])
    assert learning_rate(held, 1, 0) == pytest.approx(0.05)  # the warm-up is the same with a hold


@pytest.mark.unit
@pytest.mark.parametrize("momentum, nesterov, weight_decay", [(0.0, False, 0.0), (0.9, False, 0.0),
                                                               (0.9, True, 1e-2), (0.5, False, 1e-3)])
def test_momentum_sgd_steps_and_saves_as_torchs_sgd(momentum, nesterov, weight_decay):
    """MomentumSGD against torch.optim.SGD from the same start on the same gradients (views into one flat buffer,
    as the trainer gives them), the learning rate changed between steps: the same parameters and momentum
    buffers, the gradient left as it was, the same state_dict; and each loads the other's state_dict mid-run and
    goes on to the same parameters."""
    g = torch.Generator().manual_seed(0)
    shapes = [(7, 3), (5,), (2, 4, 3)]
    start = [torch.randn(s, generator=g) for s in shapes]
    gradients = [torch.randn(sum(math.prod(s) for s in shapes), generator=g) for _ in range(6)]
    settings = dict(momentum=momentum, nesterov=nesterov, weight_decay=weight_decay)

    def replica(kind):
        params = [torch.nn.Parameter(t.clone()) for t in start]
        return params, attach_flat_grad(params), kind(params, lr=0.1, **settings)

    def step(params, flat, optimizer, gradient, lr):
        flat.copy_(gradient)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.step()
        assert torch.equal(flat, gradient)  # the update leaves the exchanged gradient as it was

    ours, theirs = replica(MomentumSGD), replica(torch.optim.SGD)
    for i, gradient in enumerate(gradients[:4]):
        for side in (ours, theirs):
            step(*side, gradient, lr=0.1 / (i + 1))
        for a, b in zip(ours[0], theirs[0]):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    saved, expected = ours[2].state_dict(), theirs[2].state_dict()
    assert saved["param_groups"] == expected["param_groups"]
    assert saved["state"].keys() == expected["state"].keys() == (set(range(3)) if momentum else set())
    for i, state in expected["state"].items():
        torch.testing.assert_close(saved["state"][i]["momentum_buffer"], state["momentum_buffer"], rtol=1e-6, atol=1e-7)

    resumed = {}
    for kind, state_dict in ((MomentumSGD, expected), (torch.optim.SGD, saved)):
        params, flat, optimizer = replica(kind)
        with torch.no_grad():
            for p, q in zip(params, ours[0]):
                p.copy_(q)
        optimizer.load_state_dict(copy.deepcopy(state_dict))
        for gradient in gradients[4:]:
            step(params, flat, optimizer, gradient, lr=0.01)
        resumed[kind] = params
    for side in (ours, theirs):
        for gradient in gradients[4:]:
            step(*side, gradient, lr=0.01)
    for a, b, c in zip(resumed[MomentumSGD], resumed[torch.optim.SGD], theirs[0]):
        torch.testing.assert_close(a, c, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(b, c, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="dampening 0.5"):  # a setting it would not apply is refused
        MomentumSGD(ours[0], lr=0.1).load_state_dict(torch.optim.SGD(ours[0], lr=0.1, dampening=0.5).state_dict())


@pytest.mark.tooling
def test_the_trainers_optimizer_starts_without_torch_dynamo():
    """bench/startup.py's MomentumSGD row (SGDStep built and stepped in a fresh process) imports no
    torch._dynamo, the start-up MomentumSGD exists to save; the table has the floor beside it."""
    proc = subprocess.run([sys.executable, "bench/startup.py", "--repeats", "1", "--rows", "MomentumSGD"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {cells[0]: cells[1:] for cells in ([c.strip() for c in line.split("|")[1:-1]]
                                              for line in proc.stdout.splitlines() if line.startswith("| "))}
    assert rows.keys() == {"stage", "python", "MomentumSGD"}, proc.stdout
    assert rows["MomentumSGD"][-1] == "no", proc.stdout
    assert float(rows["MomentumSGD"][0]) > float(rows["python"][0]), proc.stdout


def test_flat_gradient_buffer_matches_ordinary_backward(tiny_manifest):
    """After backward, the flat buffer holds exactly what autograd gives a normal copy of the model,
    and every .grad is still a view into it (no copy is needed to hand it to the compressor)."""
    torch.manual_seed(0)
    model = build_model("lstman4_tiny")
    reference = copy.deepcopy(model)
    dataset = SpeechDataset(tiny_manifest)
    batch = collate([dataset[i] for i in range(4)])
    loss_fn = torch.nn.CTCLoss(blank=0, reduction="sum", zero_infinity=True)

    def loss_of(m):
        log_probs, lengths = m(batch.features, batch.feature_lengths)
        return loss_fn(log_probs, batch.targets, lengths, batch.target_lengths) / 4

    params = list(model.parameters())
    flat = attach_flat_grad(params)
    for _ in range(2):  # zeroing the buffer (not set_to_none) keeps the views across steps
        flat.zero_()
        loss_of(model).backward()
    loss_of(reference).backward()
    expected = torch.cat([p.grad.flatten() for p in reference.parameters()])
    torch.testing.assert_close(flat, expected, rtol=1e-5, atol=1e-6)
    assert flat.abs().sum() > 0
    offset = 0
    for p in params:
        assert p.grad.data_ptr() == flat[offset:].data_ptr()
        offset += p.numel()


@pytest.mark.skipif(precision_problem("bf16", torch.device("cpu")) is not None,
                    reason="this CPU has no oneDNN bfloat16 kernels (train.py refuses bf16 here)")
def test_bf16_step_autocasts_the_forward_and_keeps_float32_gradients_and_weights(tiny_manifest, tmp_path):
    """train.precision=bf16: the model's layers compute in bfloat16 (autocast), the loss is close to the
    float32 one from the same weights but not equal, and the gradient buffer, the weights and the
    update stay float32."""
    from sparse_asr.comm import Communicator
    from sparse_asr.training.config import load_config
    from sparse_asr.training.launch import resolve_for_run
    from sparse_asr.training.launch import bare_trainer
    from tests.mpi.train_common import SMOKE_CONFIG

    dataset = SpeechDataset(tiny_manifest)
    batch = collate([dataset[i] for i in range(4)])
    comm = Communicator()
    losses, trainers = {}, {}
    for precision in ("fp32", "bf16"):
        cfg = resolve_for_run(load_config(SMOKE_CONFIG, tiny_on(tiny_manifest, tmp_path, precision)
                                          + [f"train.precision={precision}"]), comm)
        torch.manual_seed(0)
        trainer = bare_trainer(cfg, comm, build_model("lstman4_tiny"), dataset, "cpu")
        seen = []
        trainer.model.classifier.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
        before = [p.detach().clone() for p in trainer.params]
        record = trainer.train_step(batch)
        assert record is not None and math.isfinite(record.loss)
        assert seen == [torch.bfloat16 if precision == "bf16" else torch.float32]
        assert trainer.flat_grad.dtype == torch.float32 and torch.isfinite(trainer.flat_grad).all()
        assert trainer.flat_grad.abs().sum() > 0
        assert all(p.dtype == torch.float32 for p in trainer.params)
        assert any(not torch.equal(a, b) for a, b in zip(before, trainer.params))  # the SGD step was taken
        losses[precision], trainers[precision] = record.loss, trainer
    assert losses["bf16"] != losses["fp32"] and abs(losses["bf16"] - losses["fp32"]) < 0.01 * losses["fp32"], losses
    cosine = torch.nn.functional.cosine_similarity(trainers["bf16"].flat_grad, trainers["fp32"].flat_grad, dim=0)
    assert cosine > 0.98, cosine  # the same gradient up to bfloat16's rounding


def inject_nan(monkeypatch, at_step, once):
    """Make the loss NaN (so backward gives NaN gradients too) when the optimizer step is `at_step`:
    once, or every time (the step is then never taken)."""
    original = Trainer.forward_loss
    seen = []

    def forward_loss(self, batch):
        loss = original(self, batch)
        if self.progress.step == at_step and not (once and seen):
            seen.append((self.progress.epoch, self.progress.batch_in_epoch))
            return loss * float("nan")
        return loss

    monkeypatch.setattr(Trainer, "forward_loss", forward_loss)
    return seen


def test_nan_loss_is_skipped_and_counted(tiny_manifest, tmp_path, monkeypatch, capsys):
    seen = inject_nan(monkeypatch, at_step=2, once=True)  # the third batch: epoch 1, batch 0
    run_training(tiny_on(tiny_manifest, tmp_path, "nan", train__epochs=2))
    assert seen == [(1, 0)]
    metrics = read_metrics(tmp_path / "nan")
    skipped = [m for m in metrics if "train/skipped_steps" in m]
    assert [(m["step"], m["train/skipped_steps"]) for m in skipped] == [(2, 1)]
    assert sorted(step_losses(tmp_path / "nan")) == [1, 2, 3]  # 4 batches, 3 optimizer steps
    assert "non-finite loss or gradient, step skipped" in capsys.readouterr().err


@pytest.mark.parametrize("algorithm", ["oktopk", "powersgd"])
def test_a_nonfinite_step_reaches_no_compressor(tiny_manifest, tmp_path, monkeypatch, algorithm):
    """The step's one finiteness check is the trainer's: a NaN loss (so NaN gradients) skips the step before
    the compressor is called, so its residual, the weights and the step count stay as they were."""
    from sparse_asr.comm import Communicator
    from sparse_asr.training.config import load_config
    from sparse_asr.training.launch import resolve_for_run
    from sparse_asr.training.launch import bare_trainer
    from tests.mpi.train_common import SMOKE_CONFIG

    dataset = SpeechDataset(tiny_manifest)
    batch = collate([dataset[i] for i in range(4)])
    comm = Communicator()
    cfg = resolve_for_run(load_config(SMOKE_CONFIG, tiny_on(tiny_manifest, tmp_path, algorithm)
                                      + [f"compression.algorithm={algorithm}", "compression.density=0.1"]), comm)
    trainer = bare_trainer(cfg, comm, build_model("lstman4_tiny"), dataset, "cpu")
    for _ in range(2):
        assert trainer.train_step(batch) is not None
    def tensors(state, prefix=""):  # the state's tensors by dotted key (the memory's are nested under "memory")
        for key, value in state.items():
            if isinstance(value, dict):
                yield from tensors(value, f"{prefix}{key}.")
            elif torch.is_tensor(value):
                yield prefix + key, value

    kept = {k: v.clone() for k, v in tensors(trainer.compressor.state_dict())}
    weights = [p.detach().clone() for p in trainer.params]
    assert any(v.abs().sum() > 0 for v in kept.values())  # a residual / error that a leak would change
    nan_loss, calls = inject_nan(monkeypatch, at_step=2, once=True), []
    monkeypatch.setattr(type(trainer.compressor), "step", lambda self, g: calls.append(g))
    assert trainer.train_step(batch) is None and nan_loss == [(0, 0)] and calls == []
    assert trainer.progress.step == 2 and all(torch.equal(a, b) for a, b in zip(weights, trainer.params))
    state = dict(tensors(trainer.compressor.state_dict()))
    assert "memory.residual" in state and all(torch.equal(state[k], v) for k, v in kept.items())


def test_an_fp16_overflow_in_the_exchange_skips_the_step(tiny_manifest, tmp_path, monkeypatch):
    """A finite gradient beyond fp16's range (the loss scaled by 1e9) passes the trainer's check before the
    exchange, overflows in fp16's (compression/half.py): the update is not finite, the same on every rank, and
    the trainer skips the step after the exchange: weights and step count stay; bf16 holds the same gradient."""
    from sparse_asr.comm import Communicator
    from sparse_asr.training.config import load_config
    from sparse_asr.training.launch import bare_trainer, resolve_for_run
    from tests.mpi.train_common import SMOKE_CONFIG

    dataset = SpeechDataset(tiny_manifest)
    batch = collate([dataset[i] for i in range(4)])
    original = Trainer.forward_loss
    monkeypatch.setattr(Trainer, "forward_loss", lambda self, b: original(self, b) * 1e9)
    for algorithm, taken in (("fp16", False), ("bf16", True)):
        comm = Communicator()
        cfg = resolve_for_run(load_config(SMOKE_CONFIG, tiny_on(tiny_manifest, tmp_path, algorithm)
                                          + [f"compression.algorithm={algorithm}", "compression.warmup_steps=0"]), comm)
        trainer = bare_trainer(cfg, comm, build_model("lstman4_tiny"), dataset, "cpu")
        weights = [p.detach().clone() for p in trainer.params]
        assert (trainer.train_step(batch) is not None) == taken, algorithm
        assert trainer.progress.step == int(taken), algorithm
        assert all(torch.equal(a, b) for a, b in zip(weights, trainer.params)) == (not taken), algorithm


def test_nonfinite_steps_in_a_row_stop_the_run(tiny_manifest, tmp_path, monkeypatch):
    inject_nan(monkeypatch, at_step=1, once=False)  # every batch from the second on: step 1 is never taken
    with pytest.raises(FloatingPointError, match=r"3 steps in a row had a non-finite loss or gradient"):
        run_training(tiny_on(tiny_manifest, tmp_path, "nan3", train__epochs=3, train__max_nonfinite_in_row=3))


def test_max_minutes_stops_after_a_scored_epoch_and_the_run_resumes(tiny_manifest, tmp_path, capsys):
    """A budget already spent after the first epoch: the run stops there, scores dev (although
    eval_every_epochs=2 would skip epoch 1) and test, checkpoints, and --resume goes on to train.epochs.
    A budget that is ample changes nothing."""
    run_dir = tmp_path / "timed"
    results = run_training(tiny_on(tiny_manifest, tmp_path, "timed", train__epochs=3, train__eval_every_epochs=2,
                                   train__max_minutes=1e-6))
    assert "stopping after epoch 1 of 3" in capsys.readouterr().out
    assert set(results) == {"dev", "test"}
    assert [(m["kind"], m["epoch"]) for m in read_metrics(run_dir) if m["kind"] != "train"] == \
        [("epoch", 1), ("dev", 1), ("test", 1)]
    assert len(epoch_losses(run_dir)) == 1

    run_training(["train.max_minutes=0"], resume=str(run_dir), config=None)
    rows = [(m["kind"], m["epoch"]) for m in read_metrics(run_dir) if m["kind"] in ("epoch", "dev")]
    assert rows == [("epoch", 1), ("dev", 1), ("epoch", 2), ("dev", 2), ("epoch", 3), ("dev", 3)]

    run_training(tiny_on(tiny_manifest, tmp_path, "ample", train__epochs=3, train__max_minutes=10))
    assert len(epoch_losses(tmp_path / "ample")) == 3


def test_sampler_gives_every_rank_the_same_number_of_steps(tiny_manifest):
    """The trainer relies on it: every rank must run the same number of collectives."""
    dataset = SpeechDataset(tiny_manifest)
    counts = {len(BucketingSampler(dataset.durations, 4, r, 2, seed=1)) for r in range(2)}
    assert counts == {2}


@pytest.mark.parametrize("args, message", [
    (["-n", "0"], "-n must be a positive integer"),
    (["-n", "two"], "-n must be a positive integer"),
    (["-c", "configs/missing.yaml"], "config file 'configs/missing.yaml' does not exist"),
    (["train.epochs"], "'train.epochs' is not a key.sub=value override"),
])
@pytest.mark.unit
def test_run_local_refuses_bad_arguments_before_doing_anything(args, message):
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "scripts" / "run_local.sh"
    proc = subprocess.run(["bash", str(script), *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_cached_features_are_the_same_items_and_read_the_audio_once(tiny_manifest, monkeypatch):
    """data.cache_features: every epoch's items (masks included) are bitwise those of an uncached dataset, and
    the audio of an utterance is read once, however many epochs read it."""
    import sparse_asr.data.dataset as dataset_module
    from sparse_asr.data.audio import SpecAugment

    reads = []
    original = dataset_module.load_audio
    monkeypatch.setattr(dataset_module, "load_audio", lambda path, rate: reads.append(path) or original(path, rate))
    augment = SpecAugment(2, 15, 2, 25, 0.1)
    plain = SpeechDataset(tiny_manifest, augment=augment, seed=3)
    cached = SpeechDataset(tiny_manifest, augment=augment, seed=3, cache=True)
    for epoch in range(3):
        plain.set_epoch(epoch)
        cached.set_epoch(epoch)
        for i in range(len(plain)):
            a, b = plain[i], cached[i]
            assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[2] == b[2], (epoch, i)
    n = len(plain)
    assert len(reads) == 3 * n + n  # the plain dataset every epoch, the cached one once
    assert not torch.equal(plain[0][0], cached.cache[0])  # the masks were drawn on a copy, not on the cache


def test_a_cache_on_another_device_pads_and_masks_there(tiny_manifest):
    """data.cache_features on a GPU: the cached features, the masks drawn on them and the padded batch stay on
    the cache's device, and the loader does not try to pin them (pinning is for host memory). The meta device
    stands in for a GPU here (the code path is the same); feature_bytes is what the cache really holds."""
    from sparse_asr.data.audio import SpecAugment
    from sparse_asr.data.dataset import feature_bytes, make_loader
    from sparse_asr.training.launch import cache_placement

    on_host = SpeechDataset(tiny_manifest, cache=True)
    items = [on_host[i][0] for i in range(len(on_host))]
    assert feature_bytes(on_host) == sum(4 * f.numel() for f in items)
    assert cache_placement(feature_bytes(on_host), torch.device("cpu"))[0] == torch.device("cpu")

    elsewhere = SpeechDataset(tiny_manifest, augment=SpecAugment(2, 15, 2, 25, 0.1), cache=True, cache_device="meta")
    sampler = BucketingSampler(elsewhere.durations, 2, shuffle=False, drop_last=True)
    loader = make_loader(elsewhere, sampler, pin_memory=True)
    assert not loader.pin_memory and make_loader(on_host, sampler, pin_memory=True).pin_memory
    for batch in loader:
        assert batch.features.device.type == "meta" and batch.targets.device.type == "cpu"
    assert all(f.device.type == "meta" for f in elsewhere.cache.values()) and len(elsewhere.cache) >= 2


def test_checkpoint_every_epochs_keeps_the_last_and_the_best(tiny_manifest, tmp_path):
    from sparse_asr.training.config import ConfigError, load_config

    run_training(tiny_on(tiny_manifest, tmp_path, "every", train__epochs=5, train__checkpoint_every_epochs=2,
                         train__eval_every_epochs=0, train__keep_checkpoints=9))
    steps = sorted(p.name for p in (tmp_path / "every" / "checkpoints").glob("step-*"))
    assert steps == ["step-00000004", "step-00000008", "step-00000010"], steps  # epochs 2, 4 and the last, 5
    run_training(tiny_on(tiny_manifest, tmp_path, "best", train__epochs=3, train__checkpoint_every_epochs=5,
                         train__keep_checkpoints=9))
    best = (tmp_path / "best" / "checkpoints" / "best").resolve().name
    steps = sorted(p.name for p in (tmp_path / "best" / "checkpoints").glob("step-*"))
    assert best in steps and steps[-1] == "step-00000006", (best, steps)  # the best epoch's and the last
    with pytest.raises(ConfigError, match="data.cache_features needs data.num_workers=0"):
        load_config(None, ["data.cache_features=true", "data.num_workers=2"])
