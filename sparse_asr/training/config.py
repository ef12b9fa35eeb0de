"""Experiment configuration: YAML -> dataclasses, every key validated, `a.b=value` overrides (DESIGN 8).

    cfg = load_config("configs/an4_cpu.yaml", ["compression.algorithm=oktopk", "train.epochs=3"])
    cfg = launch.resolve_for_run(cfg, comm)   # real world size, run name; identical on every rank or an error

A file may start from another one: `include: base.yaml` (a path relative to the including file) is read
first and the including file's keys are merged over it, section by section (the including file wins; the
base may include another base). Command-line overrides apply last.

Unknown keys, wrong types and bad values raise ConfigError naming the full dotted key and where it came
from (the YAML file that set it, or the command-line override).
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from sparse_asr.compression.memory import DEFAULT_MEMORY, MEMORIES
from sparse_asr.fileio import CONFIG_BYTES, UnsafePathError, read_text
from sparse_asr.settings import ConfigError, build, fields, natural, positive, setting, tie


# The longest distributed.timeout_s (a week): beyond it a wait is not watched in any useful sense, and the start-up
# guard's select() overflows on values like 1e300 (the run then went on unguarded).
MAX_TIMEOUT_S = 7 * 24 * 3600.0


@dataclass
class ModelConfig:
    name: str = setting("lstman4_small")  # a key of models.MODELS
    # BatchNorm statistics over all ranks' valid frames (forward and backward), as one process on the
    # global batch would compute them; false = each rank's own (the paper's setup)
    sync_batchnorm: bool = setting(False)


@dataclass
class DataConfig:
    train_manifest: str = setting("manifests/an4_train.csv")
    dev_manifest: str = setting("manifests/an4_dev.csv")
    test_manifest: str = setting("manifests/an4_test.csv")  # "" = no test evaluation at the end
    # DataLoader worker processes per rank (features are computed on the fly)
    num_workers: int = setting(0, natural, "must be >= 0", resume_safe=True)
    # Keep every utterance's features after their first computation (AN4's train set: ~0.2 GB): from the
    # second epoch on no audio is read and no STFT runs. On the run's GPU when they take at most 1/8 of its
    # free memory (batches are then padded and masked there), else in host memory. Needs num_workers 0 (a
    # worker's cache dies with it).
    cache_features: bool = setting(False, resume_safe=True)
    # Quick runs: keep only the N shortest utterances (0 = all) of train, and of dev and test.
    max_train_utterances: int = setting(0, natural, "must be >= 0 (0 = all)")
    max_eval_utterances: int = setting(0, natural, "must be >= 0 (0 = all)")
    # SpecAugment-style masking of the TRAINING features (dev/test never): N bands of width uniform in
    # [0, width] bins / frames set to 0 (time bands at most time_mask_max_fraction of the utterance).
    freq_masks: int = setting(0, natural, "must be >= 0 (0 = off)")
    freq_mask_width: int = setting(15, positive, "must be >= 1")
    time_masks: int = setting(0, natural, "must be >= 0 (0 = off)")
    time_mask_width: int = setting(25, positive, "must be >= 1")
    time_mask_max_fraction: float = setting(0.1, lambda v: 0 < v <= 1, "must be in (0, 1]")
    TIES = (tie("cache_features", lambda d: not (d.cache_features and d.num_workers),
                "needs data.num_workers=0 (each worker process would hold its own cache, lost with it)"),)


@dataclass
class TrainConfig:
    epochs: int = setting(30, positive, "must be >= 1", resume_safe=True)
    # Exactly one of the two batch sizes is set. global_batch_size: summed over ranks, fixed whatever the rank
    # count (must be divisible by it). batch_per_rank: weak scaling, as the original code's per-worker
    # --batch-size; the global batch resolves to batch_per_rank x ranks (and the default 32 is then unused).
    global_batch_size: typing.Optional[int] = setting(32, lambda v: v is None or v >= 1, "must be >= 1")
    batch_per_rank: typing.Optional[int] = setting(None, lambda v: v is None or v >= 1, "must be >= 1 or null")
    eval_batch_size: int = setting(32, positive, "must be >= 1", resume_safe=True)  # global, for dev/test
    # SortaGrad (DeepSpeech 2): the first N epochs run their batches shortest utterances first, not shuffled
    sorted_epochs: int = setting(0, natural, "must be >= 0 (0 = every epoch shuffled)")
    # 0 = never evaluate on dev during training
    eval_every_epochs: int = setting(1, natural, "must be >= 0", resume_safe=True)
    # greedy: dev and test scored by best-path decoding (fast); beam: the beam with lexicon + n-gram LM of the
    # training manifest scored beside it (dev/beam_wer, ...); dev/wer, and so checkpoints/best, stay greedy
    eval_decoder: str = setting("greedy", lambda v: v in ("greedy", "beam"), "must be greedy or beam",
                                resume_safe=True)
    log_every_steps: int = setting(10, positive, "must be >= 1", resume_safe=True)
    # stop the run after this many skipped (non-finite) steps in a row
    max_nonfinite_in_row: int = setting(5, positive, "must be >= 1", resume_safe=True)
    # debug: check every N steps that all replicas hold identical parameters (0 = off)
    checksum_every: int = setting(0, natural, "must be >= 0", resume_safe=True)
    # also checkpoint every N optimizer steps (0 = only at epoch ends)
    checkpoint_every_steps: int = setting(0, natural, "must be >= 0", resume_safe=True)
    # checkpoint at every N-th epoch's end; the last epoch, a run stopped by max_minutes and an epoch whose dev
    # WER is the best so far (checkpoints/best stays exact) are always checkpointed
    checkpoint_every_epochs: int = setting(1, positive, "must be >= 1", resume_safe=True)
    # newest step checkpoints kept on disk (plus the ones last and best point at)
    keep_checkpoints: int = setting(2, positive, "must be >= 1", resume_safe=True)
    # also keep the N step checkpoints of lowest dev WER, for checkpoint averaging (evaluate.py --average N)
    keep_best_checkpoints: int = setting(3, natural, "must be >= 0", resume_safe=True)
    # run or checkpoint directory to continue; "auto" = continue `name` if it has a checkpoint
    resume: str = setting("")
    # torch CPU threads per rank; 0 = OMP_NUM_THREADS if set, else cores / ranks on the node
    threads: int = setting(0, natural, "must be >= 0", resume_safe=True)
    # fp32, or bf16: forward and loss under torch.autocast(bfloat16). Master weights, the flat gradient
    # buffer, communication and evaluation stay float32 (CTC loss takes float32 log-probabilities).
    precision: str = setting("fp32", lambda v: v in ("fp32", "bf16"), "must be fp32 or bf16")
    # Wall-clock budget of the training loop (batch jobs with a walltime, fixed-time comparisons): the run
    # stops after the epoch past which the next one would likely overrun it, and is then dev- and
    # test-scored and checkpointed as usual (resumable). 0 = no limit. Startup and the test scoring come on top.
    max_minutes: float = setting(0.0, natural, "must be >= 0 (0 = no limit)", resume_safe=True)


@dataclass
class OptimConfig:
    # SGD learning rate after warm-up; above 10 every step overflows (1e300 failed at step 1, the run written)
    lr: float = setting(3e-4, lambda v: 0 < v <= 10, "must be in (0, 10]")
    momentum: float = setting(0.9, lambda v: 0 <= v < 1, "must be in [0, 1)")
    nesterov: bool = setting(True)  # (needs momentum > 0)
    weight_decay: float = setting(1e-4, natural, "must be >= 0")
    # clip the synchronised gradient to this L2 norm (0 = no clipping)
    max_grad_norm: float = setting(400.0, natural, "must be >= 0 (0 = no clipping)")
    # linear warm-up of the learning rate over the first N optimizer steps
    lr_warmup_steps: int = setting(100, natural, "must be >= 0")
    # learning rate divided by this after every epoch (1.0 = constant)
    lr_anneal: float = setting(1.1, lambda v: v >= 1.0, "must be >= 1.0")
    # epochs at the full lr before the anneal starts (lr / lr_anneal**(epoch - N) after them): a model still on
    # CTC's blank plateau is not slowed further (docs/results.md)
    lr_hold_epochs: int = setting(0, natural, "must be >= 0")
    TIES = (tie("nesterov", lambda o: not o.nesterov or o.momentum > 0, "needs optim.momentum > 0"),)


@dataclass
class CompressionConfig:
    algorithm: str = setting("dense")  # a key of compression.COMPRESSORS
    # fraction of gradient entries in the global update (ignored by dense)
    density: float = setting(0.01, lambda v: 0 < v <= 1, "must be in (0, 1]")
    # Optimizer steps that use dense allreduce before switching to `algorithm`. "auto" = 5% of the
    # run's optimizer steps (rounded down; a fraction, not a constant, so short runs still compress).
    warmup_steps: typing.Union[int, str] = setting("auto", lambda v: v == "auto" or (isinstance(v, int) and v >= 0),
                                                   "must be 'auto' or an integer >= 0")
    # Average the one-dimensional parameters (biases, BatchNorm scales: 0.15% of lstman4's entries, 0.46% of
    # lstman4_small's) by dense allreduce beside `algorithm`, which then compresses only the weight
    # matrices and kernels (its k is still density x all entries).
    dense_1d: bool = setting(False)
    options: dict = setting(factory=dict)  # keyword arguments of the compressor's constructor
    # The exchange's memory, a key of compression/memory.py's MEMORIES (each described there; the default is error
    # feedback's residual). A memory that carries the momentum (dgc, ef21) takes optim.momentum and nesterov into
    # the exchange and the optimizer steps without momentum; each rank's gradient is clipped at
    # optim.max_grad_norm x sqrt(P) and gets optim.weight_decay before the exchange (training/optim.py). Those
    # need a selection, no dense steps.
    memory: str = setting(DEFAULT_MEMORY, lambda v: v in MEMORIES, f"must be one of {', '.join(MEMORIES)}")
    # dgc: a sent entry's momentum is cleared with its velocity (DGC's momentum factor masking)
    momentum_masking: bool = setting(True)
    # lowpass: the filter's beta, m <- (1 - beta) m + beta (acc - sent); 1 = error feedback
    lowpass_beta: float = setting(0.1, lambda v: 0 < v <= 1, "must be in (0, 1]")
    # DGC's warm-up: the density falls exponentially over the first N epochs to `density` (density_warmup.py)
    density_warmup_epochs: int = setting(0, natural, "must be >= 0 (0 = the configured density from the start)")


@dataclass
class DistributedConfig:
    # if set, must equal the real MPI size; resolved to it
    world_size: typing.Optional[int] = setting(None, lambda v: v is None or v >= 1, "must be >= 1 or null")
    # pass CUDA buffers straight to MPI (else staged through host memory)
    cuda_aware_mpi: bool = setting(False, resume_safe=True)
    device: str = setting("auto", lambda v: v in ("auto", "cpu", "cuda"), "must be auto, cpu or cuda")
    # Watchdog: end the job when one MPI call has waited this many seconds (a rank stopped, hung or dead
    # would otherwise hold every other rank forever). 0 = off (the default): see README "On a cluster".
    timeout_s: float = setting(0.0, lambda v: 0 <= v <= MAX_TIMEOUT_S,
                               f"must be in [0, {MAX_TIMEOUT_S:g}] (0 = no watchdog; at most a week)", resume_safe=True)


@dataclass
class Config:
    # run name; "" = <model>-<algorithm>-d<density>-p<P>-<YYYYmmdd-HHMMSS>
    name: str = setting("", lambda v: "/" not in v and v not in (".", ".."), "must be a plain directory name")
    seed: int = setting(1, lambda v: 0 <= v < 2**32, "must be in [0, 4294967295] (the range numpy and torch seed from)")
    out_dir: str = "runs"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    compression: CompressionConfig = field(default_factory=CompressionConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.out_dir) / self.name


# ---------------------------------------------------------------------------------------- loading
def load_config(path: str | Path | None, overrides: typing.Sequence[str] = ()) -> Config:
    """Read a YAML config (None = defaults only) and what it includes, apply `a.b=value` overrides,
    validate everything."""
    raw: dict = {}
    files: dict[str, str] = {}  # dotted key -> the file that set it
    source = "defaults"
    if path is not None:
        source = str(path)
        raw, files = read_config_file(Path(path))
    return build_config(raw, overrides, source, files)


def build_config(raw: dict, overrides: typing.Sequence[str] = (), source: str = "defaults",
                 files: dict[str, str] | None = None) -> Config:
    """A config from nested sections (a config file's content, or a checkpoint's own config), with
    `a.b=value` overrides applied and everything validated; errors name the file, `source` or the override."""
    raw, files = copy.deepcopy(raw), files or {}
    origins: dict[str, str] = {}  # dotted key -> the override text that set it
    for text in overrides:
        key, value = parse_override(text)
        set_dotted(raw, key, value, text)
        origins[key] = text

    def where(key: str) -> str:
        for k, text in origins.items():
            if key == k or key.startswith(k + ".") or k.startswith(key + "."):
                return f"command-line override {text!r}"
        if key in files:
            return files[key]
        for k, file in files.items():
            if key.startswith(k + ".") or k.startswith(key + "."):
                return file
        return source

    cfg = _one_batch_size(build(Config, raw, "", where), raw, where)
    _check_model(cfg.model.name, where)
    _check_compression(cfg.compression, where)
    return cfg


def read_config_file(path: Path, included_by: tuple[Path, ...] = ()) -> tuple[dict, dict[str, str]]:
    """(the mapping of `path` merged over its `include:`, the file that set each dotted key)."""
    chain = " (included by " + " <- ".join(str(p) for p in reversed(included_by)) + ")" if included_by else ""
    if path.resolve() in [p.resolve() for p in included_by]:
        cycle = " -> ".join(str(p) for p in (*included_by, path))
        raise ConfigError(f"{included_by[-1]}: include cycle: {cycle}")
    try:  # a regular file of bounded size (a FIFO would hang start-up, /dev/zero fill memory)
        raw = yaml.safe_load(read_text(path, CONFIG_BYTES, "config file")) or {}
    except FileNotFoundError:
        raise ConfigError(f"cannot read config file {path}{chain}: it does not exist") from None
    except UnsafePathError as e:
        raise ConfigError(f"{e}{chain}") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}{chain}: {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(raw).__name__}")
    check_expanded_size(raw, path)
    include = raw.pop("include", None)
    files = {key: str(path) for key in _dotted_keys(raw)}
    if include is None:
        return raw, files
    if not isinstance(include, str) or not include.strip():
        raise ConfigError(f"{path}: include must be a config file name (relative to {path.parent}), got {include!r}")
    base, base_files = read_config_file(path.parent / include, (*included_by, path))
    return _merge(base, raw), {**base_files, **files}


# YAML aliases let a 1 KB file name 10^9 values ("billion laughs"): a config is walked only after its expanded
# form is counted, stopping at this many values (the largest real config has a few hundred).
MAX_CONFIG_VALUES = 100_000


def check_expanded_size(raw, path) -> None:
    """ConfigError when `raw`, with its aliases expanded, holds more than MAX_CONFIG_VALUES values: counted by
    a walk that stops at the bound, so it takes bounded time and no memory."""
    count, stack = 0, [raw]
    while stack:
        value = stack.pop()
        count += 1
        if count > MAX_CONFIG_VALUES:
            raise ConfigError(f"{path}: expands to more than {MAX_CONFIG_VALUES} values (YAML aliases repeating "
                              f"one another?); refusing it")
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)


def _dotted_keys(d: dict, prefix: str = "") -> list[str]:
    """Every key of a nested mapping, sections included ('train', 'train.epochs', ...)."""
    keys = []
    for k, v in d.items():
        keys.append(prefix + str(k))
        if isinstance(v, dict):
            keys += _dotted_keys(v, f"{prefix}{k}.")
    return keys


def _merge(base: dict, over: dict) -> dict:
    """`over` merged into a copy of `base`, section by section; `over` wins."""
    merged = dict(base)
    for k, v in over.items():
        merged[k] = _merge(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return merged


def parse_override(text: str) -> tuple[str, object]:
    """'train.epochs=3' -> ('train.epochs', 3); values are parsed as YAML (so 0.5, true, null, [1, 2] work).
    An empty value is the empty string, as in a shell: data.test_manifest= means no test set."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part.strip() for part in key.split(".")) or " " in key:
        raise ConfigError(f"bad override {text!r}: expected key.sub=value, e.g. train.epochs=3")
    if not value.strip():
        return key, ""
    try:
        return key, yaml.safe_load(value)
    except yaml.YAMLError as e:
        raise ConfigError(f"override {text!r}: value is not valid YAML: {e}") from None


