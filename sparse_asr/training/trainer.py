"""The data-parallel training loop (DESIGN 2). `Trainer.train_step` is the whole step:

    zero the flat gradient -> forward -> CTC loss / B -> backward
    -> agree on all ranks that loss and gradient are finite (else every rank skips the step)
    -> compressor.step(flat_grad): flat_grad becomes the averaged global update on every rank
    -> clip the synchronised gradient -> SGD step.

The parameters' .grad are views into ONE flat float32 buffer, so the compressor gets the gradient
without a copy. The first `warmup_steps` optimizer steps use dense allreduce. Rank 0 logs; per-rank
figures are summed over the log window locally and gathered only when a line is logged.
"""
from __future__ import annotations

import math
import time

import torch

from sparse_asr.compression import build_compressor
from sparse_asr.compression.base import all_finite
from sparse_asr.compression.dense import DenseAllreduce
from sparse_asr.data.dataset import BucketingSampler, make_loader
from sparse_asr.data.text import BLANK
from sparse_asr.training.checkpoint import (copy_checkpoint, load_checkpoint, rank_state, rng_state, save_checkpoint,
                                 set_rng_state)
from sparse_asr.training.config import Config, compression_warmup_steps, to_dict
from sparse_asr.training.evaluation import evaluate
from sparse_asr.training.logging import RunLogger, Sums, format_bytes, format_duration, gather_rows
from sparse_asr.training.optim import build_optimizer, clip_grad_norm_, learning_rate, set_learning_rate

# Per-rank figures of one step, summed over a log window / an epoch.
STEP_KEYS = ["loss", "grad_norm", "density", "dense", "bytes_sent", "bytes_recv", "dense_bytes",
             "t_compute", "t_select", "t_comm", "t_step"]


