"""What a run measures, between the step and the log (DESIGN 2, step 7): each step's StepRecord, the
MetricWindow that sums records over a log interval or an epoch, the tag tables that name the figures in
TensorBoard, and the RunMeter that owns every counter of a run (the windows, the bytes received since the
start, synchronized BatchNorm's traffic, which exchange the steps use). Everything the meter reduces
over ranks it reduces in one collective per log line."""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from sparse_asr.compression.base import StepStats
from sparse_asr.models.sync_batchnorm import COUNT_AS as SYNCBN_OP


@dataclass
class StepRecord:
    """One optimizer step on one rank, as the trainer returns it: its own figures and the compressor's
    StepStats as they are."""

    loss: float
    grad_norm: float
    seconds_compute: float  # zero grad + forward + loss + backward (device synchronised)
    stats: StepStats
    seconds_step: float = 0.0  # wall time since the previous step ended (set by the loop)

    def figures(self) -> dict[str, float]:
        """Every figure by its field name; the compressor's own extras as '<algorithm>/<name>'."""
        st = self.stats
        return {"loss": self.loss, "grad_norm": self.grad_norm, "seconds_compute": self.seconds_compute,
                "seconds_step": self.seconds_step, "seconds_select": st.seconds_select,
                "seconds_comm": st.seconds_comm, "bytes_sent": st.bytes_sent, "bytes_recv": st.bytes_recv,
                "dense_bytes": st.dense_bytes, "messages": st.messages, "density": st.achieved_density,
                "dense": float(st.dense), **{f"{st.algorithm}/{k}": v for k, v in st.extra.items()}}


# Field name -> TensorBoard tag, for the figures logged every `log_every_steps` (means over the window
# and over ranks). Extras '<algorithm>/<name>' become 'comm/<algorithm>/<name>'.
TRAIN_TAGS = {
    "loss": "train/loss", "grad_norm": "train/grad_norm", "samples_per_sec": "train/samples_per_sec",
    "density": "comm/density", "dense": "comm/dense", "bytes_sent": "comm/bytes_sent",
    "bytes_recv": "comm/bytes_recv", "bytes_recv_max": "comm/bytes_recv_max", "messages": "comm/messages",
    "compression_ratio": "comm/compression_ratio", "seconds_compute": "time/compute",
    "seconds_select": "time/selection", "seconds_comm": "time/communication", "seconds_step": "time/step",
}
EPOCH_TAGS = {"loss": "epoch/loss", "density": "epoch/density", "bytes_recv": "epoch/bytes_recv",
              "compression_ratio": "epoch/compression_ratio", "wall": "epoch/seconds"}


def compression_ratio(dense_bytes: float, bytes_recv: float) -> float:
    """Dense allreduce bytes / bytes received; 1.0 when nothing moved at all (P = 1)."""
    return dense_bytes / bytes_recv if bytes_recv else 1.0


