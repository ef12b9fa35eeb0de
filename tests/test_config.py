"""Config loading: every key validated, errors name the dotted key and where it came from."""
import json
import re
from pathlib import Path

import pytest
import yaml

from sparse_asr.comm import Communicator
from sparse_asr.compression import warmup_steps
from sparse_asr.training import check_config
from sparse_asr.training.config import ConfigError, load_config, resolve_world_size, to_yaml
from sparse_asr.training.launch import check_same_on_all_ranks, resolve_for_run
from tests.mpi_helpers import check_mpi

REPO = Path(__file__).resolve().parent.parent


def write(tmp_path, text: str) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return path


@pytest.mark.unit
def test_every_shipped_config_loads():
    for path in sorted((REPO / "configs").glob("*.yaml")):
        cfg = load_config(path)
        assert cfg.model.name and cfg.compression.algorithm, path


@pytest.mark.unit
def test_file_values_and_overrides(tmp_path):
    path = write(tmp_path, "train:\n  epochs: 3\noptim:\n  lr: 1e-4\ncompression:\n  algorithm: dense\n")
    cfg = load_config(path)
    assert cfg.train.epochs == 3
    assert cfg.optim.lr == pytest.approx(1e-4)  # PyYAML reads 1e-4 as a string: accepted for a float
    cfg = load_config(path, ["train.epochs=5", "optim.nesterov=false", "optim.lr=0.01", "name=my-run",
                             "compression.algorithm=oktopk", "compression.options.repartition_interval=16",
                             "distributed.world_size=null", "optim.max_grad_norm=100"])
    assert cfg.train.epochs == 5 and cfg.optim.nesterov is False and cfg.optim.lr == 0.01
    assert cfg.name == "my-run" and cfg.distributed.world_size is None
    assert isinstance(cfg.optim.max_grad_norm, float) and cfg.optim.max_grad_norm == 100.0
    assert cfg.compression.options == {"repartition_interval": 16}
    # the resolved YAML reloads to the same config
    again = write(tmp_path, to_yaml(cfg))
    assert load_config(again) == cfg


@pytest.mark.parametrize("text, overrides, key, origin", [
    ("train:\n  epoch: 3\n", [], "train.epoch", "cfg.yaml"),
    ("", ["train.epoch=3"], "train.epoch", "train.epoch=3"),
    ("trian:\n  epochs: 3\n", [], "trian", "cfg.yaml"),
    ("train:\n  epochs: three\n", [], "train.epochs", "cfg.yaml"),
    ("", ["train.epochs=2.5"], "train.epochs", "train.epochs=2.5"),
    ("", ["optim.nesterov=yes please"], "optim.nesterov", "optim.nesterov"),
    ("train: 3\n", [], "train", "cfg.yaml"),
    ("", ["compression.density=1.5"], "compression.density", "compression.density=1.5"),
    ("compression:\n  density: 0\n", [], "compression.density", "cfg.yaml"),
    ("", ["optim.lr=-1"], "optim.lr", "optim.lr=-1"),
    ("", ["optim.lr=fast"], "optim.lr", "optim.lr=fast"),
    ("", ["distributed.device=tpu"], "distributed.device", "distributed.device=tpu"),
    ("", ["compression.warmup_steps=soon"], "compression.warmup_steps", "compression.warmup_steps=soon"),
    ("", ["compression.warmup_steps=-1"], "compression.warmup_steps", "compression.warmup_steps=-1"),
    ("", ["compression.algorithm=topk9"], "compression.algorithm", "compression.algorithm=topk9"),
    ("", ["model.name=resnet"], "model.name", "model.name=resnet"),
    ("", ["train.global_batch_size=0"], "train.global_batch_size", "train.global_batch_size=0"),
    ("", ["name=a/b"], "name", "name=a/b"),
    ("", ["data.freq_masks=-1"], "data.freq_masks", "data.freq_masks=-1"),
    ("data:\n  time_masks: 1.5\n", [], "data.time_masks", "cfg.yaml"),
    ("", ["data.freq_mask_width=0"], "data.freq_mask_width", "data.freq_mask_width=0"),
    ("", ["data.time_mask_width=-3"], "data.time_mask_width", "data.time_mask_width=-3"),
    ("", ["data.time_mask_max_fraction=0"], "data.time_mask_max_fraction", "data.time_mask_max_fraction=0"),
    ("data:\n  time_mask_max_fraction: 1.2\n", [], "data.time_mask_max_fraction", "cfg.yaml"),
    ("", ["data.time_masks_width=10"], "data.time_masks_width", "data.time_masks_width=10"),
    ("", ["model.sync_batchnorm=sometimes"], "model.sync_batchnorm", "model.sync_batchnorm=sometimes"),
    ("", ["train.batch_per_rank=0"], "train.batch_per_rank", "train.batch_per_rank=0"),
    ("", ["distributed.timeout_s=-5"], "distributed.timeout_s", "distributed.timeout_s=-5"),
    ("", ["train.epochs="], "train.epochs", "train.epochs="),
    ("", ["train.precision=fp16"], "train.precision", "train.precision=fp16"),
    ("train:\n  precision: bfloat16\n", [], "train.precision", "cfg.yaml"),
])
@pytest.mark.unit
def test_bad_key_or_value_names_the_key(tmp_path, text, overrides, key, origin):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path, overrides)
    message = str(err.value)
    assert key in message and origin in message, message


