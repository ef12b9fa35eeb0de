"""How MPICH's waiting ranks share the cores of an oversubscribed node: spinning (sched_yield, MPICH's default)
against sleeping (MPIR_CVAR_ENABLE_HEAVY_YIELD=1, what sparse_asr.comm.mpi sets when a node has more ranks than
cores).

    .venv/bin/python bench/mpi_yield.py [--ranks 2 4 8] [--seconds 0.5] [--rounds 4]

Two patterns, each ROUNDS rounds of SECONDS of CPU work (a busy loop on the process's CPU clock, so its cost does
not depend on how the cores are shared) followed by a barrier:
  one at a time  round r: rank r mod P works, the others wait in the barrier (start-up, an uneven shard, rank 0's
                 evaluation); floor = ROUNDS x SECONDS, the work itself
  all at once    every rank works, then the barrier (a balanced step); floor = ROUNDS x SECONDS x P / min(P, cores)
Prints a table: the wall time of each pattern under both settings (rank 0's, from the first barrier to the last),
the floor beside them, and spinning / sleeping. Run it alone: anything else on the cores is in the figures.
"""
import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from sparse_asr.comm.mpi import YIELD_VARIABLE, load_mpi

REPO = Path(__file__).resolve().parent.parent
PATTERNS = ("one at a time", "all at once")


def burn(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def worker(seconds: float, rounds: int) -> None:
    comm = load_mpi().COMM_WORLD
    for pattern in PATTERNS:
        comm.Barrier()
        t0 = time.perf_counter()
        for r in range(rounds):
            if pattern == "all at once" or r % comm.size == comm.rank:
                burn(seconds)
            comm.Barrier()
        if comm.rank == 0:
            print(f"{pattern}\t{time.perf_counter() - t0:.3f}", flush=True)


def measure(ranks: int, heavy_yield: str, seconds: float, rounds: int) -> dict[str, float]:
    mpiexec = Path(sys.executable).parent / "mpiexec"
    env = {**os.environ, YIELD_VARIABLE: heavy_yield, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([str(mpiexec), "-n", str(ranks), sys.executable, __file__, "--worker",
                           "--seconds", str(seconds), "--rounds", str(rounds)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"mpi_yield.py: mpiexec -n {ranks} failed ({proc.returncode}): {proc.stderr.strip()}")
    return {pattern: float(wall) for pattern, wall in (line.split("\t") for line in proc.stdout.splitlines())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--seconds", type=float, default=0.5, help="CPU seconds of work per round")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.seconds, args.rounds)
        return 0
    cores = len(os.sched_getaffinity(0))
    print(f"{cores} cores; {args.rounds} rounds of {args.seconds} s of CPU work per working rank\n")
    print("| P | pattern | floor (s) | spinning (s) | sleeping (s) | spinning / sleeping |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    for ranks in args.ranks:
        spinning = measure(ranks, "0", args.seconds, args.rounds)
        sleeping = measure(ranks, "1", args.seconds, args.rounds)
        for pattern in PATTERNS:
            floor = args.rounds * args.seconds * (ranks / min(ranks, cores) if pattern == "all at once" else 1)
            print(f"| {ranks} | {pattern} | {floor:.2f} | {spinning[pattern]:.2f} | {sleeping[pattern]:.2f} | "
                  f"{spinning[pattern] / sleeping[pattern]:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