def set_dotted(raw: dict, key: str, value, text: str = "") -> None:
    """raw[a][b][c] = value for key 'a.b.c', creating sections; `text` (the override) names a clash."""
    node = raw
    parts = key.split(".")
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {text!r}: {'.'.join(parts[: i + 1])} is not a section")
        node = child
    node[parts[-1]] = value


def _one_batch_size(cfg: Config, raw: dict, where) -> Config:
    """train.batch_per_rank replaces the default global batch; setting both is an error naming where each
    was set (a config file with a global batch + batch_per_rank on the command line needs
    train.global_batch_size=null)."""
    t = cfg.train
    if t.batch_per_rank is None:
        if t.global_batch_size is None:
            raise ConfigError(f"{where('train.global_batch_size')}: set train.global_batch_size or "
                              "train.batch_per_rank")
        return cfg
    if raw.get("train", {}).get("global_batch_size") is not None:
        raise ConfigError(f"train.global_batch_size ({where('train.global_batch_size')}) and train.batch_per_rank "
                          f"({where('train.batch_per_rank')}) are both set: set exactly one (add "
                          f"train.global_batch_size=null to scale the global batch with the ranks)")
    return dataclasses.replace(cfg, train=dataclasses.replace(t, global_batch_size=None))


def resume_safe_keys() -> tuple[str, ...]:
    """The dotted keys a resumed run may change (their settings say resume_safe)."""
    return tuple(key for key, f, _ in fields(Config()) if f.metadata.get("resume_safe"))


