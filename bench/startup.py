"""What a process of this project pays before its first step: each stage of start-up timed in a fresh interpreter.
Every script, every MPI rank and most tests start such a process, so on 2 cores these seconds add up to much of
the test suite's time.

    .venv/bin/python bench/startup.py [--repeats 5] [--rows python "import torch" ...]

Rows (each a new `python -c`, run from the repository; the rows take turns, so drift hits them alike):
  python                  the interpreter alone: the floor of any process
  import torch            what every process here pays
  torch.optim.SGD         import torch, then torch's SGD built and stepped once on a small model
  MomentumSGD             the same with sparse_asr.training.optim.SGDStep (our SGD), as the trainer builds it
  compressor registry     import sparse_asr.compression (every compressor module)
  config check            python -m sparse_asr.training.check_config on configs/an4_cpu.yaml at 4 ranks: what
                          every submit script and sweep runs first
Prints a table: the median wall time of each row, its range, the median over the floor, and whether the process
imported torch._dynamo (torch.optim imports it on constructing an optimizer). Run it alone on a quiet machine.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODEL = "import torch; model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8)); "
STEP = "model(torch.randn(4, 64)).sum().backward(); "
ROWS = {
    "python": "pass",
    "import torch": "import torch",
    "torch.optim.SGD": MODEL + STEP + "torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9).step()",
    "MomentumSGD": MODEL + "from sparse_asr.training.config import OptimConfig; "
                   "from sparse_asr.training.optim import SGDStep, attach_flat_grad; "
                   "params = list(model.parameters()); flat = attach_flat_grad(params); "
                   + STEP + "SGDStep(params, OptimConfig(momentum=0.9)).after_exchange(flat, 0.1)",
    "compressor registry": "import sparse_asr.compression",
    "config check": "import runpy, sys; sys.argv = ['check_config', '--config', 'configs/an4_cpu.yaml', "
                    "'--world-size', '4']\ntry:\n runpy.run_module('sparse_asr.training.check_config', "
                    "run_name='__main__')\nexcept SystemExit as e:\n assert not e.code, e.code",
}
REPORT = "\nimport sys; print('torch._dynamo' in sys.modules)"


def time_row(code: str) -> tuple[float, bool]:
    """Wall seconds of a fresh interpreter running `code`, and whether it imported torch._dynamo."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code + REPORT], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"startup.py: the process failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    return seconds, proc.stdout.split()[-1] == "True"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="processes per row (default 5)")
    parser.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS),
                        help="the rows to time (default all; python, the floor, is always timed)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    times: dict[str, list[float]] = {row: [] for row in ROWS if row == "python" or row in args.rows}
    dynamo: dict[str, bool] = {}
    for _ in range(args.repeats):
        for row in times:
            seconds, dynamo[row] = time_row(ROWS[row])
            times[row].append(seconds)
    floor = statistics.median(times["python"])
    print(f"start-up of a fresh process, {args.repeats} per row (median, range in seconds)\n")
    print(f"| {'stage':<20} | median s | range s      | over the floor s | imports torch._dynamo |")
    print(f"|{'-' * 22}|---------:|--------------|-----------------:|-----------------------|")
    for row, values in times.items():
        median = statistics.median(values)
        span = f"{min(values):.2f}-{max(values):.2f}"
        print(f"| {row:<20} | {median:8.2f} | {span:<12} | {median - floor:16.2f} | "
              f"{'yes' if dynamo[row] else 'no':<21} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
