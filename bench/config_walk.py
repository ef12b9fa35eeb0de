"""The walk of the configuration through start-up: which functions receive it, in which modules, and whether any
climbs back out of the package into a script. Traced, not read: `launch.run_job` runs for real (one process, the
given config and overrides) until the trainer is about to train (`Trainer.fit`, which is not entered), and every
Python call on the way is looked at once.

A stop: a function or method of this repository (the package, train.py, scripts/, bench/) called with the run's
configuration among its arguments: the `Config` or one of its sections (any dataclass defined in
sparse_asr/training/config.py). A climb: a stop outside the package (train.py, scripts/, bench/). Each stop counts
once, however often it is called. Run it on another tree (PYTHONPATH=OTHER_TREE) to compare the same measure:

    .venv/bin/python bench/config_walk.py --config configs/smoke.yaml [key=value ...] [--list]
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import tempfile
from pathlib import Path

import sparse_asr
from sparse_asr.comm import Communicator
from sparse_asr.training import config as config_module
from sparse_asr.training import launch
from sparse_asr.training.trainer import Trainer

PACKAGE = Path(sparse_asr.__file__).resolve().parent
REPO = PACKAGE.parent


class StartUpDone(Exception):
    """Raised where training would begin: the walk ends there."""


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


def walk(config: str, overrides: list[str]) -> list[tuple[str, str]]:
    """(module path relative to the repository, qualified function name) of every stop, in first-call order."""
    stops: dict[tuple[str, str], None] = {}

    def on_call(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        module = repository_module(code.co_filename)
        if module is None:
            return
        n_args = code.co_argcount + code.co_kwonlyargcount
        arguments = [frame.f_locals.get(name) for name in code.co_varnames[:n_args]]
        if any(carries_config(a) for a in arguments):
            stops.setdefault((module, code.co_qualname), None)

    def stop_here(self, *args, **kwargs):
        raise StartUpDone

    original_fit, Trainer.fit = Trainer.fit, stop_here
    sys.setprofile(on_call)
    try:
        launch.run_job(Communicator(), config, overrides)
    except StartUpDone:
        pass
    finally:
        sys.setprofile(None)
        Trainer.fit = original_fit
    return list(stops)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--list", action="store_true", help="print every stop")
    parser.add_argument("overrides", nargs="*", help="key=value, as train.py takes them")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as out_dir:  # the run's directory: thrown away
        stops = walk(args.config, [f"out_dir={out_dir}", "name=walk", *args.overrides])
    if not stops:
        sys.exit("config_walk: no function received the configuration: nothing was traced (wrong tree?)")
    modules = sorted({module for module, _ in stops})
    climbs = [(m, f) for m, f in stops if not m.startswith(PACKAGE.name + "/")]
    if args.list:
        for module, function in stops:
            print(f"  {module}: {function}")
    print(f"| tree | stops | modules | climbs out of the package |\n|---|---|---|---|\n"
          f"| {REPO} | {len(stops)} | {len(modules)} | {len(climbs)} |")
    for module, function in climbs:
        print(f"climb: {module}: {function}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
