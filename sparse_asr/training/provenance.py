"""Where a run ran and on which code: written to RUN_DIR/provenance.jsonl (one line per start or resume, so a
run continued on another node says so) and printed in the log header. Figures from different CPUs, kernels
or commits do not compare (docs/results.md); this makes every run say which it was."""
from __future__ import annotations

import datetime
import json
import os
import platform
import socket
import subprocess
from importlib import metadata
from pathlib import Path

import torch

from sparse_asr.comm.mpi import load_mpi
from sparse_asr.fileio import open_append
from sparse_asr.training.runtime import cpu_model

REPO = Path(__file__).resolve().parent.parent.parent


def code_version(repo: Path = REPO) -> dict:
    """{"commit", "modified"} of the checkout; in an offline bundle (no .git) the commit it was built from."""
    try:
        commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip()
        if commit:
            status = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                                    capture_output=True, text=True, timeout=10).stdout
            return {"commit": commit, "modified": bool(status.strip())}
    except (OSError, subprocess.SubprocessError):
        pass
    bundle = repo / "BUNDLE.md"  # scripts/pack_offline.sh: "... from commit <describe>"
    if bundle.is_file() and " from commit " in bundle.read_text():
        described = bundle.read_text().split(" from commit ", 1)[1].split()[0]
        return {"commit": described.removesuffix("-dirty"), "modified": described.endswith("-dirty")}
    return {"commit": "unknown", "modified": None}


def mpi_library() -> str:
    try:
        return load_mpi().Get_library_version().splitlines()[0].strip()
    except Exception:  # noqa: BLE001 -- no MPI: one process
        return "none"


def provenance(ranks: int, device: torch.device) -> dict:
    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {"time": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "host": socket.gethostname(), "ranks": ranks, "device": str(device), "gpu": gpu,
            "cpu": cpu_model(), "cpu_dispatch": torch.backends.cpu.get_cpu_capability(), "cores": os.cpu_count(),
            "code": code_version(), "python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "mpi4py": version("mpi4py"), "mpi": mpi_library()}


def summary(record: dict) -> str:
    """The log header's line."""
    code = record["code"]
    return (f"code {code['commit'][:12]}{' (modified)' if code['modified'] else ''}, host {record['host']}, "
            f"{record['ranks']} rank(s), {record['gpu'] or record['cpu']} (torch dispatch {record['cpu_dispatch']}, "
            f"{record['cores']} cores), torch {record['torch']}, mpi4py {record['mpi4py']}, {record['mpi']}")


def append_provenance(run_dir: Path, record: dict) -> None:
    with open_append(Path(run_dir) / "provenance.jsonl") as f:
        f.write((json.dumps(record) + "\n").encode())
        f.flush()
        os.fsync(f.fileno())