def attach_flat_grad(params: list[torch.nn.Parameter]) -> torch.Tensor:
    """Allocate one flat float32 buffer and make every parameter's .grad a view into it."""
    flat = torch.zeros(sum(p.numel() for p in params), dtype=torch.float32, device=params[0].device)
    offset = 0
    for p in params:
        p.grad = flat[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    return flat


class Trainer:
    def __init__(self, cfg: Config, comm, model, train_set, dev_set, test_set, device, logger: RunLogger):
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
        self.warmup_steps = compression_warmup_steps(cfg, self.total_steps)
        numel, c = self.flat_grad.numel(), cfg.compression
        self.dense = DenseAllreduce(comm, numel)
        self.compressor = build_compressor(c.algorithm, comm, numel, c.density, self.device, **c.options)
        # progress (all in the checkpoint)
        self.step = 0  # optimizer steps taken
        self.epoch = 0
        self.batch_in_epoch = 0  # batches of this epoch already consumed (sampler position)
        self.skipped_steps = 0
        self.nonfinite_in_row = 0
        self.best_wer = math.inf
        self.cum_bytes_recv = 0.0  # this rank's, since the run started
        self.window, self.epoch_sums = Sums(STEP_KEYS), Sums(STEP_KEYS)  # this rank's running sums
        self.extra_window = None  # the compressor's own figures (StepStats.extra), from its first step

    # ------------------------------------------------------------------------------ the step
    def forward_loss(self, batch) -> torch.Tensor:
        log_probs, out_lengths = self.model(batch.features, batch.feature_lengths)
        return self.loss_fn(log_probs, batch.targets, out_lengths, batch.target_lengths) / len(batch)

    def train_step(self, batch) -> dict | None:
        """One optimizer step on this rank's share of a global batch; this rank's figures, or None
        if the step was skipped (non-finite loss or gradient on some rank)."""
        t0 = time.perf_counter()
        self.flat_grad.zero_()
        loss = self.forward_loss(batch)
        loss.backward()
        if [p.grad.data_ptr() for p in self.params] != self.grad_pointers:  # autograd must accumulate in place
            raise RuntimeError("a parameter's .grad is no longer a view into the flat gradient buffer")
        self._sync_device()
        t_compute = time.perf_counter() - t0
        if not self.finite_on_all_ranks(loss):
            return None
        compressor = self.dense if self.step < self.warmup_steps else self.compressor
        stats = compressor.step(self.flat_grad, self.step)
        grad_norm = clip_grad_norm_(self.flat_grad, self.cfg.optim.max_grad_norm)
        set_learning_rate(self.optimizer, learning_rate(self.cfg.optim, self.step, self.epoch))
        self.optimizer.step()
        self.step += 1
        return {"loss": float(loss.detach()), "grad_norm": grad_norm, "density": stats.density, "dense": float(stats.dense),
                "bytes_sent": stats.bytes_sent, "bytes_recv": stats.bytes_recv, "dense_bytes": stats.dense_bytes,
                "t_compute": t_compute, "t_select": stats.seconds_select, "t_comm": stats.seconds_comm,
                "extra": stats.extra}

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
        cfg, log = self.cfg, self.log
        self.broadcast_state()
        c = cfg.compression
        exchange = "dense allreduce" if c.algorithm == "dense" else (
            f"{c.algorithm} at density {c.density:g} after {self.warmup_steps} dense warm-up steps")
        log.info(f"{self.total_steps} optimizer steps ({self.steps_per_epoch} per epoch, global batch "
                 f"{cfg.train.global_batch_size} on {self.comm.size} rank(s)); {self.flat_grad.numel():,} "
                 f"parameters; gradient exchange: {exchange}")
        self.t_start, self.step_start = time.perf_counter(), self.step
        switch_logged, results = cfg.compression.algorithm == "dense", {}
        while self.epoch < cfg.train.epochs:
            self.sampler.set_epoch(self.epoch, start_batch=self.batch_in_epoch)
            self.train_set.set_epoch(self.epoch)  # selects the epoch's augmentation masks
            t_last = self.epoch_sums.t0 = time.perf_counter()
            for batch in make_loader(self.train_set, self.sampler, cfg.data.num_workers,
                                     pin_memory=self.device.type == "cuda"):
                if not switch_logged and self.step >= self.warmup_steps:
                    log.info(f"step {self.step}: {cfg.compression.algorithm} replaces dense allreduce "
                             f"(compression.warmup_steps resolved to {self.warmup_steps})")
                    switch_logged = True
                figures = self.train_step(batch.to(self.device, non_blocking=True))
                self.batch_in_epoch += 1
                if figures is None:
                    self.on_skipped_step()
                    continue
                self.nonfinite_in_row = 0
                self.cum_bytes_recv += figures["bytes_recv"]
                now = time.perf_counter()
                figures["t_step"], t_last = now - t_last, now
                self.window.add(figures)
                self.epoch_sums.add(figures)
                self.add_extra(figures["extra"])
                if self.step % cfg.train.log_every_steps == 0:
                    self.log_window(self.window)
                if cfg.train.checksum_every and self.step % cfg.train.checksum_every == 0:
                    self.check_replicas()
                if cfg.train.checkpoint_every_steps and self.step % cfg.train.checkpoint_every_steps == 0:
                    self.save("last.pt")
            self.epoch, self.batch_in_epoch = self.epoch + 1, 0
            self.log_epoch(self.epoch_sums)
            self.average_buffers()
            improved = False
            if cfg.train.eval_every_epochs and (self.epoch % cfg.train.eval_every_epochs == 0
                                                or self.epoch == cfg.train.epochs):
                results["dev"] = self.evaluate_set("val", self.dev_set)
                improved = results["dev"].get("wer", math.inf) < self.best_wer
                self.best_wer = min(self.best_wer, results["dev"].get("wer", math.inf))
            self.save("last.pt")
            if improved:
                copy_checkpoint(self.comm, self.checkpoint_dir / "last.pt", self.checkpoint_dir / "best.pt")
        if self.test_set is not None:
            results["test"] = self.evaluate_set("test", self.test_set)
        return results

    def on_skipped_step(self) -> None:
        self.skipped_steps += 1
        self.nonfinite_in_row += 1
        self.log.warn(f"epoch {self.epoch} batch {self.batch_in_epoch}: non-finite loss or gradient, step skipped "
                      f"({self.nonfinite_in_row} in a row, {self.skipped_steps} in total)")
        self.log.scalars("train", self.step, self.epoch, {"train/skipped_steps": self.skipped_steps})
        limit = self.cfg.train.max_nonfinite_in_row
        if self.nonfinite_in_row >= limit:
            raise FloatingPointError(f"stopping: {self.nonfinite_in_row} steps in a row had a non-finite loss or "
                                     f"gradient (train.max_nonfinite_in_row={limit}) at optimizer step {self.step}, "
                                     f"epoch {self.epoch}; lower optim.lr or check the data")

    # ------------------------------------------------------------------------------ logging
    def reduce_window(self, sums: Sums) -> dict | None:
        """Means over the window and over ranks (max over ranks for bytes received). Collective."""
        table = gather_rows(self.comm, torch.cat([sums.to_tensor(), torch.tensor([self.cum_bytes_recv],
                                                                                  dtype=torch.float64)]))
        count = float(table[0, len(STEP_KEYS)])
        wall = time.perf_counter() - sums.t0
        sums.reset()
        if count == 0:
            return None
        per_rank = {k: table[:, i] / count for i, k in enumerate(STEP_KEYS)}  # (P,) means per rank
        mean = {k: float(v.mean()) for k, v in per_rank.items()}
        ratio = mean["dense_bytes"] / mean["bytes_recv"] if mean["bytes_recv"] else 1.0
        return {**mean, "bytes_recv_max": float(per_rank["bytes_recv"].max()), "compression_ratio": ratio,
                "cum_bytes_recv": float(table[:, -1].mean()), "steps": count,
                "samples_per_sec": count * self.cfg.train.global_batch_size / max(wall, 1e-9), "wall": wall}

    def log_window(self, window: Sums) -> None:
        m = self.reduce_window(window)
        if m is None:
            return
        lr = self.optimizer.param_groups[0]["lr"]
        self.log.scalars("train", self.step, self.epoch, {
            "train/loss": m["loss"], "train/lr": lr, "train/grad_norm": m["grad_norm"],
            "train/samples_per_sec": m["samples_per_sec"],
            "comm/density": m["density"], "comm/bytes_sent": m["bytes_sent"], "comm/bytes_recv": m["bytes_recv"],
            "comm/bytes_recv_max": m["bytes_recv_max"], "comm/cum_bytes_recv": m["cum_bytes_recv"],
            "comm/compression_ratio": m["compression_ratio"], "comm/dense": m["dense"],
            "time/compute": m["t_compute"], "time/selection": m["t_select"], "time/communication": m["t_comm"],
            "time/step": m["t_step"], **self.reduce_extra()})
        done = self.step - self.step_start
        eta = (time.perf_counter() - self.t_start) / max(done, 1) * (self.total_steps - self.step)
        self.log.info(f"step {self.step}/{self.total_steps} epoch {self.epoch + 1} loss {m['loss']:.3f} lr {lr:.2e} "
                      f"samples/s {m['samples_per_sec']:.1f} density {m['density']:.4f} "
                      f"recv/step {format_bytes(m['bytes_recv'])} ETA {format_duration(eta)}")

    def add_extra(self, extra: dict[str, float]) -> None:
        """Sum the compressor's own figures like the others. An algorithm always reports the same
        keys, so the window is made at its first step, which is the same step on every rank."""
        if not extra:
            return
        if self.extra_window is None:
            self.extra_window = Sums(sorted(extra))
        self.extra_window.add(extra)

    def reduce_extra(self) -> dict[str, float]:
        """{comm/<algorithm>/<figure>: mean over the window and over ranks}. Collective."""
        if self.extra_window is None or self.extra_window.count == 0:
            return {}
        table = gather_rows(self.comm, self.extra_window.to_tensor())
        means = table[:, :-1].mean(0) / table[0, -1]
        self.extra_window.reset()
        name = self.cfg.compression.algorithm
        return {f"comm/{name}/{k}": float(v) for k, v in zip(self.extra_window.keys, means)}

    def log_epoch(self, sums: Sums) -> None:
        m = self.reduce_window(sums)
        if m is None:
            self.log.warn(f"epoch {self.epoch}: no optimizer step was taken")
            return
        self.log.scalars("epoch", self.step, self.epoch, {
            "epoch/loss": m["loss"], "epoch/density": m["density"], "epoch/bytes_recv": m["bytes_recv"],
            "epoch/compression_ratio": m["compression_ratio"], "epoch/seconds": m["wall"]})
        self.log.info(f"epoch {self.epoch} done: {int(m['steps'])} steps in {format_duration(m['wall'])}, "
                      f"loss {m['loss']:.3f}, mean density {m['density']:.4f}, recv/step "
                      f"{format_bytes(m['bytes_recv'])} (max rank {format_bytes(m['bytes_recv_max'])}), "
                      f"compression ratio {m['compression_ratio']:.1f}, skipped steps {self.skipped_steps}")

    def evaluate_set(self, prefix: str, dataset) -> dict:
        t0 = time.perf_counter()
        result = evaluate(self.model, dataset, self.comm, self.device, self.cfg.train.eval_batch_size,
                          self.cfg.data.num_workers)
        self.log.scalars(prefix, self.step, self.epoch, {f"{prefix}/{k}": v for k, v in result.summary.items()})
        text = ", ".join(f"{k} {v:.4f}" for k, v in result.summary.items())
        self.log.info(f"{prefix} after epoch {self.epoch} ({result.utterances} utterances, "
                      f"{time.perf_counter() - t0:.1f} s): {text}")
        return result.summary

    # ------------------------------------------------------------------------------ replicas
    def broadcast_state(self) -> None:
        """Rank 0's model and optimizer state everywhere, so all replicas start identical."""
        for t in self.model.state_dict().values():
            self.comm.bcast_(t, root=0)
        for state in self.optimizer.state.values():
            for t in state.values():
                if torch.is_tensor(t):
                    self.comm.bcast_(t, root=0)

    def average_buffers(self) -> None:
        """BatchNorm running statistics are computed from each rank's own data: average them (at epoch
        ends) so every replica evaluates and checkpoints the same model."""
        for buf in self.model.buffers():
            if buf.is_floating_point():
                self.comm.allreduce_(buf)
                buf /= self.comm.size

    def check_replicas(self) -> None:
        """Cheap checksum of all parameters, compared over ranks; replicas must be bit-identical."""
        with torch.no_grad():
            sums = torch.stack([torch.stack([p.double().sum(), p.double().abs().sum()]) for p in self.params]).sum(0)
        table = gather_rows(self.comm, sums.cpu())
        spread = (table.max(0).values - table.min(0).values).max().item()
        if spread != 0.0:
            raise RuntimeError(f"replicas differ at optimizer step {self.step}: parameter checksums per rank "
                               f"{table[:, 0].tolist()} (max - min = {spread:.3e})")

    def _sync_device(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # ------------------------------------------------------------------------------ checkpoints
    def save(self, filename: str) -> None:
        """Collective. Everything needed to continue exactly: see training/checkpoint.py."""
        shared = {"config": to_dict(self.cfg), "model": self.model.state_dict(),
                  "optimizer": self.optimizer.state_dict(), "warmup_steps": self.warmup_steps,
                  "progress": {"step": self.step, "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch,
                               "skipped_steps": self.skipped_steps, "nonfinite_in_row": self.nonfinite_in_row,
                               "best_wer": self.best_wer}}
        # BatchNorm statistics differ between ranks in mid-epoch checkpoints: keep each rank's own.
        buffers = {k: v.detach().cpu().clone() for k, v in self.model.named_buffers() if v.is_floating_point()}
        mine = {"compressor": self.compressor.state_dict(), "rng": rng_state(), "buffers": buffers,
                "cum_bytes_recv": self.cum_bytes_recv, "epoch_sums": (self.epoch_sums.totals, self.epoch_sums.count)}
        save_checkpoint(self.comm, self.checkpoint_dir / filename, shared, mine)

    @property
    def checkpoint_dir(self):
        return self.cfg.run_dir / "checkpoints"

    def restore(self, path) -> None:
        ckpt = load_checkpoint(path)
        mine = rank_state(ckpt, self.comm, path)
        if ckpt["config"]["model"]["name"] != self.cfg.model.name:
            raise ValueError(f"checkpoint {path} holds model {ckpt['config']['model']['name']!r}, "
                             f"the config asks for {self.cfg.model.name!r}")
        self.model.load_state_dict({**ckpt["model"], **mine["buffers"]})
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.compressor.load_state_dict(mine["compressor"])
        set_rng_state(mine["rng"])
        self.cum_bytes_recv = mine["cum_bytes_recv"]
        self.epoch_sums.totals, self.epoch_sums.count = dict(mine["epoch_sums"][0]), mine["epoch_sums"][1]
        for key, value in ckpt["progress"].items():
            setattr(self, key, value)
        if ckpt["warmup_steps"] != self.warmup_steps:
            self.log.warn(f"dense warm-up resolves to {self.warmup_steps} steps now, {ckpt['warmup_steps']} in the "
                          f"checkpoint (the run length changed); keeping {self.warmup_steps}")
        changed = [f"{k}" for k, v in _flat(to_dict(self.cfg)).items() if _flat(ckpt["config"]).get(k) != v]
        self.log.info(f"resumed from {path}: optimizer step {self.step}, epoch {self.epoch}, batch "
                      f"{self.batch_in_epoch}" + (f"; config keys changed since: {', '.join(changed)}" if changed else ""))


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) and v else {prefix + k: v})
    return out
