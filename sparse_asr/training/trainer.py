"""The data-parallel training loop (DESIGN 2). `Trainer.train_step` is the whole step:

    zero the flat gradient -> forward -> CTC loss / B -> backward
    -> agree on all ranks that loss and gradient are finite (else every rank skips the step)
    -> exchange.step(flat_grad): flat_grad becomes the averaged global update on every rank
    -> clip the synchronised gradient -> SGD step.

The parameters' .grad are views into ONE flat float32 buffer, so the exchange gets the gradient
without a copy. The exchange is whatever compression.build_compressor made (its dense warm-up
included). Rank 0 logs; per-rank figures are summed over the log window locally and reduced over
ranks only when a line is logged.
"""
from __future__ import annotations

import math
import time

import torch

from sparse_asr.compression.base import all_finite
from sparse_asr.data.dataset import BucketingSampler, make_loader
from sparse_asr.data.text import BLANK
from sparse_asr.models.sync_batchnorm import COUNT_AS as SYNCBN_OP
from sparse_asr.training import replicas
from sparse_asr.training.checkpoint import (Progress, RankState, TrainingState, check_state_fits, rng_state,
                                            save_training_state, set_rng_state)
from sparse_asr.training.config import Config, to_dict
from sparse_asr.training.evaluation import evaluate
from sparse_asr.training.logging import (EPOCH_TAGS, TRAIN_TAGS, MetricWindow, RunLogger, StepRecord, format_bytes,
                                         format_duration, tagged)
from sparse_asr.training.optim import (attach_flat_grad, build_optimizer, clip_grad_norm_, learning_rate,
                                       set_learning_rate)


