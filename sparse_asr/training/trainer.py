"""The data-parallel training loop (DESIGN 2). `Trainer.train_step` is the whole step:

    zero the flat gradient -> forward -> CTC loss / B -> backward
    -> agree on all ranks that loss and gradient are finite (else every rank skips the step)
    -> compressor.step(flat_grad): flat_grad becomes the averaged global update on every rank
       (not finite only where the exchange overflowed, fp16's: every rank skips the step alike)
    -> clip the synchronised gradient -> SGD step (optim.SGDStep; with DGC's memory part of it comes first).

The parameters' .grad are views into ONE flat float32 buffer, so the compressor (launch.start_run built
it, its dense warm-up included) gets the gradient without a copy. Every figure of a step goes to the
RunMeter (telemetry.py), which reduces over ranks only when a line is logged; rank 0 writes the lines."""
from __future__ import annotations

import math
import time

import torch

from sparse_asr.compression import Compressor
from sparse_asr.compression.base import all_finite
from sparse_asr.data.dataset import TrainingData, make_loader
from sparse_asr.training import replicas
from sparse_asr.training.checkpoint import (Progress, RankState, TrainingState, checkpoints_size, rng_state,
                                            save_training_state, set_rng_state)
from sparse_asr.training.config import Config, to_dict
from sparse_asr.training.evaluation import evaluate
from sparse_asr.training.loss import batch_loss
from sparse_asr.training.optim import SGDStep, attach_flat_grad, learning_rate
from sparse_asr.training.runlog import RunLogger
from sparse_asr.training.telemetry import RunMeter, StepRecord


