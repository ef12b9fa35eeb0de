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
