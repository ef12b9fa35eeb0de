"""Run logging on rank 0: console lines, TensorBoard scalars and metrics.jsonl (DESIGN 8).

metrics.jsonl: one JSON object per line, {"kind": train|epoch|dev|test, "step": optimizer steps taken,
"epoch": epochs completed, "time": unix time, <tag>: value, ...} with the TensorBoard tags as keys.
Other ranks hold a disabled logger (every call is a no-op), so the trainer calls it unconditionally.
Values that are not finite are never written (they are reported instead): a JSON or TensorBoard
curve never contains NaN.
Runs logged before the dev set's rename call it "val" (kind "val", tags val/*): readers go through
`current_name` / `read_metrics`, so old and new run directories compare as one.
"""
from __future__ import annotations

import gzip
import io
import json
import lzma
import math
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from sparse_asr.fileio import check_directory, open_append, open_regular

OLD_NAMES = {"val": "dev"}  # the dev set's name in runs logged before the rename


def current_name(name: str) -> str:
    """A kind or tag under today's name: 'val' -> 'dev', 'val/wer' -> 'dev/wer'; any other unchanged."""
    head, slash, rest = name.partition("/")
    return OLD_NAMES.get(head, head) + slash + rest


# A run kept in docs/results holds its metrics compressed (scripts/keep_runs.py): xz, or gzip before xz
ARCHIVE_OPENERS = {".xz": lzma.open, ".gz": gzip.open}


@contextmanager
def nothing(f):
    """The opener of an uncompressed file: the file itself."""
    yield f


def metrics_path(run_dir: str | Path) -> Path | None:
    """The run's metrics.jsonl, else metrics.jsonl.xz or .gz (a run kept in docs/results), else None."""
    for name in ("metrics.jsonl", *(f"metrics.jsonl{suffix}" for suffix in ARCHIVE_OPENERS)):
        if (Path(run_dir) / name).is_file():
            return Path(run_dir) / name
    return None


def read_metrics(run_dir: str | Path) -> list[dict]:
    """A run's metrics.jsonl (or .xz, .gz) rows with kinds and tags under today's names (NaN or Infinity is an
    error)."""
    path = metrics_path(run_dir) or Path(run_dir) / "metrics.jsonl"

    def refuse(constant):
        raise ValueError(f"non-finite value {constant} in {path}")

    # a regular file, never through a link planted at its name (a FIFO would hang the reader)
    with open_regular(path, "metrics file", follow=False) as raw, ARCHIVE_OPENERS.get(path.suffix, nothing)(raw) as f:
        rows = [json.loads(line, parse_constant=refuse) for line in io.TextIOWrapper(f, encoding="utf-8")
                if line.strip()]
    return [{current_name(k): current_name(v) if k == "kind" else v for k, v in row.items()} for row in rows]


def count_lines(path: Path) -> int:
    """Lines of a file, a last one without its newline included (read in chunks: metrics grow with the run)."""
    lines, last = 0, b"\n"
    with open_regular(path, "metrics file", follow=False) as f:
        while chunk := f.read(1 << 20):
            lines, last = lines + chunk.count(b"\n"), chunk[-1:]
    return lines + (last != b"\n")


class RunLogger:
    def __init__(self, run_dir: str | Path, enabled: bool, purge_step: int | None = None):
        self.enabled = enabled
        self.writer = None
        self.jsonl = None
        self.rows = 0  # lines in metrics.jsonl (a checkpoint records it; a resume keeps that many)
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            self.run_dir = Path(run_dir)
            run_dir = check_directory(run_dir, "run directory")  # through trusted links only
            run_dir.mkdir(parents=True, exist_ok=True)
            # purge_step: on resume, TensorBoard readers drop the events a crashed run wrote at steps >= it
            self.writer = SummaryWriter(log_dir=str(run_dir), purge_step=purge_step)
            self.jsonl = open_append(run_dir / "metrics.jsonl")  # never through a link planted at its name
            self.rows = count_lines(run_dir / "metrics.jsonl")

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
        line = {"kind": kind, "step": step, "epoch": epoch, "time": time.time(), **finite}
        with self.naming_the_run_dir():
            for tag, value in finite.items():
                self.writer.add_scalar(tag, value, step)
            self.jsonl.write((json.dumps(line, allow_nan=False) + "\n").encode())
            self.jsonl.flush()
        self.rows += 1

    def sync(self) -> None:
        """Everything logged so far on disk (fsync), before a checkpoint says how many rows it covers: a node
        that crashes after the checkpoint cannot leave those rows cut."""
        if self.enabled:
            with self.naming_the_run_dir():
                self.writer.flush()
                self.jsonl.flush()
                os.fsync(self.jsonl.fileno())

    @contextmanager
    def naming_the_run_dir(self):
        """A failed write (a full disk, a quota) names the run directory, not just the errno."""
        try:
            yield
        except OSError as e:
            raise OSError(e.errno, f"could not write metrics.jsonl or TensorBoard events in {self.run_dir}: "
                                   f"{e.strerror or e}") from e

    def close(self) -> None:
        if self.enabled:
            with self.naming_the_run_dir():
                self.writer.close()
                self.jsonl.close()