@pytest.mark.unit
def test_augmentation_is_off_by_default_and_configurable():
    def settings(d):
        return d.freq_masks, d.freq_mask_width, d.time_masks, d.time_mask_width, d.time_mask_max_fraction

    assert settings(load_config(None).data) == (0, 15, 0, 25, 0.1)
    cfg = load_config(None, ["data.freq_masks=2", "data.freq_mask_width=20", "data.time_masks=3",
                             "data.time_mask_width=40", "data.time_mask_max_fraction=0.2"])
    assert settings(cfg.data) == (2, 20, 3, 40, 0.2)


@pytest.mark.unit
def test_precision_is_fp32_by_default_and_bf16_validates(tmp_path):
    assert load_config(None).train.precision == "fp32"
    assert load_config(write(tmp_path, "train:\n  precision: bf16\n")).train.precision == "bf16"
    assert load_config(None, ["train.precision=bf16"]).train.precision == "bf16"


@pytest.mark.unit
def test_compression_options_checked_by_the_algorithms_options(tmp_path):
    path = write(tmp_path, "compression:\n  algorithm: oktopk\n  options:\n    local_threshold_interval: 8\n")
    assert load_config(path).compression.options == {"local_threshold_interval": 8}
    with pytest.raises(ConfigError, match=r"compression\.options\.local_threshold_intervall"):
        load_config(path, ["compression.options.local_threshold_intervall=8"])
    with pytest.raises(ConfigError,
                       match=r"options of 'oktopk'.*compression\.options\.local_threshold_interval must be int"):
        load_config(path, ["compression.options.local_threshold_interval=often"])
    with pytest.raises(ConfigError, match=r"compression\.options\.repartition_interval"):  # dense has no options
        load_config(None, ["compression.algorithm=dense", "compression.options.repartition_interval=4"])
    with pytest.raises(ConfigError, match=r"command-line override"):
        load_config(path, ["compression.options.nope=1"])


@pytest.mark.unit
def test_bad_override_syntax_and_bad_files(tmp_path):
    for text in ["train.epochs", "=3", "train..epochs=3", "train epochs=3"]:
        with pytest.raises(ConfigError, match="bad override"):
            load_config(None, [text])
    with pytest.raises(ConfigError, match="train.epochs=3.*not a section"):
        load_config(None, ["train=1", "train.epochs=3"])
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(write(tmp_path, "train: [1, 2\n"))
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(write(tmp_path, "- 1\n- 2\n"))


@pytest.mark.unit
def test_resolve_records_world_size_and_names_the_run():
    comm = Communicator()
    cfg = resolve_for_run(load_config(None, ["compression.algorithm=topka", "compression.density=0.02"]), comm)
    assert cfg.distributed.world_size == comm.size == 1
    assert re.fullmatch(r"lstman4_small-topka-d0\.02-p1-\d{8}-\d{6}", cfg.name), cfg.name
    dense = resolve_for_run(load_config(None), comm)
    assert re.fullmatch(r"lstman4_small-dense-d1-p1-\d{8}-\d{6}", dense.name), dense.name
    assert resolve_for_run(load_config(None, ["name=fixed"]), comm).name == "fixed"
    saved = yaml.safe_load(to_yaml(cfg))
    assert saved["model"]["name"] == "lstman4_small" and saved["compression"]["algorithm"] == "topka"
    assert saved["compression"]["density"] == 0.02 and saved["distributed"]["world_size"] == 1
    with pytest.raises(ConfigError, match="distributed.world_size is 4 but the job runs 1"):
        resolve_for_run(load_config(None, ["distributed.world_size=4"]), comm)