def _check_model(name: str, where) -> None:
    from sparse_asr.models import MODELS

    if name not in MODELS:
        raise ConfigError(f"{where('model.name')}: model.name {name!r} is not a known model; known: {sorted(MODELS)}")


def _check_compression(c: CompressionConfig, where) -> None:
    """The algorithm must be registered; its options are the settings of its Options, checked like the rest."""
    from sparse_asr.compression import COMPRESSORS, memory_problem

    if c.algorithm not in COMPRESSORS:
        raise ConfigError(f"{where('compression.algorithm')}: compression.algorithm {c.algorithm!r} is unknown; "
                          f"known: {sorted(COMPRESSORS)}")
    build(COMPRESSORS[c.algorithm].Options, c.options, "compression.options.",
          lambda key: f"{where(key)} (options of {c.algorithm!r})")
    if c.memory != DEFAULT_MEMORY and (problem := memory_problem(c.algorithm, c.memory, c.warmup_steps,
                                                                     c.dense_1d)):
        raise ConfigError(f"{where('compression.memory')}: {problem}")


# ---------------------------------------------------------------------------------------- run time
def to_dict(cfg: Config) -> dict:
    return asdict(cfg)


def to_yaml(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def config_digest(cfg: Config) -> str:
    return hashlib.sha256(yaml.safe_dump(to_dict(cfg), sort_keys=True).encode()).hexdigest()


def default_run_name(cfg: Config, world_size: int, timestamp: str) -> str:
    c = cfg.compression
    density = "1" if c.algorithm == "dense" else f"{c.density:g}"
    return f"{cfg.model.name}-{c.algorithm}-d{density}-p{world_size}-{timestamp}"


def resolve_world_size(cfg: Config, world_size: int) -> Config:
    """The config as it runs on `world_size` ranks, or ConfigError if it cannot: distributed.world_size
    recorded, the global batch fixed (batch_per_rank x ranks; batch_per_rank is then cleared, so the saved
    config reloads as the same run). Shared by resolve_for_run and, before a job is queued, check_config."""
    ws = cfg.distributed.world_size
    if ws is not None and ws != world_size:
        raise ConfigError(f"distributed.world_size is {ws} but the job runs {world_size} MPI ranks; "
                          f"launch with mpiexec -n {ws} or set distributed.world_size=null")
    t = cfg.train
    if t.batch_per_rank is not None:
        t = dataclasses.replace(t, global_batch_size=t.batch_per_rank * world_size, batch_per_rank=None)
    elif t.global_batch_size % world_size:
        raise ConfigError(f"train.global_batch_size={t.global_batch_size} is not divisible by the {world_size} "
                          f"ranks (choose a rank count that divides it, or set train.batch_per_rank instead)")
    return dataclasses.replace(cfg, train=t, distributed=dataclasses.replace(cfg.distributed, world_size=world_size))


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out
