"""Run logging on rank 0: console lines, TensorBoard scalars and metrics.jsonl (DESIGN 8).

metrics.jsonl: one JSON object per line, {"kind": train|epoch|val|test, "step": optimizer steps taken,
"epoch": epochs completed, "time": unix time, <tag>: value, ...} with the TensorBoard tags as keys.
Other ranks hold a disabled logger (every call is a no-op), so the trainer calls it unconditionally.
Values that are not finite are never written (they are reported instead): a JSON or TensorBoard
curve never contains NaN.
"""
from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from sparse_asr.compression.base import StepStats


class RunLogger:
    def __init__(self, run_dir: str | Path, enabled: bool, purge_step: int | None = None):
        self.enabled = enabled
        self.writer = None
        self.jsonl = None
        self.rows = 0  # lines in metrics.jsonl (a checkpoint records it; a resume keeps that many)
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            run_dir = Path(run_dir)
            run_dir.mkdir(parents=True, exist_ok=True)
            # purge_step: on resume, TensorBoard readers drop the events a crashed run wrote at steps >= it
            self.writer = SummaryWriter(log_dir=str(run_dir), purge_step=purge_step)
            path = run_dir / "metrics.jsonl"
            self.rows = len(path.read_bytes().splitlines()) if path.exists() else 0
            self.jsonl = open(path, "a")

    def info(self, message: str) -> None:
        if self.enabled:
            print(message, flush=True)

    def warn(self, message: str) -> None:
        if self.enabled:
            print(f"WARNING: {message}", file=sys.stderr, flush=True)

    def scalars(self, kind: str, step: int, epoch: int, values: dict[str, float]) -> None:
        """One JSON line {kind, step, epoch, time, tag: value...} and one TensorBoard point per tag."""
        if not self.enabled:
            return
        finite = {k: float(v) for k, v in values.items() if math.isfinite(float(v))}
        dropped = sorted(set(values) - set(finite))
        if dropped:
            self.warn(f"step {step}: not logging non-finite {', '.join(dropped)}")
        for tag, value in finite.items():
            self.writer.add_scalar(tag, value, step)
        line = {"kind": kind, "step": step, "epoch": epoch, "time": time.time(), **finite}
        self.jsonl.write(json.dumps(line, allow_nan=False) + "\n")
        self.jsonl.flush()
        self.rows += 1

    def close(self) -> None:
        if self.enabled:
            self.writer.close()
            self.jsonl.close()


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
                "dense_bytes": st.dense_bytes, "messages": st.messages, "density": st.density,
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

    def reduce(self, comm, global_batch: int) -> dict[str, float] | None:
        """Collective. {figure: mean over the window and over ranks} plus bytes_recv_max (max over ranks),
        compression_ratio, samples_per_sec, steps and wall; None if no step was taken. Resets the window."""
        keys = sorted(self.sums)
        row = torch.tensor([self.sums[k] for k in keys] + [self.counts[k] for k in keys] + [self.steps],
                           dtype=torch.float64)
        wall = time.perf_counter() - self.t0
        steps = self.steps
        self.reset()
        table = gather_rows(comm, row)  # (P, 2 * len(keys) + 1), the same keys on every rank
        if steps == 0:
            return None
        per_rank = table[:, :len(keys)] / table[:, len(keys):2 * len(keys)]
        out = {k: float(per_rank[:, i].mean()) for i, k in enumerate(keys)}
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


def gather_rows(comm, vec: torch.Tensor) -> torch.Tensor:
    """Every rank's small 1-D tensor (same length everywhere) as a (P, len) table: one collective,
    no size exchange. Used to reduce per-rank figures to means and maxima for logging."""
    table, _ = comm.allgatherv(vec.contiguous(), counts=[vec.numel()] * comm.size)
    return table.view(comm.size, -1)


def reduce_over_ranks(comm, mine: dict[str, float]) -> dict[str, float]:
    """{key_mean, key_max} over ranks of each of this rank's figures (two small allreduces; collective)."""
    keys = sorted(mine)
    total = torch.tensor([float(mine[k]) for k in keys], dtype=torch.float64)
    peak = total.clone()
    comm.allreduce_(total, "sum")
    comm.allreduce_(peak, "max")
    out = {}
    for i, key in enumerate(keys):
        out[f"{key}_mean"] = total[i].item() / comm.size
        out[f"{key}_max"] = peak[i].item()
    return out


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