class Trainer:
    def __init__(self, cfg: Config, comm, model, compressor: Compressor, data: TrainingData, device,
                 log: RunLogger):
        """Collective: every replica starts from rank 0's model (restore() may then replace it)."""
        self.cfg, self.comm, self.device, self.log = cfg, comm, torch.device(device), log
        self.model = model.to(self.device)
        self.compressor, self.data, self.sampler = compressor, data, data.sampler
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.flat_grad = attach_flat_grad(self.params)
        self.grad_pointers = [p.grad.data_ptr() for p in self.params]
        self.sgd = SGDStep(self.params, cfg.optim, comm.size, momentum_in_exchange=compressor.carries_momentum)
        self.optimizer = self.sgd.optimizer
        self.steps_per_epoch = self.sampler.batches_per_epoch
        self.total_steps = self.steps_per_epoch * cfg.train.epochs
        self.progress = Progress()
        self.meter = RunMeter(comm, cfg.train.global_batch_size, syncbn=cfg.model.sync_batchnorm)
        self.decoders = None  # built at the first evaluation (train.eval_decoder)
        replicas.broadcast_state(comm, self.model, self.optimizer)

    # ------------------------------------------------------------------------------ the step
    def forward_loss(self, batch) -> torch.Tensor:
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cfg.train.precision == "bf16"):
            log_probs, out_lengths = self.model(batch.features, batch.feature_lengths)
        # CTC outside autocast, on float32 log-probabilities: its sums over all alignments need float32.
        return batch_loss(log_probs, out_lengths, batch)

    def train_step(self, batch) -> StepRecord | None:
        """One optimizer step on this rank's share of a global batch; this rank's record, or None if the
        step was skipped (non-finite loss or gradient on some rank)."""
        t0 = time.perf_counter()
        self.flat_grad.zero_()
        loss = self.forward_loss(batch)
        loss.backward()
        if [p.grad.data_ptr() for p in self.params] != self.grad_pointers:  # autograd must accumulate in place
            raise RuntimeError("a parameter's .grad is no longer a view into the flat gradient buffer")
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds_compute = time.perf_counter() - t0
        loss_value = float(loss.detach())  # read here, where the host waits anyway (no sync of its own)
        if not self.finite_on_all_ranks(loss_value):
            return None
        self.sgd.before_exchange(self.flat_grad)
        stats = self.compressor.step(self.flat_grad)
        if not all_finite(self.flat_grad):  # a lossy exchange overflowed (fp16): the same bits on every rank, so
            return None  # every rank skips here together, with no collective
        lr = learning_rate(self.cfg.optim, self.progress.step, self.progress.epoch)
        grad_norm = self.sgd.after_exchange(self.flat_grad, lr)
        self.progress.step += 1
        return StepRecord(loss_value, grad_norm, seconds_compute, stats)

    def finite_on_all_ranks(self, loss: float) -> bool:
        """The step's one finiteness check, a GLOBAL decision: ranks must skip together or the next
        collective would deadlock (so no non-finite value ever reaches a compressor's residual)."""
        flag = torch.tensor([float(not (math.isfinite(loss) and all_finite(self.flat_grad)))])
        return self.comm.allreduce_(flag, op="max").item() == 0.0

    # ------------------------------------------------------------------------------ the loop
    def fit(self) -> dict:
        """Train for the configured epochs (from wherever a resumed run left off); returns the
        last dev and test summaries."""
        cfg, log, progress, data = self.cfg, self.log, self.progress, self.data
        log.info(f"{self.total_steps} optimizer steps ({self.steps_per_epoch} per epoch, global batch "
                 f"{cfg.train.global_batch_size} on {self.comm.size} rank(s)); {self.flat_grad.numel():,} "
                 f"parameters; gradient exchange: {self.compressor.describe()}")
        self.t_start, self.step_start = time.perf_counter(), progress.step
        results, t_epoch_start = {}, self.t_start
        while progress.epoch < cfg.train.epochs:
            self.sampler.set_epoch(progress.epoch, start_batch=progress.batch_in_epoch)
            self.compressor.start_epoch(progress.epoch)  # (a density schedule's hook)
            data.train.set_epoch(progress.epoch)  # selects the epoch's augmentation masks
            self.meter.start_epoch()
            for batch in make_loader(data.train, self.sampler, cfg.data.num_workers,
                                     pin_memory=self.device.type == "cuda"):
                record = self.train_step(batch.to(self.device, non_blocking=True))
                progress.batch_in_epoch += 1
                if record is None:
                    self.on_skipped_step()
                    continue
                progress.nonfinite_in_row = 0
                if switched := self.meter.add(record):  # the first step, and the end of the dense warm-up
                    log.info(f"step {progress.step}: gradient exchange by {switched}")
                if progress.step % cfg.train.log_every_steps == 0:
                    self.log_interval()
                if cfg.train.checksum_every and progress.step % cfg.train.checksum_every == 0:
                    replicas.check_replicas(self.comm, self.params, progress.step)
                every = cfg.train.checkpoint_every_steps
                if every and progress.step % every == 0 and progress.batch_in_epoch < self.steps_per_epoch:
                    self.save()  # (the epoch's last batch: the epoch-end checkpoint follows)
            progress.epoch, progress.batch_in_epoch = progress.epoch + 1, 0
            self.meter.log_epoch(self.log, progress)
            if not cfg.model.sync_batchnorm:  # synchronized BatchNorm keeps them identical already
                replicas.average_buffers(self.comm, self.model)
            out_of_time = progress.epoch < cfg.train.epochs and self.out_of_time(t_epoch_start)
            improved = False
            if cfg.train.eval_every_epochs and (progress.epoch % cfg.train.eval_every_epochs == 0
                                                or progress.epoch == cfg.train.epochs or out_of_time):
                results["dev"] = self.evaluate_set("dev", data.dev)
                improved = results["dev"].get("wer", math.inf) < progress.best_wer
                progress.best_wer = min(progress.best_wer, results["dev"].get("wer", math.inf))
            if improved or out_of_time or progress.epoch % cfg.train.checkpoint_every_epochs == 0 \
                    or progress.epoch == cfg.train.epochs:
                self.save(best=improved)
            if out_of_time:
                log.info(f"stopping after epoch {progress.epoch} of {cfg.train.epochs}: another epoch would likely "
                         f"end past train.max_minutes={cfg.train.max_minutes:g} (resume to go on)")
                break
            t_epoch_start = time.perf_counter()
        if data.test is not None:
            results["test"] = self.evaluate_set("test", data.test)
        count, size = checkpoints_size(cfg.run_dir / "checkpoints")
        self.log.info(f"{count} checkpoints kept, {size / 1e6:.1f} MB (train.keep_checkpoints="
                      f"{cfg.train.keep_checkpoints}, keep_best_checkpoints={cfg.train.keep_best_checkpoints})")
        return results

    def out_of_time(self, t_epoch_start: float) -> bool:
        """Collective: would one more epoch like the last (training, evaluation, checkpoint) end past
        train.max_minutes? Rank 0's clock decides for all, so every rank stops after the same epoch."""
        budget = self.cfg.train.max_minutes * 60
        if not budget:
            return False
        now = time.perf_counter()
        # twice this epoch's training time: its scoring and checkpoint (still due), then one more epoch
        verdict = now - self.t_start + 2 * (now - t_epoch_start) > budget if self.comm.rank == 0 else None
        return self.comm.bcast_object(verdict)

    def on_skipped_step(self) -> None:
        p = self.progress
        p.skipped_steps += 1
        p.nonfinite_in_row += 1
        self.log.warn(f"epoch {p.epoch} batch {p.batch_in_epoch}: non-finite loss or gradient, step skipped "
                      f"({p.nonfinite_in_row} in a row, {p.skipped_steps} in total)")
        self.log.scalars("train", p.step, p.epoch, {"train/skipped_steps": p.skipped_steps})
        limit = self.cfg.train.max_nonfinite_in_row
        if p.nonfinite_in_row >= limit:
            raise FloatingPointError(f"stopping: {p.nonfinite_in_row} steps in a row had a non-finite loss or "
                                     f"gradient (train.max_nonfinite_in_row={limit}) at optimizer step {p.step}, "
                                     f"epoch {p.epoch}; lower optim.lr or check the data")

    def log_interval(self) -> None:
        """Collective: the log interval's means over ranks to TensorBoard, metrics.jsonl and the console."""
        p = self.progress
        eta = (time.perf_counter() - self.t_start) / max(p.step - self.step_start, 1) * (self.total_steps - p.step)
        self.meter.log_interval(self.log, p, self.total_steps, self.optimizer.param_groups[0]["lr"], eta)

    def evaluate_set(self, prefix: str, dataset) -> dict:
        t0 = time.perf_counter()
        if self.decoders is None:
            from sparse_asr.decoding import GreedyDecoder, make_decoder

            self.decoders = [GreedyDecoder()]
            if self.cfg.train.eval_decoder == "beam":
                self.decoders.append(make_decoder("beam", "auto", self.cfg.data.train_manifest, log=self.log.info))
        result = evaluate(self.model, dataset, self.comm, self.device, self.cfg.train.eval_batch_size,
                          self.cfg.data.num_workers, decoders=self.decoders)
        self.meter.log_scores(self.log, prefix, self.progress, result, time.perf_counter() - t0)
        return result.summary

    # ------------------------------------------------------------------------------ checkpoints
    def training_state(self) -> TrainingState:
        # BatchNorm statistics differ between ranks in mid-epoch checkpoints: each rank keeps its own.
        buffers = {k: v.detach().cpu().clone() for k, v in self.model.named_buffers() if v.is_floating_point()}
        mine = RankState(self.compressor.state_dict(), rng_state(), buffers, self.meter.state_dict())
        # warmup_steps: fixed when the run started; metrics_rows: metrics.jsonl's lines (a resume drops later ones)
        return TrainingState(config=to_dict(self.cfg), model=self.model.state_dict(),
                             optimizer=self.optimizer.state_dict(), progress=self.progress, mine=mine,
                             extra={"warmup_steps": self.compressor.warmup_steps, "metrics_rows": self.log.rows})

    def restore(self, state: TrainingState) -> None:
        """Continue from a checkpoint that fits this run (launch.check_fits); each rank takes its own BN statistics."""
        self.model.load_state_dict({**state.model, **state.mine.buffers})
        self.optimizer.load_state_dict(state.optimizer)
        self.compressor.load_state_dict(state.mine.compressor)
        set_rng_state(state.mine.rng)
        self.meter.load_state_dict(state.mine.meter)
        self.progress = Progress(**vars(state.progress))

    def save(self, best: bool = False) -> None:
        """Collective: checkpoints/step-N/ (training/checkpoint.py; best: checkpoints/best too), rows synced first."""
        self.log.sync()  # the metrics rows the checkpoint counts are on disk before it is
        save_training_state(self.comm, self.cfg.run_dir / "checkpoints", self.training_state(),
                            keep=self.cfg.train.keep_checkpoints, best=best,
                            keep_best=self.cfg.train.keep_best_checkpoints)