class FakeComm:
    """Two 'ranks' seen from rank 0: allgather_object returns rank 0's object and another rank's."""

    rank, size = 0, 2

    def __init__(self, other):
        self.other = other
        self.calls = 0

    def allgather_object(self, obj):
        from sparse_asr.training.config import config_digest, flatten, to_dict

        theirs = [config_digest(self.other), flatten(to_dict(self.other))][self.calls]
        self.calls += 1
        return [obj, theirs]


@pytest.mark.unit
def test_config_differing_between_ranks_is_refused():
    mine, theirs = load_config(None), load_config(None, ["optim.lr=0.1"])
    check_same_on_all_ranks(mine, FakeComm(load_config(None)))
    with pytest.raises(ConfigError, match=r"differs between ranks.*\n  optim\.lr: rank 0 has 0\.0003, rank 1 has 0\.1"):
        check_same_on_all_ranks(mine, FakeComm(theirs))


@pytest.mark.unit
def test_auto_warmup_is_a_fraction_of_the_run():
    assert warmup_steps(load_config(None).compression.warmup_steps, 1000) == 50
    assert warmup_steps(load_config(None).compression.warmup_steps, 19) == 0
    assert warmup_steps(load_config(None, ["compression.warmup_steps=7"]).compression.warmup_steps, 1000) == 7


@pytest.mark.unit
def test_include_merges_a_base_under_the_including_file(tmp_path):
    (tmp_path / "bases").mkdir()
    (tmp_path / "bases" / "root.yaml").write_text("seed: 7\ntrain:\n  epochs: 3\n  log_every_steps: 2\n")
    (tmp_path / "bases" / "base.yaml").write_text(
        "include: root.yaml\ntrain:\n  epochs: 4\noptim:\n  lr: 0.5\ncompression:\n  algorithm: oktopk\n"
        "  options:\n    repartition_interval: 16\n")
    path = tmp_path / "run.yaml"
    path.write_text("include: bases/base.yaml\ntrain:\n  global_batch_size: 8\ncompression:\n"
                    "  options:\n    local_threshold_interval: 8\n")
    cfg = load_config(path)
    assert cfg.seed == 7 and cfg.optim.lr == 0.5  # from the bases
    # merged, nearest wins
    assert (cfg.train.epochs, cfg.train.log_every_steps, cfg.train.global_batch_size) == (4, 2, 8)
    assert cfg.compression.algorithm == "oktopk"
    assert cfg.compression.options == {"repartition_interval": 16, "local_threshold_interval": 8}
    assert load_config(path, ["train.epochs=9", "seed=1"]).train.epochs == 9  # overrides apply last
    assert "include" not in to_yaml(cfg) and load_config(write(tmp_path, to_yaml(cfg))) == cfg


