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
from pathlib import Path

import torch


class RunLogger:
    def __init__(self, run_dir: str | Path, enabled: bool, purge_step: int | None = None):
        self.enabled = enabled
        self.writer = None
        self.jsonl = None
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            run_dir = Path(run_dir)
            run_dir.mkdir(parents=True, exist_ok=True)
            # purge_step: on resume, drop events a crashed run wrote after the checkpoint
            self.writer = SummaryWriter(log_dir=str(run_dir), purge_step=purge_step)
            self.jsonl = open(run_dir / "metrics.jsonl", "a")

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

    def close(self) -> None:
        if self.enabled:
            self.writer.close()
            self.jsonl.close()


class Sums:
    """Running sums of named figures over a window (log interval or epoch): means are sums / count,
    so nothing is kept in lists and an empty window simply has no means."""

    def __init__(self, keys: list[str]):
        self.keys = list(keys)
        self.reset()

    def reset(self) -> None:
        self.totals = dict.fromkeys(self.keys, 0.0)
        self.count = 0
        self.t0 = time.perf_counter()

    def add(self, values: dict[str, float]) -> None:
        for k in self.keys:
            self.totals[k] += float(values[k])
        self.count += 1

    def to_tensor(self) -> torch.Tensor:
        return torch.tensor([self.totals[k] for k in self.keys] + [float(self.count)], dtype=torch.float64)


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
