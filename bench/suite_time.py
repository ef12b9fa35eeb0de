"""Where the test suite's time goes: the wall and CPU seconds of every test, counting every process it started and
waited for (MPI ranks, scripts, benches), by test file, beside what the cores could have given.

    bash scripts/test.sh -p bench.suite_time --suite-time-dir DIR [pytest arguments]   # record, on any workers
    .venv/bin/python bench/suite_time.py DIR [--top 25] [--cores N]                      # the tables

As a pytest plugin (-p bench.suite_time) it appends a row per test (node id, wall s, CPU s) to DIR/<pid>.tsv, one file
per xdist worker (DIR must be new or empty). A test's CPU is getrusage(SELF) + getrusage(CHILDREN) across it: every
process it waited for is counted (mpiexec waits for its ranks), one it left running is not. Record on a quiet machine:
anything beside the suite stretches the wall figures, and a test's CPU includes what its processes lost to contention.
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from sparse_asr.fileio import RECORD_BYTES, check_directory, open_append, read_text


def cpu_seconds() -> float:
    """User + system CPU of this process and of every child it has waited for (and theirs)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


# ------------------------------------------------------------------------------------------ the plugin
def pytest_addoption(parser):
    parser.addoption("--suite-time-dir", metavar="DIR", help="bench/suite_time.py: where to write each test's "
                                                              "wall and CPU seconds")


def pytest_configure(config):
    """The folder made, or refused when it cannot hold this run's times alone (another run's rows would add to these),
    once, before the workers start."""
    folder = config.getoption("--suite-time-dir")
    if not folder or hasattr(config, "workerinput"):
        return
    try:
        os.makedirs(check_directory(folder, "the folder"), exist_ok=True)
    except OSError as e:  # UnsafePathError too: a file or a dangling link at the name
        raise pytest.UsageError(f"--suite-time-dir: {e}") from None
    if list(Path(folder).glob("*.tsv")):
        raise pytest.UsageError(f"--suite-time-dir {folder} holds the times of another run; give a new or empty "
                                f"folder")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Times the whole protocol (setup, call, teardown): a module fixture counts in the test that builds it."""
    folder = item.config.getoption("--suite-time-dir")
    wall, cpu = time.perf_counter(), cpu_seconds()
    yield
    if folder:
        wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
        with open_append(os.path.join(folder, f"{os.getpid()}.tsv")) as f:  # no link, no FIFO at the name
            f.write(f"{item.nodeid}\t{wall:.3f}\t{cpu:.3f}\n".encode())


# ------------------------------------------------------------------------------------------ the report
def read_rows(folder: Path) -> dict[str, list[tuple[str, float, float]]]:
    """{worker file: [(node id, wall s, CPU s), ...]}."""
    workers = {}
    for path in sorted(folder.glob("*.tsv")):
        rows = []
        try:
            text = read_text(path, 16 * RECORD_BYTES, "record")
        except OSError as e:  # UnsafePathError too: a link, a FIFO, an oversized file
            raise SystemExit(f"suite_time.py: error: {e}")
        for number, line in enumerate(text.splitlines(), start=1):
            fields = line.split("\t")
            try:
                rows.append((fields[0], float(fields[1]), float(fields[2])))
            except (IndexError, ValueError):
                raise SystemExit(f"suite_time.py: error: {path}:{number}: expected 'node id<TAB>wall<TAB>cpu', "
                                 f"got {line!r}")
        workers[path.name] = rows
    if not workers:
        raise SystemExit(f"suite_time.py: error: no *.tsv in {folder} (record with: bash scripts/test.sh -p "
                         f"bench.suite_time --suite-time-dir {folder})")
    return workers


def report(workers: dict[str, list[tuple[str, float, float]]], cores: int, top: int) -> str:
    rows = [row for worker in workers.values() for row in worker]
    busiest = max(sum(wall for _, wall, _ in worker) for worker in workers.values())  # the suite's wall, tests only
    total_cpu = sum(cpu for _, _, cpu in rows)
    lines = [f"{len(rows)} tests on {len(workers)} worker(s); the busiest worker's tests took {busiest:.0f} s, "
             f"{cores} cores x {busiest:.0f} s = {cores * busiest:.0f} core-seconds, of which the tests used "
             f"{total_cpu:.0f} s of CPU ({100 * total_cpu / (cores * busiest):.0f}%)", ""]
    by_file: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for node, wall, cpu in rows:
        entry = by_file[node.split("::")[0]]
        entry[0] += 1
        entry[1] += wall
        entry[2] += cpu
    lines += ["| file | tests | wall s | CPU s | share of the CPU |", "|---|---:|---:|---:|---:|"]
    for name, (count, wall, cpu) in sorted(by_file.items(), key=lambda item: -item[1][2]):
        lines.append(f"| {name} | {count} | {wall:.1f} | {cpu:.1f} | {100 * cpu / total_cpu:.1f}% |")
    lines += ["", f"The {min(top, len(rows))} tests using the most CPU:", "",
              "| test | wall s | CPU s |", "|---|---:|---:|"]
    for node, wall, cpu in sorted(rows, key=lambda row: -row[2])[:top]:
        lines.append(f"| {node} | {wall:.1f} | {cpu:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="the --suite-time-dir of a recorded run")
    parser.add_argument("--top", type=int, default=25, help="the tests listed by CPU (default 25)")
    parser.add_argument("--cores", type=int, default=os.cpu_count(), help="the cores the suite ran on "
                                                                         "(default: this machine's)")
    args = parser.parse_args(argv)
    if args.top < 0 or args.cores < 1:
        parser.error("--top must be >= 0 and --cores >= 1")
    if not args.folder.is_dir():
        parser.error(f"{args.folder} is not a directory")
    print(report(read_rows(args.folder), args.cores, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