class Trainer:
    def __init__(self, cfg: Config, comm, model, train_set, dev_set, test_set, device, logger: RunLogger):
        """Collective: every replica starts from rank 0's model (load_training_state may replace it)."""
        from sparse_asr.compression import warmup_steps

        self.cfg, self.comm, self.device, self.log = cfg, comm, torch.device(device), logger
        self.model = model.to(self.device)
        self.train_set, self.dev_set, self.test_set = train_set, dev_set, test_set
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.flat_grad = attach_flat_grad(self.params)
        self.grad_pointers = [p.grad.data_ptr() for p in self.params]
        self.optimizer = build_optimizer(self.params, cfg.optim)
        self.loss_fn = torch.nn.CTCLoss(blank=BLANK, reduction="sum", zero_infinity=True)
        self.sampler = BucketingSampler(train_set.durations, cfg.train.global_batch_size, comm.rank, comm.size,
                                        seed=cfg.seed, shuffle=True, drop_last=True)
        self.steps_per_epoch = self.sampler.batches_per_epoch
        self.total_steps = self.steps_per_epoch * cfg.train.epochs
        self.warmup = warmup_steps(cfg.compression.warmup_steps, self.total_steps)
        self.exchange = self.build_exchange(self.warmup)
        self.progress = Progress()
        self.cum_bytes_recv = 0.0  # this rank's, since the run started
        self.window, self.epoch_window = MetricWindow(), MetricWindow()
        self.syncbn_bytes_logged = comm.counts(SYNCBN_OP).bytes_recv  # the Communicator's, at the last log line
        replicas.broadcast_state(comm, self.model, self.optimizer)

    def build_exchange(self, warmup: int):
        from sparse_asr.compression import build_compressor

        c = self.cfg.compression
        return build_compressor(c.algorithm, self.comm, self.flat_grad.numel(), c.density, self.device,
                                shapes=[p.shape for p in self.params], warmup=warmup, dense_1d=c.dense_1d,
                                **c.options)

    # ------------------------------------------------------------------------------ the step
    def forward_loss(self, batch) -> torch.Tensor:
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cfg.train.precision == "bf16"):
            log_probs, out_lengths = self.model(batch.features, batch.feature_lengths)
        # CTC outside autocast, on float32 log-probabilities: its sums over all alignments need float32.
        return self.loss_fn(log_probs.float(), batch.targets, out_lengths, batch.target_lengths) / len(batch)

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
        if not self.finite_on_all_ranks(loss):
            return None
        stats = self.exchange.step(self.flat_grad)
        grad_norm = clip_grad_norm_(self.flat_grad, self.cfg.optim.max_grad_norm)
        set_learning_rate(self.optimizer, learning_rate(self.cfg.optim, self.progress.step, self.progress.epoch))
        self.optimizer.step()
        self.progress.step += 1
        return StepRecord(float(loss.detach()), grad_norm, seconds_compute, stats)

    def finite_on_all_ranks(self, loss: torch.Tensor) -> bool:
        """A GLOBAL decision (allreduce max of a flag): ranks must skip together or the next
        collective would deadlock."""
        bad = not (bool(torch.isfinite(loss)) and all_finite(self.flat_grad))
        flag = torch.tensor([float(bad)])
        self.comm.allreduce_(flag, op="max")
        return flag.item() == 0.0

    # ------------------------------------------------------------------------------ the loop
    def fit(self) -> dict:
        """Train for the configured epochs (from wherever a resumed run left off); returns the
        last dev and test summaries."""
        cfg, log, progress = self.cfg, self.log, self.progress
        log.info(f"{self.total_steps} optimizer steps ({self.steps_per_epoch} per epoch, global batch "
                 f"{cfg.train.global_batch_size} on {self.comm.size} rank(s)); {self.flat_grad.numel():,} "
                 f"parameters; gradient exchange: {self.exchange.describe()}")
        self.t_start, self.step_start = time.perf_counter(), progress.step
        results, algorithm, t_epoch_start = {}, None, self.t_start
        while progress.epoch < cfg.train.epochs:
            self.sampler.set_epoch(progress.epoch, start_batch=progress.batch_in_epoch)
            self.train_set.set_epoch(progress.epoch)  # selects the epoch's augmentation masks
            t_last = self.epoch_window.t0 = time.perf_counter()
            for batch in make_loader(self.train_set, self.sampler, cfg.data.num_workers,
                                     pin_memory=self.device.type == "cuda"):
                record = self.train_step(batch.to(self.device, non_blocking=True))
                progress.batch_in_epoch += 1
                if record is None:
                    self.on_skipped_step()
                    continue
                progress.nonfinite_in_row = 0
                if record.stats.algorithm != algorithm:  # the first step, and the end of the dense warm-up
                    algorithm = record.stats.algorithm
                    log.info(f"step {progress.step}: gradient exchange by {algorithm}")
                self.cum_bytes_recv += record.stats.bytes_recv
                now = time.perf_counter()
                record.seconds_step, t_last = now - t_last, now
                self.window.add(record)
                self.epoch_window.add(record)
                if progress.step % cfg.train.log_every_steps == 0:
                    self.log_window()
                if cfg.train.checksum_every and progress.step % cfg.train.checksum_every == 0:
                    replicas.check_replicas(self.comm, self.params, progress.step)
                every = cfg.train.checkpoint_every_steps
                if every and progress.step % every == 0 and progress.batch_in_epoch < self.steps_per_epoch:
                    self.save()  # (the epoch's last batch: the epoch-end checkpoint follows)
            progress.epoch, progress.batch_in_epoch = progress.epoch + 1, 0
            self.log_epoch()
            if not cfg.model.sync_batchnorm:  # synchronized BatchNorm keeps them identical already
                replicas.average_buffers(self.comm, self.model)
            out_of_time = progress.epoch < cfg.train.epochs and self.out_of_time(t_epoch_start)
            improved = False
            if cfg.train.eval_every_epochs and (progress.epoch % cfg.train.eval_every_epochs == 0
                                                or progress.epoch == cfg.train.epochs or out_of_time):
                results["dev"] = self.evaluate_set("val", self.dev_set)
                improved = results["dev"].get("wer", math.inf) < progress.best_wer
                progress.best_wer = min(progress.best_wer, results["dev"].get("wer", math.inf))
            self.save(best=improved)
            if out_of_time:
                log.info(f"stopping after epoch {progress.epoch} of {cfg.train.epochs}: another epoch would likely "
                         f"end past train.max_minutes={cfg.train.max_minutes:g} (resume to go on)")
                break
            t_epoch_start = time.perf_counter()
        if self.test_set is not None:
            results["test"] = self.evaluate_set("test", self.test_set)
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

    # ------------------------------------------------------------------------------ logging
    def log_window(self) -> None:
        """Collective: the log window's means over ranks to TensorBoard, metrics.jsonl and the console."""
        m = self.window.reduce(self.comm, self.cfg.train.global_batch_size)
        cum = self.comm.allreduce_(torch.tensor([self.cum_bytes_recv], dtype=torch.float64)).item() / self.comm.size
        if m is None:
            return
        p, lr = self.progress, self.optimizer.param_groups[0]["lr"]
        self.log.scalars("train", p.step, p.epoch, {**tagged(m, TRAIN_TAGS, with_extras=True), "train/lr": lr,
                                                    "comm/cum_bytes_recv": cum, **self.syncbn_traffic(m["steps"])})
        done = p.step - self.step_start
        eta = (time.perf_counter() - self.t_start) / max(done, 1) * (self.total_steps - p.step)
        self.log.info(f"step {p.step}/{self.total_steps} epoch {p.epoch + 1} loss {m['loss']:.3f} lr {lr:.2e} "
                      f"samples/s {m['samples_per_sec']:.1f} density {m['density']:.4f} "
                      f"recv/step {format_bytes(m['bytes_recv'])} ETA {format_duration(eta)}")

    def syncbn_traffic(self, steps: float) -> dict[str, float]:
        """Synchronized BatchNorm's bytes received per step since the last log line (its allreduces,
        counted by the Communicator as op "syncbn", have the same size on every rank)."""
        if not self.cfg.model.sync_batchnorm:
            return {}
        total = self.comm.counts(SYNCBN_OP).bytes_recv
        per_step, self.syncbn_bytes_logged = (total - self.syncbn_bytes_logged) / steps, total
        return {"comm/syncbn_bytes_recv": per_step}

    def log_epoch(self) -> None:
        m = self.epoch_window.reduce(self.comm, self.cfg.train.global_batch_size)
        p = self.progress
        if m is None:
            self.log.warn(f"epoch {p.epoch}: no optimizer step was taken")
            return
        self.log.scalars("epoch", p.step, p.epoch, tagged(m, EPOCH_TAGS))
        self.log.info(f"epoch {p.epoch} done: {int(m['steps'])} steps in {format_duration(m['wall'])}, "
                      f"loss {m['loss']:.3f}, mean density {m['density']:.4f}, recv/step "
                      f"{format_bytes(m['bytes_recv'])} (max rank {format_bytes(m['bytes_recv_max'])}), "
                      f"compression ratio {m['compression_ratio']:.1f}, skipped steps {p.skipped_steps}")

    def evaluate_set(self, prefix: str, dataset) -> dict:
        t0 = time.perf_counter()
        result = evaluate(self.model, dataset, self.comm, self.device, self.cfg.train.eval_batch_size,
                          self.cfg.data.num_workers)
        p = self.progress
        self.log.scalars(prefix, p.step, p.epoch, {f"{prefix}/{k}": v for k, v in result.summary.items()})
        text = ", ".join(f"{k} {v:.4f}" for k, v in result.summary.items())
        self.log.info(f"{prefix} after epoch {p.epoch} ({result.utterances} utterances, "
                      f"{time.perf_counter() - t0:.1f} s): {text}")
        return result.summary

    # ------------------------------------------------------------------------------ checkpoints
    @property
    def checkpoint_dir(self):
        return self.cfg.run_dir / "checkpoints"

    def training_state(self) -> TrainingState:
        # BatchNorm statistics differ between ranks in mid-epoch checkpoints: each rank keeps its own.
        buffers = {k: v.detach().cpu().clone() for k, v in self.model.named_buffers() if v.is_floating_point()}
        mine = RankState(compressor=self.exchange.state_dict(), rng=rng_state(), buffers=buffers,
                         cum_bytes_recv=self.cum_bytes_recv, epoch_window=self.epoch_window.state_dict())
        # The warm-up length is fixed at the start ('auto' depends on train.epochs, which a resume may change);
        # metrics_rows: the metrics.jsonl lines written so far (a resume drops the lines after them).
        return TrainingState(config=to_dict(self.cfg), model=self.model.state_dict(),
                             optimizer=self.optimizer.state_dict(), progress=self.progress, mine=mine,
                             extra={"warmup_steps": self.warmup, "metrics_rows": self.log.rows})

    def load_training_state(self, state: TrainingState) -> None:
        """Continue from a checkpoint; a clear CheckpointError if it does not fit this run (model shapes, the
        compressor's state). Each rank takes its own BatchNorm statistics (after the start-up broadcast)."""
        if state.extra["warmup_steps"] != self.warmup:
            self.warmup = state.extra["warmup_steps"]
            self.exchange = self.build_exchange(self.warmup)
        check_state_fits("model", self.model.state_dict(), {**state.model, **state.mine.buffers})
        check_state_fits("compressor", self.exchange.state_dict(), state.mine.compressor)
        self.model.load_state_dict({**state.model, **state.mine.buffers})
        self.optimizer.load_state_dict(state.optimizer)
        self.exchange.load_state_dict(state.mine.compressor)
        set_rng_state(state.mine.rng)
        self.cum_bytes_recv = state.mine.cum_bytes_recv
        self.epoch_window.load_state_dict(state.mine.epoch_window)
        self.progress = Progress(**vars(state.progress))

    def save(self, best: bool = False) -> None:
        """Collective: checkpoints/step-N/ with everything needed to continue exactly (training/checkpoint.py);
        `best` also points checkpoints/best at it."""
        save_training_state(self.comm, self.checkpoint_dir, self.training_state(),
                            keep=self.cfg.train.keep_checkpoints, best=best)
