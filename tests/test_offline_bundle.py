"""The offline bundle (scripts/pack_offline.sh), its bootstrap.sh and bench/gpu_suite.sh --dry-run.

The full bundle for Python 3.12 (what a GPU image has) is built and checked: under 57 MiB, all of AN4
as FLAC decoding to the SPHERE samples, manifests equal to the SPHERE ones but for the relative
audio paths, the tracked files, the wheels for cp312. A small bundle (16 utterances per split) for
THIS Python is unpacked in a fresh directory and run with an "image": a fresh venv that sees this
project's torch, numpy, pandas, ... but none of the bundled packages (nor sparse_asr), as on a GPU
node: bootstrap, imports from the bundle, mpiexec -n 2, the suite's dry run (which trains on 1 and 2 ranks).
Wheels are downloaded once into .cache/offline-wheels (gitignored); with a cold cache and no
reachable package index the tests skip, saying so.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from importlib import metadata
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import soundfile
import torch
import yaml

from sparse_asr.data.manifest import missing_files, read_manifest
from sparse_asr.training.runtime import precision_problem
from tests.conftest import REPO

pytestmark = [pytest.mark.tooling, pytest.mark.xdist_group("bundle")]  # its fixtures built once (conftest.py)

MIB = 2**20
NO_BF16 = "skipped (this CPU has no bfloat16 kernels)"  # bench/gpu_suite.sh's status where bf16 cannot run
HERE = f"{sys.version_info.major}.{sys.version_info.minor}"
BUNDLED = ["soundfile", "cffi", "pycparser", "Levenshtein", "python-Levenshtein", "rapidfuzz", "mpi4py", "mpich",
           "flashlight-text"]
IMAGE_MODULES = ["torch", "torchaudio", "numpy", "pandas", "tensorboard", "yaml", "matplotlib"]
SPLITS = {"train": 849, "dev": 99, "test": 130}
SHOW_ENV = "python3 -c 'import json, os; print(json.dumps(dict(os.environ)))'"  # the environment, as JSON


def index_reachable() -> bool:
    """mpich is on no local mirror here: listing its versions needs the package index itself."""
    proc = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "mpich", "--disable-pip-version-check"],
                          capture_output=True, text=True, timeout=120)
    return proc.returncode == 0


def pack(out: Path, python: str, source: Path, *more: str) -> Path:
    proc = subprocess.run(["bash", "scripts/pack_offline.sh", "--python", python, "--out", str(out),
                           "--source", str(source), *more], cwd=REPO, capture_output=True, text=True, timeout=600)
    if proc.returncode == 3 and not index_reachable():
        pytest.skip(f"the wheels for Python {python} are not cached in .cache/offline-wheels and the package "
                    f"index cannot be reached: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out / f"sparse_asr-offline-py{python}"


def file_bytes(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def bundle312(an4_prepared, tmp_path_factory) -> Path:
    return pack(tmp_path_factory.mktemp("pack312"), "3.12", an4_prepared["root"])


@pytest.fixture(scope="module")
def bundle_here(an4_prepared, tmp_path_factory) -> Path:
    return pack(tmp_path_factory.mktemp("pack_here"), HERE, an4_prepared["root"], "--max-utterances", "16")


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> dict:
    """Environment of a node whose python3 has torch & co. but none of the bundled packages: a fresh venv
    (pip included, as images have it) seeing a view of this venv's site-packages without them."""
    root = tmp_path_factory.mktemp("image")
    site = Path(sysconfig.get_paths()["purelib"])
    hidden = set()
    for name in BUNDLED + ["sparse-asr"]:
        for file in metadata.distribution(name).files:
            if file.parts[0] != "..":  # mpich's bin/ and lib/ live outside site-packages: not in the view anyway
                hidden.add(file.parts[0])
    view = root / "view"
    view.mkdir()
    for entry in site.iterdir():
        if entry.name not in hidden and not entry.name.endswith(".pth"):
            (view / entry.name).symlink_to(entry)
    base = Path(os.path.realpath(sys.executable))
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(root / "venv")], check=True, timeout=120)
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    image_site = subprocess.run([str(root / "venv/bin/python"), "-c", purelib], capture_output=True, text=True,
                                check=True).stdout.strip()
    Path(image_site, "image.pth").write_text(f"{view}\n")
    return {"PATH": f"{root / 'venv/bin'}:/usr/bin:/bin", "HOME": os.environ.get("HOME", str(root)),
            "OMP_NUM_THREADS": "1", "LANG": "C.UTF-8"}


