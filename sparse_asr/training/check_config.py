"""Check a run's config for a given rank count before its job waits in a queue (used by the submit
helpers and scripts/sweep.sh, in their dry runs too):

    python -m sparse_asr.training.check_config --config configs/lstman4_oktopk.yaml --world-size 32 [key=value ...]
    printf '%s\\n' "8 name=a compression.density=0.01" "16 name=b" | \\
        python -m sparse_asr.training.check_config --config C --runs -     # one run per line: RANKS overrides...

The same checks as train.py makes of its config: every key and value (load_config), and the rank count
against distributed.world_size and the global batch (resolve_world_size). Exit status 0 when every run
is fine, else 2 and one `error: ...` line per distinct refusal (naming the first run it refuses).
"""
from __future__ import annotations

import argparse
import sys

from sparse_asr.training.config import ConfigError, load_config, resolve_world_size


def check_run(config: str, world_size: int, overrides: list[str]) -> None:
    """Raise ConfigError if train.py would refuse this config on `world_size` ranks."""
    if world_size < 1:
        raise ConfigError(f"the rank count must be a positive integer, got {world_size}")
    resolve_world_size(load_config(config, overrides), world_size)


def parse_runs(lines) -> list[tuple[int, list[str]]]:
    runs = []
    for number, line in enumerate(lines, start=1):
        words = line.split()
        if not words:
            continue
        if not words[0].isdigit():
            raise ConfigError(f"--runs line {number}: expected 'RANKS key=value ...', got {line.strip()!r}")
        runs.append((int(words[0]), words[1:]))
    return runs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="YAML experiment config")
    parser.add_argument("--world-size", type=int, help="MPI ranks the job will run")
    parser.add_argument("--runs", metavar="FILE", help="check several runs, one per line 'RANKS key=value ...' "
                                                       "(- = standard input); their overrides follow the common ones")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides (of every run)")
    args = parser.parse_args(argv)
    if (args.world_size is None) == (args.runs is None):
        parser.error("give exactly one of --world-size N and --runs FILE")
    try:
        if args.runs is None:
            runs = [(args.world_size, [])]
        else:
            with (sys.stdin if args.runs == "-" else open(args.runs)) as f:
                runs = parse_runs(f)
    except (ConfigError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    refusals: dict[str, list[str]] = {}  # message -> the runs it refuses (a sweep repeats one mistake)
    for world_size, extra in runs:
        try:
            check_run(args.config, world_size, args.overrides + extra)
        except ConfigError as e:
            refusals.setdefault(str(e), []).append(" ".join([f"{world_size} ranks", *extra]))
    for message, refused in refusals.items():
        where = ""
        if args.runs is not None:
            more = f" and {len(refused) - 1} more" if len(refused) > 1 else ""
            where = f" (run: {refused[0]}{more})"
        print(f"error: {message}{where}", file=sys.stderr)
    return 2 if refusals else 0


if __name__ == "__main__":
    sys.exit(main())
