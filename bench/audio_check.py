"""Time the audio check a run makes before its first step (training/runtime.check_manifest_audio: every
row's header read, the rows shared among the ranks, the problems gathered).

    .venv/bin/mpiexec -n P .venv/bin/python bench/audio_check.py [MANIFEST ...] [--repeats 5]

Prints one line per repeat: the rows checked and the wall time of the whole collective check (the
slowest rank's, as a run waits for it). The files are in the page cache after the first repeat.
"""
import argparse
import time

from sparse_asr.comm import Communicator
from sparse_asr.data.manifest import read_manifest
from sparse_asr.training.runtime import check_manifest_audio


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("manifests", nargs="*", default=["manifests/an4_train.csv"])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    comm = Communicator()
    frames = [read_manifest(m) for m in args.manifests]
    for repeat in range(args.repeats):
        comm.barrier()
        t0 = time.perf_counter()
        rows = check_manifest_audio(comm, frames)
        seconds = max(comm.allgather_object(time.perf_counter() - t0))
        if comm.rank == 0:
            print(f"P={comm.size} repeat {repeat}: {rows} rows checked in {seconds * 1000:.1f} ms", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