@pytest.mark.unit
def test_errors_name_the_file_a_key_came_from(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("train:\n  epoch: 3\n")
    path = tmp_path / "run.yaml"
    path.write_text("include: base.yaml\noptim:\n  lr: 0.1\n")
    with pytest.raises(ConfigError, match=r"base\.yaml: unknown key 'train\.epoch'"):
        load_config(path)
    base.write_text("optim:\n  lr: 0.1\n")
    path.write_text("include: base.yaml\noptim:\n  momentum: 2\n")
    with pytest.raises(ConfigError, match=r"run\.yaml: optim\.momentum must be in \[0, 1\)"):
        load_config(path)
    with pytest.raises(ConfigError, match=r"command-line override 'optim\.lr=-1'"):
        load_config(path, ["optim.lr=-1"])


@pytest.mark.unit
def test_bad_includes_are_clear_errors(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("include: b.yaml\n")
    b.write_text("include: a.yaml\n")
    with pytest.raises(ConfigError, match=r"b\.yaml: include cycle: .*a\.yaml -> .*b\.yaml -> .*a\.yaml"):
        load_config(a)
    a.write_text("include: a.yaml\n")
    with pytest.raises(ConfigError, match=r"include cycle: .*a\.yaml -> .*a\.yaml"):
        load_config(a)
    a.write_text("include: b.yaml\n")
    b.write_text("include: missing.yaml\n")
    with pytest.raises(ConfigError,
                       match=r"cannot read config file .*missing\.yaml \(included by .*b\.yaml <- .*a\.yaml\)"):
        load_config(a)
    for value in ["[b.yaml]", "''", "3"]:
        a.write_text(f"include: {value}\n")
        with pytest.raises(ConfigError, match=r"a\.yaml: include must be a config file name"):
            load_config(a)
    b.write_text("train: [1, 2\n")
    a.write_text("include: b.yaml\n")
    with pytest.raises(ConfigError, match=r"b\.yaml: invalid YAML"):
        load_config(a)
    with pytest.raises(ConfigError, match=r"command-line override 'include=b\.yaml': unknown key 'include'"):
        load_config(None, ["include=b.yaml"])


def differing_keys(a, b) -> set[str]:
    from sparse_asr.training.config import flatten, to_dict

    fa, fb = flatten(to_dict(a)), flatten(to_dict(b))
    return {k for k in fa.keys() | fb.keys() if fa.get(k) != fb.get(k)}


@pytest.mark.unit
def test_lstman4_configs_are_the_paper_setup_plus_their_own_keys():
    from sparse_asr.compression import COMPRESSORS

    paper = load_config(REPO / "configs" / "lstman4_paper.yaml")
    assert (paper.model.name, paper.optim.lr, paper.data.freq_masks, paper.data.time_masks) == ("lstman4", 1e-3, 0, 0)
    assert (paper.model.sync_batchnorm, paper.train.global_batch_size, paper.compression.density) == (False, 64, 0.02)
    for path in sorted((REPO / "configs").glob("lstman4_*.yaml")):
        algorithm = path.stem.removeprefix("lstman4_")
        if algorithm in COMPRESSORS:
            cfg = load_config(path)
            assert cfg.compression.algorithm == algorithm, path
            others = {k for k in differing_keys(cfg, paper) if not k.startswith("compression.options")}
            assert others <= {"compression.algorithm"}, (path, others)
    recipe = load_config(REPO / "configs" / "lstman4_recipe.yaml")
    assert differing_keys(recipe, paper) == {"model.sync_batchnorm", "data.freq_masks", "data.time_masks", "optim.lr",
                                             "optim.nesterov", "optim.lr_warmup_steps", "optim.lr_anneal",
                                             "compression.warmup_steps", "distributed.world_size"}
    assert (recipe.model.sync_batchnorm, recipe.data.freq_masks, recipe.data.time_masks, recipe.optim.lr) == (
        True, 2, 2, 3e-3)
    cpu = load_config(REPO / "configs" / "an4_cpu.yaml")
    assert (cpu.model.name, cpu.model.sync_batchnorm, cpu.train.global_batch_size, cpu.data.freq_masks) == (
        "lstman4_small", True, 16, 2)


@pytest.mark.unit
def test_the_global_64_config_is_the_benchmark_plus_the_overrides_its_cell_ran_with():
    """docs/results.md's global-64 cell ran an4_cpu.yaml with these overrides; the config must stay that run."""
    cell = ["compression.density=0.02", "train.global_batch_size=64", "optim.lr=1.2e-2", "optim.lr_warmup_steps=65",
            "optim.lr_hold_epochs=30", "optim.max_grad_norm=50", "train.epochs=60"]
    g64 = load_config(REPO / "configs" / "an4_cpu_g64.yaml")
    assert g64 == load_config(REPO / "configs" / "an4_cpu.yaml", cell)
    assert g64 != load_config(REPO / "configs" / "an4_cpu.yaml", cell[:-1])  # the comparison sees a changed key
    # and the cell's kept runs differ from it only in what names a run and picks its algorithm
    identity = {"name", "out_dir", "seed", "distributed.world_size", "train.resume", "compression.algorithm"}
    kept = sorted((REPO / "docs" / "results" / "cell_g64c_cpu" / "runs").glob("*/config.yaml"))
    assert len(kept) >= 3
    for run_config in kept:
        others = {k for k in differing_keys(load_config(run_config), g64) if not k.startswith("compression.options")}
        assert others <= identity, (run_config, others - identity)


VERDICT_IDENTITY = {"name", "out_dir", "seed", "train.resume", "compression.algorithm", "compression.memory",
                    "distributed.timeout_s"}  # what may differ between a verdict's runs: none of it numerics


def check_verdict_cell(config_path: Path, kept: list[Path]) -> None:
    """A verdict's config names every key (a new or changed default cannot reach it), its kept runs ran it (but for
    VERDICT_IDENTITY and an exchange's options), and every start of every arm of a seed was on one CPU type (a pair
    differs only in its exchange)."""
    from sparse_asr.training.config import flatten, to_dict

    verdict = load_config(config_path)
    written = flatten(yaml.safe_load(config_path.read_text()))
    assert set(written) == set(flatten(to_dict(verdict))), "a config key is left to its default"
    cpus_of_seed = {}
    for run_config in kept:
        others = {k for k in differing_keys(load_config(run_config), verdict)
                  if not k.startswith("compression.options")}
        assert others <= VERDICT_IDENTITY, (run_config, others - VERDICT_IDENTITY)
        starts = [json.loads(line) for line in (run_config.parent / "provenance.jsonl").read_text().splitlines()]
        cpus_of_seed.setdefault(load_config(run_config).seed, set()).update(start["cpu"] for start in starts)
    assert {seed: cpus for seed, cpus in cpus_of_seed.items() if len(cpus) > 1} == {}


@pytest.mark.unit
def test_the_verdict_config_spells_out_every_key_and_is_the_kept_p4_cell():
    """The P = 4 x 4 verdict (docs/results/verdict_p4x4/plan.md) pairs new seeds with the cell's five kept ones: its
    config must be what they ran."""
    kept = sorted((REPO / "docs" / "results" / "cell_p4_cpu" / "runs").glob("*/config.yaml"))
    kept += sorted((REPO / "docs" / "results" / "verdict_p4x4" / "runs").glob("*/config.yaml"))
    assert len(kept) >= 15
    check_verdict_cell(REPO / "configs" / "verdict_p4x4.yaml", kept)


@pytest.mark.unit
def test_the_p8x2_verdict_config_is_the_p4x4_one_at_8_ranks():
    """The P = 8 x 2 verdict (docs/results/verdict_p8x2/plan.md) asks the P = 4 x 4 question at 2 utterances per rank:
    the same settings but for the ranks (the global batch stays 16)."""
    p8x2, p4x4 = (load_config(REPO / "configs" / f"verdict_{cell}.yaml") for cell in ("p8x2", "p4x4"))
    assert differing_keys(p8x2, p4x4) == {"distributed.world_size"}
    assert (p8x2.distributed.world_size, p8x2.train.global_batch_size) == (8, 16)
    check_verdict_cell(REPO / "configs" / "verdict_p8x2.yaml",
                       sorted((REPO / "docs" / "results" / "verdict_p8x2" / "runs").glob("*/config.yaml")))


@pytest.mark.unit
def test_an_empty_override_is_the_empty_string():
    """`data.test_manifest=` means no test set, like data.test_manifest=''."""
    assert load_config(None, ["data.test_manifest="]).data.test_manifest == ""
    assert load_config(None, ["data.test_manifest=''"]).data.test_manifest == ""
    with pytest.raises(ConfigError, match=r"train\.epochs must be int, got ''"):
        load_config(None, ["train.epochs="])


@pytest.mark.unit
def test_batch_per_rank_scales_the_global_batch_with_the_ranks(tmp_path):
    cfg = load_config(None, ["train.batch_per_rank=3"])
    assert cfg.train.global_batch_size is None  # the default 32 is not used
    for ranks in (1, 2, 7):
        resolved = resolve_world_size(cfg, ranks)
        assert (resolved.train.global_batch_size, resolved.train.batch_per_rank) == (3 * ranks, None)
        assert resolved.distributed.world_size == ranks
        assert load_config(write(tmp_path, to_yaml(resolved))) == resolved  # the saved config is the same run
    resolved = resolve_for_run(cfg, Communicator())
    assert resolved.train.global_batch_size == 3 and resolved.train.batch_per_rank is None
    # A fixed global batch stays fixed, and must be divisible by the rank count.
    assert resolve_world_size(load_config(None), 2).train.global_batch_size == 32
    with pytest.raises(ConfigError, match="train.global_batch_size=32 is not divisible by the 3 ranks"):
        resolve_world_size(load_config(None), 3)


@pytest.mark.unit
def test_exactly_one_batch_size_is_set(tmp_path):
    path = write(tmp_path, "train:\n  global_batch_size: 64\n")
    with pytest.raises(ConfigError) as error:
        load_config(path, ["train.batch_per_rank=2"])
    assert (f"train.global_batch_size ({path}) and train.batch_per_rank (command-line override "
            f"'train.batch_per_rank=2') are both set" in str(error.value)), error.value
    cfg = load_config(path, ["train.global_batch_size=null", "train.batch_per_rank=2"])
    assert (cfg.train.global_batch_size, cfg.train.batch_per_rank) == (None, 2)
    with pytest.raises(ConfigError, match="set train.global_batch_size or train.batch_per_rank"):
        load_config(None, ["train.global_batch_size=null"])


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [1, 2])
def test_batch_per_rank_under_mpi(nprocs):
    out = check_mpi(nprocs, ["-m", "tests.mpi.batch_per_rank"], timeout=120)
    assert f"P={nprocs}: global batch {3 * nprocs}, 3 utterances per rank per step" in out, out


@pytest.mark.unit
def test_check_config_command(tmp_path, capsys):
    config = str(write(tmp_path, "model:\n  name: lstman4_tiny\ntrain:\n  global_batch_size: 8\n"))
    assert check_config.main(["--config", config, "--world-size", "4"]) == 0
    assert check_config.main(["--config", config, "--world-size", "3"]) == 2
    assert capsys.readouterr().err == ("error: train.global_batch_size=8 is not divisible by the 3 ranks (choose a "
                                       "rank count that divides it, or set train.batch_per_rank instead)\n")
    assert check_config.main(["--config", config, "--world-size", "3", "train.global_batch_size=null",
                              "train.batch_per_rank=2"]) == 0
    assert check_config.main(["--config", config, "--world-size", "2", "trian.epochs=3"]) == 2
    assert "error: command-line override 'trian.epochs=3': unknown key 'trian'" in capsys.readouterr().err
    runs = tmp_path / "runs.txt"
    runs.write_text("4 name=a\n\n3 name=b\n6 name=c compression.density=5\n2 name=d\n5 name=e\n")
    assert check_config.main(["--config", config, "--runs", str(runs)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["error: train.global_batch_size=8 is not divisible by the 3 ranks (choose a rank count that "
                   "divides it, or set train.batch_per_rank instead) (run: 3 ranks name=b)",
                   "error: command-line override 'compression.density=5': compression.density must be in (0, 1], "
                   "got 5.0 (run: 6 ranks name=c compression.density=5)",
                   "error: train.global_batch_size=8 is not divisible by the 5 ranks (choose a rank count that "
                   "divides it, or set train.batch_per_rank instead) (run: 5 ranks name=e)"]
    runs.write_text("x name=a\n")
    assert check_config.main(["--config", config, "--runs", str(runs)]) == 2
    assert "--runs line 1: expected 'RANKS key=value ...'" in capsys.readouterr().err


@pytest.mark.unit
def test_dgc_memory_is_refused_where_it_cannot_work():
    """compression.memory=dgc needs a selection and no dense steps (they would skip the momentum it carries)."""
    dgc = ["compression.memory=dgc", "compression.algorithm=topka"]
    assert load_config(None, dgc + ["compression.warmup_steps=0"]).compression.memory == "dgc"
    with pytest.raises(ConfigError, match=r"override 'compression\.memory=dgc'.*needs compression\.warmup_steps=0"):
        load_config(None, dgc)  # the default warm-up is 'auto'
    with pytest.raises(ConfigError, match=r"compression\.dense_1d=false"):
        load_config(None, dgc + ["compression.warmup_steps=0", "compression.dense_1d=true"])
    with pytest.raises(ConfigError, match=r"compression\.memory=dgc needs a selection .* not 'powersgd'"):
        load_config(None, ["compression.memory=dgc", "compression.algorithm=powersgd", "compression.warmup_steps=0"])
    with pytest.raises(ConfigError,
                       match=r"compression\.memory must be one of residual, dgc, ef21, lowpass, got 'momentum'"):
        load_config(None, ["compression.memory=momentum"])
    with pytest.raises(ConfigError, match=r"compression\.density_warmup_epochs must be >= 0"):
        load_config(None, ["compression.density_warmup_epochs=-1"])