def run(args, env: dict, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def unpacked(bundle_here, image, tmp_path_factory) -> tuple[Path, dict, str]:
    """The small bundle's .tar.gz unpacked in a fresh directory and bootstrapped: (its folder, the
    environment after `source bootstrap.sh`, what bootstrap.sh said on stderr)."""
    node = tmp_path_factory.mktemp("node")
    with tarfile.open(f"{bundle_here}.tar.gz") as tar:
        tar.extractall(node, filter="data")
    folder = node / bundle_here.name
    proc = run(["bash", "-c", f"source bootstrap.sh >&2 && {SHOW_ENV}"], image, folder)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return folder, json.loads(proc.stdout), proc.stderr


def test_image_lacks_the_bundled_packages(image, tmp_path):
    proc = run(["python3", "-c", "import importlib.util as u, sys; print([m for m in sys.argv[1:] if u.find_spec(m)])",
                *IMAGE_MODULES, "soundfile", "Levenshtein", "mpi4py", "cffi", "flashlight", "sparse_asr"],
               image, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == repr(IMAGE_MODULES)
    assert shutil.which("mpiexec", path=image["PATH"]) is None


# ------------------------------------------------------------------------------------- the full bundle
def test_full_bundle_is_under_57_mib_and_travels_with_the_checkout(bundle312):
    """A lent GPU machine receives the checkout and the carried bundle (folder or tar.gz), 64 MiB at most
    together; the two stay under 60 MiB, leaving room for the results a call writes back into the tree. The kept
    results (docs/results/, growing with every kept run) stay behind: a device call runs from a sparse checkout
    without them (scripts/pack_offline.sh's header says how)."""
    folder, tar = file_bytes(bundle312), file_bytes(Path(f"{bundle312}.tar.gz"))
    assert folder < 57 * MIB and tar < 57 * MIB, f"folder {folder / MIB:.2f} MiB, tar.gz {tar / MIB:.2f} MiB"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    checkout = sum((REPO / name).stat().st_size for name in tracked.decode().split("\0")
                   if (REPO / name).is_file() and not name.startswith("docs/results/"))
    for carried in (folder, tar):
        assert carried + checkout < 60 * MIB, f"bundle {carried / MIB:.2f} MiB + checkout {checkout / MIB:.2f} MiB"
    assert file_bytes(bundle312 / "datasets" / "an4") > 35 * MIB  # all of AN4 is in it


def test_full_bundle_holds_an4_as_flac_with_relative_manifests(bundle312, an4_prepared):
    for split, count in SPLITS.items():
        path = bundle312 / "manifests" / f"an4_{split}.csv"
        flac, sphere = read_manifest(path), read_manifest(an4_prepared[split])
        assert len(flac) == count and missing_files(flac) == []
        pd.testing.assert_frame_equal(flac.drop(columns="audio"), sphere.drop(columns="audio"))
        rows = path.read_text().splitlines()[1:]
        assert all(row.startswith(f"../datasets/an4/{split}/") and ".flac," in row for row in rows), rows[:2]
        for flac_path, sphere_path in list(zip(flac["audio"], sphere["audio"]))[::25]:  # a sample, bit for bit
            assert Path(flac_path).stem == Path(sphere_path).stem and Path(flac_path).parent.name == split
            np.testing.assert_array_equal(soundfile.read(flac_path, dtype="int16")[0],
                                          soundfile.read(sphere_path, dtype="int16")[0])
    assert len(list((bundle312 / "datasets" / "an4").rglob("*.flac"))) == sum(SPLITS.values())
    assert "Carnegie Mellon University" in (bundle312 / "datasets" / "LICENSE.an4").read_text()


def test_full_bundle_has_the_tracked_files_and_cp312_wheels(bundle312):
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    expected = {f for f in tracked
                if not f.startswith(("docs/", "tests/")) and f != "DESIGN.md" and (REPO / f).exists()}
    generated = {"bootstrap.sh", "BUNDLE.md"}
    shipped = {str(p.relative_to(bundle312)) for p in bundle312.rglob("*") if p.is_file()
               and not str(p.relative_to(bundle312)).startswith(("datasets/", "wheels/", "manifests/an4_"))}
    assert shipped == expected | generated
    for name in expected:
        assert (bundle312 / name).read_bytes() == (REPO / name).read_bytes(), name
    assert (bundle312 / "bootstrap.sh").read_bytes() == (REPO / "scripts/offline/bootstrap.sh").read_bytes()

    pins = (bundle312 / "wheels" / "requirements.txt").read_text().split()
    assert sorted(p.split("==")[0].lower() for p in pins) == sorted(n.lower() for n in BUNDLED)
    wheels = sorted((bundle312 / "wheels").glob("*.whl"))
    assert len(wheels) == len(BUNDLED)
    for wheel in wheels:  # name-version-pythontag-abitag-platformtag.whl
        name, version, python_tag, abi_tag, platform_tag = wheel.stem.split("-")
        assert f"{name.replace('_', '-').lower()}=={version}" in {p.lower() for p in pins}, wheel.name
        assert set(python_tag.split(".")) & {"cp312", "py3"} and abi_tag in ("cp312", "abi3", "none"), wheel.name
        assert all(re.fullmatch(r"manylinux(1|2014|_2_\d+)_x86_64|any", tag) for tag in platform_tag.split(".")), \
            wheel.name
    assert (bundle312 / "wheels" / "PYTHON_VERSION").read_text().strip() == "3.12"

    # mpich's wheel slimmed (scripts/offline/slim_mpich.py): the library mpi4py loads and the launcher kept,
    # the standard-ABI copy and the headers gone, RECORD naming exactly the members (pip checks it)
    with zipfile.ZipFile(next((bundle312 / "wheels").glob("mpich-*.whl"))) as wheel:
        members = {n for n in wheel.namelist() if not n.endswith("/")}
        record = next(n for n in members if n.endswith(".dist-info/RECORD"))
        assert {row.split(",")[0] for row in wheel.read(record).decode().splitlines() if row} == members
    data = {n.split(".data/data/", 1)[1] for n in members if ".data/data/" in n}
    assert {"lib/libmpi.so.12", "bin/mpiexec", "bin/hydra_pmi_proxy"} <= data
    assert not [n for n in data if n.startswith("include/") or "libmpi_abi" in n], sorted(data)


def test_pinned_wheels_are_the_tested_versions(bundle312):
    """The bundle pins requirements.txt's versions, and for the rest what setup.sh installed here."""
    lines = [line.split("#")[0].strip() for line in (REPO / "requirements.txt").read_text().splitlines()]
    required = dict(line.split("==") for line in lines if "==" in line)
    for pin in (bundle312 / "wheels" / "requirements.txt").read_text().split():
        name, version = pin.split("==")
        assert metadata.version(name) == version, \
            f"{name}: bundle pins {version}, this venv has {metadata.version(name)}"
        assert required.get(name, version) == version


def test_bootstrap_refuses_a_python_of_another_version(bundle312, image, tmp_path):
    proc = run(["bash", "bootstrap.sh"], image, bundle312)
    assert proc.returncode == 1 and proc.stdout == ""
    assert f"wheels are for Python 3.12, but python3 is Python {HERE}" in proc.stderr, proc.stderr
    assert f"pack_offline.sh --python {HERE}" in proc.stderr
    assert not (bundle312 / ".deps").exists()


def test_bootstrap_names_what_the_image_lacks(unpacked, tmp_path):
    folder = unpacked[0]
    bare = tmp_path / "bare"
    subprocess.run([os.path.realpath(sys.executable), "-m", "venv", "--without-pip", str(bare)], check=True,
                   timeout=120)
    proc = run(["bash", "bootstrap.sh"], {"PATH": "/usr/bin:/bin", "PYTHON": str(bare / "bin/python")}, folder)
    assert proc.returncode == 1
    assert f"lacks {' '.join(IMAGE_MODULES)}" in proc.stderr, proc.stderr


def test_pack_refuses_bad_arguments(tmp_path):
    for args, message in [(["--python", "3"], "--python must be a CPython version"),
                          (["--max-utterances", "-1"], "option --max-utterances needs a value"),
                          (["--max-utterances", "few"], "--max-utterances must be an integer"),
                          (["--source", str(tmp_path / "nowhere")], "does not exist"),
                          (["--bogus"], "unknown argument '--bogus'")]:
        proc = subprocess.run(["bash", "scripts/pack_offline.sh", *args], cwd=REPO, capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)


# ------------------------------------------------------------------------------------- on the "node"
def test_bootstrap_installs_into_the_bundle_and_is_idempotent(unpacked, image):
    folder, env, said = unpacked
    deps = folder / ".deps"
    assert "installing the bundled wheels" in said and "mpiexec -n 2 works" in said, said
    assert env["PATH"].split(":")[0] == str(deps / "bin") and env["LD_LIBRARY_PATH"] == str(deps / "lib")
    assert env["PYTHONPATH"].split(":")[0] == str(folder)
    assert env["MPI4PY_LIBMPI"] == str(deps / "lib" / "libmpi.so.12")
    # run as a program it prints the same settings, and installs nothing again
    proc = run(["bash", "-c", f'eval "$(bash bootstrap.sh)" && {SHOW_ENV}'], image, folder)
    assert proc.returncode == 0 and "installing" not in proc.stderr, proc.stderr
    again = json.loads(proc.stdout)
    assert all(again[k] == env[k] for k in ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "MPI4PY_LIBMPI"))


def test_every_dependency_imports_from_the_bundle(unpacked):
    folder, env, _ = unpacked
    code = ("import json, cffi, pycparser, soundfile, Levenshtein, rapidfuzz, sparse_asr, torch\n"
            "from mpi4py import MPI\n"
            "from flashlight.lib.text import decoder\n"  # torchaudio's ctc_decoder (the beam) loads it
            "mods = [cffi, pycparser, soundfile, Levenshtein, rapidfuzz, MPI, decoder, sparse_asr, torch]\n"
            "maps = sorted({l.split()[-1] for l in open('/proc/self/maps') if 'libmpi' in l})\n"
            "print(json.dumps({'files': {m.__name__: m.__file__ for m in mods}, 'libmpi': maps,"
            " 'distance': Levenshtein.distance('kitten', 'sitting'), 'mpi': MPI.Get_library_version()}))")
    proc = run(["python3", "-c", code], env, folder)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    deps = str(folder / ".deps") + "/"
    for name, file in found["files"].items():
        if name == "sparse_asr":
            assert file == str(folder / "sparse_asr" / "__init__.py")
        elif name == "torch":
            assert not file.startswith(str(folder))  # the image's
        else:
            assert file.startswith(deps), (name, file)
    assert found["libmpi"] == [deps + "lib/libmpi.so.12"] and "MPICH" in found["mpi"]
    assert found["distance"] == 3


@pytest.mark.mpi
def test_mpiexec_runs_two_ranks_from_the_bundle(unpacked):
    folder, env, _ = unpacked
    assert shutil.which("mpiexec", path=env["PATH"]) == str(folder / ".deps" / "bin" / "mpiexec")
    proc = run(["mpiexec", "-n", "2", "python3", "-c",
                "from mpi4py import MPI; c = MPI.COMM_WORLD; print(c.rank, c.size, c.allreduce(c.rank + 1))"],
               env, folder)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["0 2 3", "1 2 3"]


@pytest.mark.mpi
def test_gpu_suite_dry_run_from_the_bundle(unpacked, tmp_path):
    folder, env, _ = unpacked
    out = tmp_path / "suite"
    proc = run(["bash", "bench/gpu_suite.sh", "--dry-run", "--out", str(out)], env, folder, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    steps = (out / "steps.tsv").read_text().splitlines()
    # bf16 runs where the host CPU has oneDNN's bfloat16 kernels and is skipped (not failed) where it has not
    bf16 = precision_problem("bf16", torch.device("cpu")) is None
    assert [line.split("\t")[:2] for line in steps[1:]] == [
        [step, "ok" if bf16 or step != "step_P1_bf16" else NO_BF16]
        for step in ("env", "selection", "step_P1", "step_P1_bf16", "step_P2", "train", "summary")]
    summary = (out / "summary.md").read_text()
    step_rows = [line for line in summary.splitlines() if re.match(r"\| [12] \| (fp32|bf16) \|", line)]
    assert [tuple(line.split(" | ")[:3]) for line in step_rows] == [
        ("| 1", "fp32", "dense"), ("| 1", "fp32", "topka"), ("| 1", "fp32", "oktopk"),
        *([("| 1", "bf16", "dense"), ("| 1", "bf16", "oktopk")] if bf16 else []),
        ("| 2", "fp32", "dense"), ("| 2", "fp32", "topka"), ("| 2", "fp32", "oktopk")]
    trainings = (("dense-p1", "dense", "1", "fp32"), *([("dense-p1-bf16", "dense", "1", "bf16")] if bf16 else []),
                 ("oktopk-p2", "oktopk", "2", "fp32"), ("oktopk-p4", "oktopk", "4", "fp32"))
    for run_name, algorithm, ranks, precision in trainings:
        row = next(line for line in summary.splitlines() if line.startswith(f"| {run_name} |")).split(" | ")
        assert row[1:4] == [algorithm, ranks, precision] and re.fullmatch(r"\d+\.\d{3}", row[11]), row  # a test WER
        # train.py from the bundle, on its FLAC manifests, with the recipe and the suite's time limit
        assert "data: 16 train, 8 dev, 8 test utterances" in (out / f"train_{run_name}.log").read_text()
        config = yaml.safe_load((out / "runs" / run_name / "config.yaml").read_text())
        assert config["model"]["sync_batchnorm"] and config["data"]["freq_masks"] == 2, run_name
        assert config["train"]["max_minutes"] == 3.0, run_name  # (240 s - 60 s) / 60
    assert "| cpu | 1 | 0.02 |" in summary and "torch.topk" in summary
    assert "| lstman4 dense, 1 process: test WER <= 0.15 |" in summary
    metrics = [json.loads(line) for line in (out / "runs/oktopk-p2/metrics.jsonl").read_text().splitlines()]
    assert [m["epoch"] for m in metrics if m["kind"] == "test"] == [1]
    assert not list((out / "runs").glob("*/checkpoints")), "checkpoints are removed at the end"


@pytest.mark.mpi
def test_gpu_suite_study_dry_run_from_the_bundle(unpacked, tmp_path):
    """The GPU throughput study, prepared on the CPU: dense alone before and after the fast settings (epochs per
    minute), then four concurrent trainings at one seed (dense and Ok-Topk on 1 rank, Ok-Topk and its complete_values
    remedy on 4), flat metrics files, one plot, the summary. --no-speed: the speed steps' dry run is the
    suite's own (test_gpu_suite_dry_run_from_the_bundle)."""
    folder, env, _ = unpacked
    out = tmp_path / "study"
    proc = run(["bash", "bench/gpu_suite.sh", "--dry-run", "--study", "--no-speed", "--seed", "3", "--out", str(out)],
               env, folder, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    status = dict(line.split("\t")[:2] for line in (out / "steps.tsv").read_text().splitlines()[1:])
    assert status == {"env": "ok", "rate": "ok", "train": "ok", "summary": "ok"}, status
    fast = {"num_workers": 0, "cache_features": True, "eval_every_epochs": 2, "checkpoint_every_epochs": 100000}
    # (before: the recipe's settings, but for the dry run's num_workers=0, which a GPU run does not set)
    for side, settings in (("before", {"num_workers": 0, "cache_features": False, "eval_every_epochs": 1,
                                       "checkpoint_every_epochs": 1}), ("after", fast)):
        config = yaml.safe_load((out / "rate_runs" / side / "config.yaml").read_text())
        assert {key: {**config["data"], **config["train"]}[key] for key in settings} == settings, side
        epochs = [json.loads(line) for line in (out / f"metrics_rate_{side}.jsonl").read_text().splitlines()]
        assert len([m for m in epochs if m["kind"] == "epoch"]) == 3, side
        assert re.search(rf"^\| {side} \| 3 \| \d+\.\d \| \d+\.\d \|$", (out / "rate.md").read_text(), re.M), side
    runs = {"dense-p1": ("dense", 1, {}), "oktopk-p1": ("oktopk", 1, {}), "oktopk-p4": ("oktopk", 4, {}),
            "oktopk-cv-p4": ("oktopk", 4, {"complete_values": True})}
    for name, (algorithm, ranks, options) in runs.items():
        config = yaml.safe_load((out / f"config_{name}.yaml").read_text())
        assert (config["compression"]["algorithm"], config["distributed"]["world_size"], config["seed"],
                config["compression"]["options"]) == (algorithm, ranks, 3, options), name
        assert {key: {**config["data"], **config["train"]}[key] for key in fast} == fast, name
        metrics = [json.loads(line) for line in (out / f"metrics_{name}.jsonl").read_text().splitlines()]
        assert [m["epoch"] for m in metrics if m["kind"] == "test"] == [1], name
    assert (out / "curves_vs_step.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = (out / "summary.md").read_text()
    assert all(f"| {name} | " in summary for name in runs), summary
    assert "| Ok-Topk, P = 4: dev WER within 5% relative of dense fp32" in summary
    assert "| epochs per minute x2 |" in summary
    proc = run(["bash", "bench/gpu_suite.sh", "--dry-run", "--no-speed"], env, folder, timeout=60)
    assert proc.returncode == 2 and "--no-speed goes with --study" in proc.stderr


def test_gpu_suite_reports_a_failed_step_and_goes_on(unpacked, tmp_path):
    folder, env, _ = unpacked
    out = tmp_path / "suite"
    proc = run(["bash", "bench/gpu_suite.sh", "--dry-run", "--out", str(out)], {**env, "MPIEXEC": "false"}, folder)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    status = dict(line.split("\t")[:2] for line in (out / "steps.tsv").read_text().splitlines()[1:])
    bf16 = "failed (exit 1)" if precision_problem("bf16", torch.device("cpu")) is None else NO_BF16
    assert status == {"env": "ok", "selection": "ok", "step_P1": "failed (exit 1)", "step_P1_bf16": bf16,
                      "step_P2": "failed (exit 1)", "train": "failed (exit 1)", "summary": "ok"}
    summary = (out / "summary.md").read_text()
    assert "| step_P2 | failed (exit 1) |" in summary and "torch.topk" in summary
    assert "some steps FAILED" in proc.stdout
    # a CPU without bfloat16 kernels (oneDNN capped at AVX2, as on an AMD EPYC): the bf16 step is skipped, and a
    # skip is no failure (every MPI step "succeeds" through `true` here, so the suite's exit status is the skip's)
    out = tmp_path / "avx2"
    proc = run(["bash", "bench/gpu_suite.sh", "--dry-run", "--out", str(out)],
               {**env, "MPIEXEC": "true", "ONEDNN_MAX_CPU_ISA": "AVX2"}, folder)
    status = dict(line.split("\t")[:2] for line in (out / "steps.tsv").read_text().splitlines()[1:])
    assert status["step_P1_bf16"] == NO_BF16, proc.stdout
    assert "dense-p1-bf16 skipped" in proc.stdout and "dense-p1-bf16" not in status
    assert proc.returncode == 0 and "FAILED" not in proc.stdout, proc.stdout + proc.stderr
    # --trainings-only: the trainings get the whole time; selection and step time are not run
    out = tmp_path / "trainings"
    proc = run(["bash", "bench/gpu_suite.sh", "--dry-run", "--trainings-only", "--out", str(out)],
               {**env, "MPIEXEC": "false"}, folder)
    status = dict(line.split("\t")[:2] for line in (out / "steps.tsv").read_text().splitlines()[1:])
    assert proc.returncode == 1 and status == {"env": "ok", "train": "failed (exit 1)", "summary": "ok"}, proc.stdout


def test_gpu_suite_refuses_bad_arguments(unpacked, tmp_path):
    folder, env, _ = unpacked
    proc = run(["bash", "bench/gpu_suite.sh", "--fast"], env, folder)
    assert proc.returncode == 2 and "unknown argument '--fast'" in proc.stderr
    proc = run(["bash", "bench/gpu_suite.sh", "--dry-run"], {**env, "EPOCHS": "0"}, folder)
    assert proc.returncode == 2 and "STEPS, EPOCHS, SUITE_SECONDS and RATE_SECONDS must be positive" in proc.stderr
    proc = run(["bash", "bench/gpu_suite.sh", "--dry-run", "--study"], {**env, "RATE_SECONDS": "x"}, folder)
    assert proc.returncode == 2 and "got '24', '161', '530', 'x'" in proc.stderr