class MetricWindow:
    """Running sums of StepRecord figures over a window (a log interval or an epoch): means are sums /
    counts, so nothing is kept in lists and an empty window has no means. Each figure has its own count
    (extras exist only after the dense warm-up), and every rank sees the same figures on the same steps,
    so the window reduces over ranks in one collective."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.steps = 0
        self.t0 = time.perf_counter()

    def add(self, record: StepRecord) -> None:
        for key, value in record.figures().items():
            self.sums[key] = self.sums.get(key, 0.0) + float(value)
            self.counts[key] = self.counts.get(key, 0) + 1
        self.steps += 1

    def state_dict(self) -> dict:
        return {"sums": dict(self.sums), "counts": dict(self.counts), "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.sums, self.counts, self.steps = dict(state["sums"]), dict(state["counts"]), int(state["steps"])

    def reduce(self, comm, global_batch: int, totals: dict[str, float] | None = None) -> dict[str, float] | None:
        """Collective. {figure: mean over the window and over ranks} plus bytes_recv_max (max over ranks),
        compression_ratio, samples_per_sec, steps and wall, and the mean over ranks of each of `totals`
        (running figures outside the window); None if no step was taken. Resets the window."""
        keys, totals = sorted(self.sums), totals or {}
        row = torch.tensor([self.sums[k] for k in keys] + [self.counts[k] for k in keys] + [self.steps]
                           + list(totals.values()), dtype=torch.float64)
        wall = time.perf_counter() - self.t0
        steps = self.steps
        self.reset()
        table = comm.gather_rows(row)  # the same keys on every rank, so one collective, no size exchange
        if steps == 0:
            return None
        per_rank = table[:, :len(keys)] / table[:, len(keys):2 * len(keys)]
        out = {k: float(per_rank[:, i].mean()) for i, k in enumerate(keys)}
        out.update({k: float(table[:, 2 * len(keys) + 1 + i].mean()) for i, k in enumerate(totals)})
        out["bytes_recv_max"] = float(per_rank[:, keys.index("bytes_recv")].max())
        out["compression_ratio"] = compression_ratio(out["dense_bytes"], out["bytes_recv"])
        out.update(steps=float(steps), wall=wall, samples_per_sec=steps * global_batch / max(wall, 1e-9))
        return out


def tagged(means: dict[str, float], tags: dict[str, str], with_extras: bool = False) -> dict[str, float]:
    """The figures that have a tag, under their tags (and the extras '<algorithm>/<name>' as comm/...)."""
    out = {tag: means[key] for key, tag in tags.items() if key in means}
    if with_extras:
        out.update({f"comm/{key}": v for key, v in means.items() if "/" in key})
    return out


class RunMeter:
    """Every counter of a run; the Trainer feeds it each step's record and asks it for a log line's or an
    epoch's figures. Its state (bytes received so far, the epoch's window) travels in checkpoints, so a
    resumed run's curves continue where they were."""

    def __init__(self, comm, global_batch: int, syncbn: bool):
        self.comm, self.global_batch, self.syncbn = comm, global_batch, syncbn
        self.window, self.epoch_window = MetricWindow(), MetricWindow()  # since the last log line; this epoch
        self.cum_bytes_recv = 0.0  # this rank's, since the run started
        self.algorithm: str | None = None  # the exchange of the last step
        self.syncbn_logged = comm.counts(SYNCBN_OP).bytes_recv  # the Communicator's, at the last log line
        self.t_last = time.perf_counter()

    def start_epoch(self) -> None:
        self.t_last = self.epoch_window.t0 = time.perf_counter()

    def add(self, record: StepRecord) -> str | None:
        """Count one step taken; returns the exchange's name when it changed (the first step, the end of the
        dense warm-up), else None."""
        now = time.perf_counter()
        record.seconds_step, self.t_last = now - self.t_last, now
        self.cum_bytes_recv += record.stats.bytes_recv
        self.window.add(record)
        self.epoch_window.add(record)
        switched, self.algorithm = record.stats.algorithm != self.algorithm, record.stats.algorithm
        return self.algorithm if switched else None

    def interval(self) -> tuple[dict[str, float], dict[str, float]] | None:
        """Collective: (means over the log interval and over ranks by field name, the same under their
        TensorBoard tags), or None if no step was taken since the last line."""
        m = self.window.reduce(self.comm, self.global_batch, totals={"cum_bytes_recv": self.cum_bytes_recv})
        if m is None:
            return None
        tags = {**tagged(m, TRAIN_TAGS, with_extras=True), "comm/cum_bytes_recv": m["cum_bytes_recv"]}
        if self.syncbn:  # its allreduces have the same size on every rank: this rank's count is everyone's
            total = self.comm.counts(SYNCBN_OP).bytes_recv
            tags["comm/syncbn_bytes_recv"] = (total - self.syncbn_logged) / m["steps"]
            self.syncbn_logged = total
        return m, tags

    def epoch_end(self) -> tuple[dict[str, float], dict[str, float]] | None:
        """Collective: the epoch's means (by field name, and under the epoch tags), or None if no step was taken."""
        m = self.epoch_window.reduce(self.comm, self.global_batch)
        return None if m is None else (m, tagged(m, EPOCH_TAGS))

    def log_interval(self, log, progress, total_steps: int, lr: float, eta_seconds: float) -> None:
        """Collective: the interval's figures (and the learning rate) to the run's log and the console."""
        reduced = self.interval()
        if reduced is None:
            return
        m, tags = reduced
        p = progress
        log.scalars("train", p.step, p.epoch, {**tags, "train/lr": lr})
        log.info(f"step {p.step}/{total_steps} epoch {p.epoch + 1} loss {m['loss']:.3f} lr {lr:.2e} "
                 f"samples/s {m['samples_per_sec']:.1f} density {m['density']:.4f} "
                 f"recv/step {format_bytes(m['bytes_recv'])} ETA {format_duration(eta_seconds)}")

    def log_epoch(self, log, progress) -> None:
        """Collective: the epoch's figures to the run's log and the console."""
        reduced = self.epoch_end()
        p = progress
        if reduced is None:
            log.warn(f"epoch {p.epoch}: no optimizer step was taken")
            return
        m, tags = reduced
        log.scalars("epoch", p.step, p.epoch, tags)
        log.info(f"epoch {p.epoch} done: {int(m['steps'])} steps in {format_duration(m['wall'])}, "
                 f"loss {m['loss']:.3f}, mean density {m['density']:.4f}, recv/step "
                 f"{format_bytes(m['bytes_recv'])} (max rank {format_bytes(m['bytes_recv_max'])}), "
                 f"compression ratio {m['compression_ratio']:.1f}, skipped steps {p.skipped_steps}")

    @staticmethod
    def log_scores(log, prefix: str, progress, result, seconds: float) -> None:
        """An evaluation's summary (WER, CER, ...) under prefix/ (dev or test) to the run's log and the console."""
        p = progress
        scalars = {f"{prefix}/{k}": v for k, v in result.summary.items()}
        text = f"{result.decoder}: " + ", ".join(f"{k} {v:.4f}" for k, v in result.summary.items())
        for name, summary in list(result.by_decoder.items())[1:]:  # the beam beside greedy (train.eval_decoder)
            scores = {k: v for k, v in summary.items() if k != "loss"}
            scalars.update({f"{prefix}/beam_{k}": v for k, v in scores.items()})
            text += f"; {name}: " + ", ".join(f"{k} {v:.4f}" for k, v in scores.items())
        log.scalars(prefix, p.step, p.epoch, scalars)
        log.info(f"{prefix} after epoch {p.epoch} ({result.utterances} utterances, {seconds:.1f} s): {text}")

    def state_dict(self) -> dict:
        """What a checkpoint keeps of the meter (opaque to the checkpoint: RankState.meter)."""
        return {"cum_bytes_recv": self.cum_bytes_recv, "epoch_window": self.epoch_window.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.cum_bytes_recv = state["cum_bytes_recv"]
        self.epoch_window.load_state_dict(state["epoch_window"])


def format_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def format_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GB"
