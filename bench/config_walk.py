"""The walk of the configuration through start-up: which functions receive it, in which modules, whether any
climbs back out of the package into a script, and how often the configuration is parsed and resolved. Traced,
not read: start-up runs for real (one process, the given config and overrides), as train.py runs it from its
parsed arguments (read_request, then launch.run_job) until the trainer is about to train (`Trainer.fit`, which
is not entered), and every Python call on the way is looked at.

A stop: a function or method of this repository (the package, train.py, scripts/, bench/) called with the run's
configuration among its arguments: the `Config` or one of its sections (any dataclass defined in
sparse_asr/training/config.py). A climb: a stop outside the package (train.py, scripts/, bench/). Each stop counts
once, however often it is called; `repeated` lists the stops given the whole `Config` more than once. Parses:
calls of config.build_config (a mapping, a file's or a checkpoint's, made a validated Config); resolutions: calls
of config.resolve_world_size. With --resume the walk is of a resumed start: a one-epoch run is trained first
(untraced) in the same throw-away directory, then continued for one more epoch.

    .venv/bin/python bench/config_walk.py --config configs/smoke.yaml [--resume] [key=value ...] [--list]
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import sys
import tempfile
from pathlib import Path

import sparse_asr
from sparse_asr.comm import Communicator
from sparse_asr.training import config as config_module
from sparse_asr.training import launch
from sparse_asr.training.plan import read_request
from sparse_asr.training.trainer import Trainer

PACKAGE = Path(sparse_asr.__file__).resolve().parent
REPO = PACKAGE.parent
COUNTED = {"build_config": "parses", "resolve_world_size": "resolutions"}  # config.py's functions counted by call


class StartUpDone(Exception):
    """Raised where training would begin: the walk ends there."""


@dataclasses.dataclass
class Walk:
    stops: list[tuple[str, str]]  # (module path relative to the repository, qualified name), in first-call order
    calls: dict[tuple[str, str], int]  # of each stop given the whole Config
    parses: int
    resolutions: int

    @property
    def repeated(self) -> dict[tuple[str, str], int]:
        return {stop: n for stop, n in self.calls.items() if n > 1}


def carries_config(value) -> bool:
    kind = type(value)  # (the type only: some libraries' objects answer attribute lookups strangely)
    return kind.__module__ == config_module.__name__ and dataclasses.is_dataclass(kind)


@functools.lru_cache(maxsize=None)  # asked on every Python call of the start-up
def repository_module(filename: str) -> str | None:
    """The file's path relative to the repository if it is the project's own code (not .venv, not tests)."""
    path = Path(filename)
    if not path.is_absolute():
        return None  # dataclasses' generated methods ("<string>"), frozen modules
    try:
        relative = path.resolve().relative_to(REPO)
    except ValueError:
        return None
    top = relative.parts[0]
    return str(relative) if top in (PACKAGE.name, "scripts", "bench") or len(relative.parts) == 1 else None


def start(config: str | None, overrides: list[str], resume: str = "") -> None:
    """What train.py's main does once its arguments are parsed (without MPI's start-up guard)."""
    comm = Communicator()
    launch.run_job(comm, read_request(config, overrides, resume))


def walk(config: str | None, overrides: list[str], resume: str = "") -> Walk:
    """Trace one start-up up to training."""
    stops: dict[tuple[str, str], None] = {}
    calls: collections.Counter = collections.Counter()
    counted: collections.Counter = collections.Counter()
    config_file = config_module.__file__

    def on_call(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if code.co_filename == config_file and code.co_name in COUNTED:
            counted[COUNTED[code.co_name]] += 1
        module = repository_module(code.co_filename)
        if module is None:
            return
        n_args = code.co_argcount + code.co_kwonlyargcount
        arguments = [frame.f_locals.get(name) for name in code.co_varnames[:n_args]]
        if any(carries_config(a) for a in arguments):
            stops.setdefault((module, code.co_qualname), None)
            if any(isinstance(a, config_module.Config) for a in arguments):
                calls[module, code.co_qualname] += 1

    def stop_here(self, *args, **kwargs):
        raise StartUpDone

    original_fit, Trainer.fit = Trainer.fit, stop_here
    sys.setprofile(on_call)
    try:
        start(config, overrides, resume)
    except StartUpDone:
        pass
    finally:
        sys.setprofile(None)
        Trainer.fit = original_fit
    return Walk(list(stops), dict(calls), counted["parses"], counted["resolutions"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--resume", action="store_true", help="walk a resumed start (train.py --resume RUN_DIR)")
    parser.add_argument("--list", action="store_true", help="print every stop")
    parser.add_argument("overrides", nargs="*", help="key=value, as train.py takes them")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as out_dir:  # the run's directory: thrown away
        overrides = [f"out_dir={out_dir}", "name=walk", *args.overrides]
        if args.resume:
            start(args.config, [*overrides, "train.epochs=1"])  # trained for real: a checkpoint to continue
            traced = walk(None, ["train.epochs=2"], str(Path(out_dir) / "walk"))
        else:
            traced = walk(args.config, overrides)
    if not traced.stops:
        sys.exit("config_walk: no function received the configuration: nothing was traced (wrong tree?)")
    modules = sorted({module for module, _ in traced.stops})
    climbs = [(m, f) for m, f in traced.stops if not m.startswith(PACKAGE.name + "/")]
    if args.list:
        for module, function in traced.stops:
            print(f"  {module}: {function}")
    repeated = ", ".join(f"{f} x{n}" for (_, f), n in traced.repeated.items()) or "none"
    print(f"| tree | start | stops | modules | climbs out of the package | parses | resolutions | stops given the "
          f"whole config more than once |\n|---|---|---|---|---|---|---|---|\n"
          f"| {REPO} | {'resume' if args.resume else 'fresh'} | {len(traced.stops)} | {len(modules)} | {len(climbs)} "
          f"| {traced.parses} | {traced.resolutions} | {repeated} |")
    for module, function in climbs:
        print(f"climb: {module}: {function}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
