"""What a run is, decided once (DESIGN 8): the request of train.py's command line, its configuration parsed once
before MPI is up, and the plan built from it under the run directory's lock.

    request = read_request(config, overrides, resume, overwrite)   # train.py: parsed and validated once
    run_dir = run_directory(request, comm)                          # which directory to lock
    ... RunDirLock(run_dir) held ...
    plan = launch.plan_run(request, run_dir, comm)                  # one frozen RunPlan
    trainer = launch.start_run(plan, comm)                          # built from the plan, nothing decided again
"""
from __future__ import annotations

import time
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from sparse_asr.fileio import RECORD_BYTES, read_text
from sparse_asr.training.checkpoint import Located, TrainingState, locate_checkpoint
from sparse_asr.training.config import MAX_TIMEOUT_S, Config, ConfigError, default_run_name, load_config, parse_override
from sparse_asr.training.resume import run_dir_of

if typing.TYPE_CHECKING:
    from sparse_asr.data.dataset import TrainingData
    from sparse_asr.training.launch import Process


@dataclass(frozen=True)
class RunRequest:
    """What the command line asks for. `config`: the --config file with the overrides, validated (None: a run
    resumed with its own config, which the overrides then change under the lock); `resume`: "", "auto" or a run
    or checkpoint directory (--resume, else the config's train.resume)."""

    config: Config | None
    overrides: tuple[str, ...] = ()
    resume: str = ""
    overwrite: bool = False  # start afresh over a previous run's files (with "auto": only if nothing to continue)
    given: dict = field(default_factory=dict)  # the overrides parsed, by dotted key

    @property
    def timeout_s(self) -> float:
        """distributed.timeout_s as far as it is known before the run's directory is locked: the config's, else
        an override's, else (a run resumed with its own config) the one its config.yaml was last started with;
        0 when it cannot be read or is out of bounds (the plan's config then says)."""
        if self.config is not None:
            return self.config.distributed.timeout_s
        try:
            if "distributed.timeout_s" in self.given:
                timeout = float(self.given["distributed.timeout_s"])
            else:
                path = Path(self.resume)
                run_dir = path if (path / "config.yaml").is_file() else path.resolve().parent.parent
                saved = read_text(run_dir / "config.yaml", RECORD_BYTES, "run config", follow=False)
                timeout = float(yaml.safe_load(saved)["distributed"]["timeout_s"])
        except Exception:  # noqa: BLE001 -- a watchdog-less start-up; the plan's config is checked under the lock
            return 0.0
        return timeout if 0 <= timeout <= MAX_TIMEOUT_S else 0.0


def read_request(config_path: str | Path | None, overrides: typing.Sequence[str] = (), resume: str = "",
                 overwrite: bool = False) -> RunRequest:
    """The command line's request, its configuration parsed once (no MPI, no file written); ConfigError on a bad
    key, value or combination."""
    config = load_config(config_path, overrides) if config_path else None
    given = dict(parse_override(o) for o in overrides)
    resume = resume or (config.train.resume if config is not None else str(given.get("train.resume") or ""))
    if not resume and config is None:
        raise ConfigError("--config is required to start a run (only --resume RUN_DIR may leave it out)")
    if resume == "auto" and (config is None or not config.name):
        raise ConfigError("--resume auto (train.resume=auto) needs --config and an explicit run name "
                          "(name=NAME): it continues OUT_DIR/NAME if that has a checkpoint, else starts it")
    if overwrite and resume not in ("", "auto"):
        raise ConfigError("--overwrite starts the run afresh and --resume continues it: give one of them")
    return RunRequest(config, tuple(overrides), resume, overwrite, given)


def run_name(cfg: Config, comm) -> str:
    """The run's name: the configured one, else <model>-<algorithm>-d<density>-p<P>-<rank 0's timestamp>
    (collective then)."""
    if cfg.name:
        return cfg.name
    timestamp = comm.bcast_object(time.strftime("%Y%m%d-%H%M%S") if comm.rank == 0 else None)
    return default_run_name(cfg, comm.size, timestamp)


def run_directory(request: RunRequest, comm) -> Path:
    """The directory the run lives in, to be locked before anything else is decided: the run of the checkpoint
    --resume names, else OUT_DIR/NAME (a timestamped name when none is given: collective)."""
    if request.resume not in ("", "auto"):
        return run_dir_of(locate_checkpoint(request.resume)[0])
    return Path(request.config.out_dir) / run_name(request.config, comm)


@dataclass(frozen=True)
class RunPlan:
    """One run as decided and checked under its directory's lock, before anything is written (launch.plan_run):
    start_run builds the model, the exchange and the Trainer from it and decides nothing again."""

    config: Config  # resolved (world size, global batch, name), identical on every rank
    process: Process  # this rank's device and threads
    data: TrainingData  # the datasets and the sampler, every audio header checked
    data_line: str  # what was loaded, for the log
    warmup_steps: int  # dense steps first: fixed when the run started (a resumed run keeps its checkpoint's)
    checkpoint: Located | str | None = None  # the checkpoint continued from (None: a fresh start)
    state: TrainingState | None = None  # its content, every file verified on every rank
    overwrite: bool = False  # delete a previous run's files in the run directory first
    notes: tuple[str, ...] = ()  # for the log once the run has started (a damaged newest checkpoint, keys changed)

    @property
    def run_dir(self) -> Path:
        return self.config.run_dir
