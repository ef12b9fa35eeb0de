"""Keep finished training runs small enough to commit: config.yaml, provenance.jsonl and metrics.jsonl as xz, and
the model's log-probabilities on a set where the run directory holds them (emissions_*.npz, evaluate.py --emissions).

    .venv/bin/python scripts/keep_runs.py bench/results/cell/runs/* --into docs/results/cell/runs

A run directory's checkpoints and TensorBoard events are far too large for a repository; its config, provenance
and metrics are what docs/results keeps, and compare_runs.py reads a kept run as it reads the live one. Only
finished runs (a test row in metrics.jsonl) are kept; the others are named and skipped, so the same command can
be rerun as runs finish. The checkout travels to GPU nodes beside the offline bundle under a size limit, so the
metrics are kept at the precision TensorBoard's event files hold (every float as a float32, written in its
shortest form; the wall clock to the millisecond): 40% fewer bytes after xz, tables change in the seventh digit
(a last printed digit can flip where it sits on a rounding boundary). A run already kept with the same files (its
metrics as .xz or, kept before, as .gz or at full precision) is left as it is; one kept with other files (say a run
of the same name from another setting) is an error, never overwritten. Symbolic links are refused, in the runs
read (another user's directory on a shared file system) and where the kept files would go.
"""
from __future__ import annotations

import argparse
import gzip
import json
import lzma
import os
import sys
from pathlib import Path

import numpy as np

from sparse_asr.fileio import atomic_write, open_no_follow


def read_no_follow(path: Path) -> bytes:
    with os.fdopen(open_no_follow(path, os.O_RDONLY), "rb") as f:
        return f.read()


def float32_digits(key: str, value):
    """A metric as an event file holds it: a float32, in the fewest digits that read back as that float32.
    The wall clock ("time", seconds since 1970) would lose minutes as a float32: it keeps its milliseconds."""
    if not isinstance(value, float):
        return value
    return round(value, 3) if key == "time" else float(str(np.float32(value)))


def digest(metrics: bytes) -> bytes:
    """metrics.jsonl with every float at float32 precision (float32_digits); the same keys, order and integers.
    Digesting a digest changes nothing."""
    lines = (json.loads(line) for line in metrics.decode("utf-8").splitlines() if line.strip())
    return "".join(json.dumps({k: float32_digits(k, v) for k, v in row.items()}) + "\n" for row in lines).encode()


def finished(metrics: bytes, path: Path) -> bool:
    """Whether a run's metrics.jsonl (its bytes, read from `path`) holds the test row a finished run ends with.
    Raises ValueError naming `path` when it is not JSON lines."""
    try:
        kinds = {json.loads(line).get("kind") for line in metrics.decode("utf-8").splitlines() if line.strip()}
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not JSON lines: {e}") from None
    return "test" in kinds


def kept_files(run_dir: Path) -> dict[str, bytes] | None:
    """The files to keep for `run_dir` (name -> bytes), or None when the run has not finished (no test row).
    Raises ValueError naming what is missing or wrong."""
    if run_dir.is_symlink():
        raise ValueError(f"{run_dir} is a symbolic link; refusing to follow it")
    for name in ("config.yaml", "metrics.jsonl"):
        if not os.path.lexists(run_dir / name):  # a symlink counts as there: reading it is refused below
            raise ValueError(f"{run_dir} has no {name}: not a run directory")
    metrics = read_no_follow(run_dir / "metrics.jsonl")
    if not finished(metrics, run_dir / "metrics.jsonl"):
        return None
    files = {"config.yaml": read_no_follow(run_dir / "config.yaml"),
             "metrics.jsonl.xz": lzma.compress(digest(metrics), preset=9 | lzma.PRESET_EXTREME)}
    if os.path.lexists(run_dir / "provenance.jsonl"):
        files["provenance.jsonl"] = read_no_follow(run_dir / "provenance.jsonl")
    for path in sorted(run_dir.glob("emissions_*.npz")):  # evaluate.py --emissions: decodable later
        files[path.name] = read_no_follow(path)
    return files


def texts(files: dict[str, bytes]) -> dict[str, bytes]:
    """Kept files by what they hold: metrics.jsonl.xz and .gz both as metrics.jsonl and its digest (a gzip header
    records a time and a name, and runs kept before xz hold .gz, before the digest full precision)."""
    decompress = {".xz": lzma.decompress, ".gz": gzip.decompress}
    held = {(name[:-3] if name[-3:] in decompress else name): decompress.get(name[-3:], bytes)(data)
            for name, data in files.items()}
    if "metrics.jsonl" in held:
        try:
            held["metrics.jsonl"] = digest(held["metrics.jsonl"])
        except ValueError:  # a truncated or foreign file: compared as it is, so it differs
            pass
    return held


def keep(run_dir: Path, into: Path) -> str:
    """Keep one run under into/<its name>; returns what happened ("kept", "already kept", "not finished")."""
    files = kept_files(run_dir)
    if files is None:
        return "not finished (no test WER yet): skipped"
    target = into / run_dir.name
    if target.is_symlink():
        raise ValueError(f"{target} is a symbolic link; refusing to write through it")
    if target.exists():
        present = {p.name: read_no_follow(p) for p in sorted(target.iterdir())}
        if texts(present) == texts(files):
            return "already kept"
        raise ValueError(f"{target} already holds a run with other files ({', '.join(sorted(present))}); "
                         f"not overwritten: remove it or keep {run_dir} under another name")
    for name, data in files.items():
        atomic_write(target / name, lambda f, data=data: f.write(data))
    return f"kept ({', '.join(files)})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (e.g. bench/results/NAME/runs/*)")
    parser.add_argument("--into", type=Path, required=True, help="directory to keep them under, one folder per run")
    args = parser.parse_args(argv)
    failed = False
    for run_dir in args.runs:
        try:
            print(f"{run_dir}: {keep(run_dir, args.into)}")
        except (ValueError, OSError) as e:
            print(f"keep_runs: {e}", file=sys.stderr)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
