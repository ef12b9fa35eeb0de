"""Cluster scripts: the PBS/Polaris and Slurm submit helpers and job scripts, the GPU-affinity wrapper and
the sweep. Dry runs must print exactly the expected qsub/sbatch and mpiexec/srun lines; real submissions
go to fake qsub/sbatch commands that record their arguments; bad arguments exit 2 with a clear message."""
import os
import shlex
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.tooling

REPO = Path(__file__).resolve().parent.parent
VENV = os.path.realpath(REPO / ".venv")  # submit.sh passes the resolved path: .venv may be a symlink
CONFIG = "tests/configs/cluster.yaml"  # valid at every rank count: the submit helpers check the config
SMOKE = "configs/smoke.yaml"  # global batch 4: refused at 3 ranks
SCRIPTS = ["scripts/polaris/train.pbs", "scripts/polaris/submit.sh", "scripts/polaris/set_affinity_gpu_polaris.sh",
           "scripts/polaris/setup_env.sh", "scripts/slurm/train.sbatch", "scripts/slurm/submit.sh", "scripts/sweep.sh",
           "scripts/lib/args.sh"]
# Variables the scripts read: a leftover value in the caller's shell must change nothing.
LEFTOVERS = {"NODES": "99", "RANKS_PER_NODE": "3", "CONFIG": "/nonexistent.yaml", "OVERRIDES": "evil.key=1",
             "REPO_DIR": "/tmp", "VENV": "/tmp/leftover", "CUDA_AWARE_MPI": "1", "MODULES": "leftover",
             "SRUN_MPI": "leftover", "CPUS_PER_TASK": "77", "DEPTH": "5"}


def run(args, env=None, cwd=REPO, clean=True):
    """Run a script; `clean` drops the PBS/Slurm job variables and the ones in LEFTOVERS first."""
    base = {k: v for k, v in os.environ.items()
            if not (clean and (k.startswith(("PBS_", "SLURM_")) or k in LEFTOVERS or k == "DRY_RUN"))}
    base.update(env or {})
    return subprocess.run(["bash", str(REPO / args[0]), *args[1:]], cwd=cwd, env=base, capture_output=True, text=True,
                          timeout=60)


def ok(args, env=None, **kw) -> list[str]:
    proc = run(args, env, **kw)
    assert proc.returncode == 0, f"{args} failed ({proc.returncode})\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout.splitlines()


def command_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if not line.startswith("#")]


def fake_command(tmp_path: Path, name: str) -> tuple[dict, Path]:
    """A fake `name` on PATH that appends its arguments (one per line, then '--end') to a log file."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / f"{name}.log"
    script = bin_dir / name
    script.write_text(f'#!/bin/bash\nprintf "%s\\n" "$@" >> {log}\necho "--end" >> {log}\necho 123.fake\n')
    script.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}, log


def recorded_calls(log: Path) -> list[list[str]]:
    calls, current = [], []
    for line in log.read_text().splitlines():
        if line == "--end":
            calls.append(current)
            current = []
        else:
            current.append(line)
    return calls


def test_scripts_parse_and_are_executable():
    for script in SCRIPTS:
        subprocess.run(["bash", "-n", script], cwd=REPO, check=True)
        if not script.endswith("args.sh"):
            assert os.access(REPO / script, os.X_OK), f"{script} is not executable"


# ------------------------------------------------------------------------------------------------ PBS / Polaris
def test_polaris_submit_dry_run_prints_qsub_and_mpiexec_lines():
    lines = ok(["scripts/polaris/submit.sh", "-c", CONFIG, "-N", "2", "-A", "MYPROJ", "-t", "00:30:00", "--dry-run",
                "compression.algorithm=oktopk", "compression.density=0.02", "name=ok-p8"])
    commands = command_lines(lines)
    assert commands == [
        f"qsub -A MYPROJ -q debug -N ok-p8 -l select=2:system=polaris -l place=scatter -l walltime=00:30:00 "
        f"-l filesystems=home:eagle -v 'REPO_DIR={REPO},CONFIG={CONFIG},RANKS_PER_NODE=4,VENV={REPO}/.venv-polaris,"
        f"CUDA_AWARE_MPI=0,OVERRIDES=compression.algorithm=oktopk compression.density=0.02 name=ok-p8' "
        f"{REPO}/scripts/polaris/train.pbs",
        f"mpiexec -n 8 --ppn 4 --depth=8 --cpu-bind depth scripts/polaris/set_affinity_gpu_polaris.sh "
        f"python train.py --config {CONFIG} distributed.world_size=8 distributed.device=cuda "
        f"compression.algorithm=oktopk compression.density=0.02 name=ok-p8",
    ]


def test_polaris_submit_defaults_queue_by_size_and_cuda_aware(tmp_path):
    outside = tmp_path / "exp.yaml"  # a config outside the repository keeps its absolute path
    outside.write_text("seed: 1\ntrain:\n  global_batch_size: 48\n")  # 24 ranks below
    lines = command_lines(ok(["scripts/polaris/submit.sh", "-c", str(outside), "-N", "12", "--ppn", "2", "-A", "P",
                              "--cuda-aware-mpi", "--dry-run"]))
    qsub = shlex.split(lines[0])
    assert qsub[:6] == ["qsub", "-A", "P", "-q", "prod", "-N"] and qsub[6] == "exp"
    assert "select=12:system=polaris" in qsub and "walltime=01:00:00" in qsub
    assert lines[1] == (f"mpiexec -n 24 --ppn 2 --depth=8 --cpu-bind depth scripts/polaris/set_affinity_gpu_polaris.sh "
                        f"python train.py --config {outside} distributed.world_size=24 distributed.device=cuda "
                        f"distributed.cuda_aware_mpi=true")

    def queue(n):
        return shlex.split(command_lines(ok(["scripts/polaris/submit.sh", "-c", CONFIG, "-N", n, "-A", "P",
                                             "--dry-run", "--skip-config-check"]))[0])[4]

    assert [queue("1"), queue("2"), queue("3"), queue("10"), queue("11")] == \
        ["debug", "debug", "debug-scaling", "debug-scaling", "prod"]


def test_polaris_submit_really_calls_qsub_with_the_dry_run_words(tmp_path):
    env, log = fake_command(tmp_path, "qsub")
    args = ["scripts/polaris/submit.sh", "-c", CONFIG, "-N", "3", "-A", "X", "-q", "prod", "train.epochs=1"]
    dry = shlex.split(command_lines(ok(args + ["--dry-run"], env))[0])
    out = ok(args, {**env, **LEFTOVERS, "DRY_RUN": "1"}, clean=False)  # leftovers must not matter
    assert out == ["123.fake"]
    assert recorded_calls(log) == [dry[1:]]


def test_pbs_job_script_dry_run(tmp_path):
    env = {"DRY_RUN": "1", "NODES": "3", "RANKS_PER_NODE": "2", "CONFIG": CONFIG, "REPO_DIR": str(REPO),
           "OVERRIDES": "train.epochs=2 compression.options.local_threshold_interval=16"}
    lines = ok(["scripts/polaris/train.pbs"], env, cwd=tmp_path)  # runs from anywhere: REPO_DIR says where
    assert command_lines(lines) == [
        f"mpiexec -n 6 --ppn 2 --depth=8 --cpu-bind depth scripts/polaris/set_affinity_gpu_polaris.sh python train.py "
        f"--config {CONFIG} distributed.world_size=6 distributed.device=cuda train.epochs=2 "
        f"compression.options.local_threshold_interval=16"]
    # Inside a job the node count comes from PBS_NODEFILE (one line per rank slot; 2 distinct hosts here).
    nodefile = tmp_path / "nodes"
    nodefile.write_text("x1000c0s0b0n0\nx1000c0s0b0n0\nx1000c0s0b0n1\nx1000c0s0b0n1\n")
    env = {"DRY_RUN": "1", "PBS_NODEFILE": str(nodefile), "PBS_O_WORKDIR": str(REPO), "CONFIG": CONFIG}
    assert command_lines(ok(["scripts/polaris/train.pbs"], env, cwd=tmp_path)) == [
        f"mpiexec -n 8 --ppn 4 --depth=8 --cpu-bind depth scripts/polaris/set_affinity_gpu_polaris.sh python train.py "
        f"--config {CONFIG} distributed.world_size=8 distributed.device=cuda"]


@pytest.mark.parametrize("env, local_rank_env, expected", [
    ({}, {"PMI_LOCAL_RANK": "0"}, "3"),  # Polaris: GPU 3 is the one beside local rank 0's cores 0-7
    ({}, {"PMI_LOCAL_RANK": "1"}, "2"),
    ({}, {"PMI_LOCAL_RANK": "5"}, "2"),
    ({}, {"PALS_LOCAL_RANKID": "3"}, "0"),
    ({"REVERSE_GPUS": "0"}, {"PMI_LOCAL_RANK": "0"}, "0"),
    ({"REVERSE_GPUS": "0"}, {"PMI_LOCAL_RANK": "2"}, "2"),
    ({"GPUS_PER_NODE": "2"}, {"PMI_LOCAL_RANK": "3"}, "0"),
    ({"GPUS_PER_NODE": "2", "REVERSE_GPUS": "0"}, {"PMI_LOCAL_RANK": "3"}, "1"),
])
def test_gpu_affinity_wrapper(env, local_rank_env, expected):
    out = ok(["scripts/polaris/set_affinity_gpu_polaris.sh", "bash", "-c", 'echo "$CUDA_VISIBLE_DEVICES $0 $1"',
              "arg one", "two"], {**env, **local_rank_env, "CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert out == [f"{expected} arg one two"]  # one GPU, and the command's arguments passed through intact


def test_gpu_affinity_wrapper_needs_a_local_rank():
    env = {k: v for k, v in os.environ.items() if k not in ("PMI_LOCAL_RANK", "PALS_LOCAL_RANKID")}
    proc = subprocess.run(["bash", "scripts/polaris/set_affinity_gpu_polaris.sh", "true"], cwd=REPO, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "no local rank" in proc.stderr
    proc = subprocess.run(["bash", "scripts/polaris/set_affinity_gpu_polaris.sh", "true"], cwd=REPO,
                          env={**env, "PMI_LOCAL_RANK": "0", "REVERSE_GPUS": "yes"}, capture_output=True, text=True)
    assert proc.returncode == 2 and "REVERSE_GPUS must be 0 or 1, got 'yes'" in proc.stderr


# ------------------------------------------------------------------------------------------------ Slurm
def test_slurm_submit_dry_run_prints_sbatch_and_srun_lines():
    lines = ok(["scripts/slurm/submit.sh", "-c", CONFIG, "-N", "3", "-p", "gpu", "-A", "abc", "--cpus-per-task", "8",
                "--srun-mpi", "pmix", "--dry-run", "compression.algorithm=gtopk", "name=g3"])
    assert command_lines(lines) == [
        f"sbatch --job-name=g3 --nodes=3 --ntasks-per-node=4 --gpus-per-task=1 --time=01:00:00 --partition=gpu "
        f"--account=abc --cpus-per-task=8 --chdir={REPO} --output={REPO}/runs/slurm/%x-%j.out "
        f"--export=ALL,REPO_DIR={REPO},VENV={VENV},MODULES=,SRUN_MPI=pmix,CUDA_AWARE_MPI=0,DRY_RUN=0 "
        f"{REPO}/scripts/slurm/train.sbatch {CONFIG} compression.algorithm=gtopk name=g3",
        f"srun -n 12 --ntasks-per-node=4 --gpus-per-task=1 --cpu-bind=cores --cpus-per-task=8 --mpi=pmix "
        f"python train.py --config {CONFIG} distributed.world_size=12 distributed.device=cuda "
        f"compression.algorithm=gtopk name=g3",
    ]


def test_slurm_submit_really_calls_sbatch_with_the_dry_run_words(tmp_path):
    env, log = fake_command(tmp_path, "sbatch")
    args = ["scripts/slurm/submit.sh", "-c", CONFIG, "-N", "2", "--modules", "gcc cuda/12", "train.epochs=1"]
    dry = shlex.split(command_lines(ok(args + ["--dry-run"], env))[0])
    assert "--export=ALL,REPO_DIR=%s,VENV=%s,MODULES=gcc cuda/12,SRUN_MPI=,CUDA_AWARE_MPI=0,DRY_RUN=0" % (
        REPO, VENV) in dry
    logs = REPO / "runs" / "slurm"
    made = [d for d in (logs.parent, logs) if not d.exists()]
    try:
        assert ok(args, {**env, **LEFTOVERS, "DRY_RUN": "1"}, clean=False) == ["123.fake"]
        assert logs.is_dir()  # sbatch does not create its --output directory: the script must
    finally:
        for directory in reversed(made):
            directory.rmdir()  # only the empty directories this call made; never a user's logs
    assert recorded_calls(log) == [dry[1:]]


def test_slurm_job_script_dry_run_outside_and_inside_a_job(tmp_path):
    env = {"DRY_RUN": "1", "NODES": "2", "REPO_DIR": str(REPO)}
    assert command_lines(ok(["scripts/slurm/train.sbatch", CONFIG, "a.b=1"], env, cwd=tmp_path)) == [
        f"srun -n 8 --ntasks-per-node=4 --gpus-per-task=1 --cpu-bind=cores python train.py --config {CONFIG} "
        f"distributed.world_size=8 distributed.device=cuda a.b=1"]
    # Inside a job the shape comes from Slurm's variables, whatever NODES/RANKS_PER_NODE say.
    env = {"DRY_RUN": "1", "SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "4", "SLURM_NTASKS_PER_NODE": "2",
           "SLURM_CPUS_PER_TASK": "16", "NODES": "99", "RANKS_PER_NODE": "9"}
    assert command_lines(ok(["scripts/slurm/train.sbatch", CONFIG], env)) == [
        f"srun -n 8 --ntasks-per-node=2 --gpus-per-task=1 --cpu-bind=cores --cpus-per-task=16 python train.py "
        f"--config {CONFIG} distributed.world_size=8 distributed.device=cuda"]


# ------------------------------------------------------------------------------------------------ sweep
def test_sweep_local_dry_run_lists_every_run_with_a_distinct_name():
    lines = ok(["scripts/sweep.sh", "-c", CONFIG, "--dry-run", "--algorithms", "dense oktopk gtopk",
                "--densities", "0.01 0.02", "--ranks", "1 4", "train.epochs=1"], LEFTOVERS, clean=False)
    py = ".venv/bin/mpiexec -n {P} .venv/bin/python train.py --config " + CONFIG
    expected = []
    for P in (1, 4):
        expected.append(f"{py.format(P=P)} name=cluster-dense-p{P} compression.algorithm=dense "
                        f"distributed.world_size={P} train.epochs=1")
        for algorithm in ("oktopk", "gtopk"):
            for d in ("0.01", "0.02"):
                expected.append(f"{py.format(P=P)} name=cluster-{algorithm}-d{d}-p{P} "
                                f"compression.algorithm={algorithm} "
                                f"compression.density={d} distributed.world_size={P} train.epochs=1")
    assert lines == expected
    names = [shlex.split(line)[7] for line in lines]
    assert len(set(names)) == len(names) == 10


def test_sweep_defaults_cover_all_algorithms():
    """Every registered algorithm at the default rank counts (2, 4) and densities (0.01, 0.02), in the registry's
    order; one whose volume ignores the density (uses_density false: dense, PowerSGD, ...) once per P."""
    from sparse_asr.compression import COMPRESSORS

    lines = ok(["scripts/sweep.sh", "-c", CONFIG, "--dry-run"])
    expected = []
    for P in (2, 4):
        for name, cls in COMPRESSORS.items():
            if cls.uses_density:
                expected += [f"name=cluster-{name}-d{d}-p{P}" for d in ("0.01", "0.02")]
            else:
                expected.append(f"name=cluster-{name}-p{P}")
    assert [shlex.split(line)[7] for line in lines] == expected
    assert {"name=cluster-powersgd-p2", "name=cluster-dense-p4"} <= set(expected)  # once per P


def test_sweep_pbs_and_slurm_dry_runs_print_submit_commands():
    lines = ok(["scripts/sweep.sh", "-c", CONFIG, "--scheduler", "pbs", "-A", "PRJ", "-t", "02:00:00", "--dry-run",
                "--algorithms", "dense topka", "--densities", "0.02", "--ranks", "2 8"])
    assert lines == [
        f"scripts/polaris/submit.sh -c {CONFIG} -N 1 --ppn 2 -t 02:00:00 -A PRJ name=cluster-dense-p2 "
        f"compression.algorithm=dense",
        f"scripts/polaris/submit.sh -c {CONFIG} -N 1 --ppn 2 -t 02:00:00 -A PRJ name=cluster-topka-d0.02-p2 "
        f"compression.algorithm=topka compression.density=0.02",
        f"scripts/polaris/submit.sh -c {CONFIG} -N 2 --ppn 4 -t 02:00:00 -A PRJ name=cluster-dense-p8 "
        f"compression.algorithm=dense",
        f"scripts/polaris/submit.sh -c {CONFIG} -N 2 --ppn 4 -t 02:00:00 -A PRJ name=cluster-topka-d0.02-p8 "
        f"compression.algorithm=topka compression.density=0.02",
    ]
    lines = ok(["scripts/sweep.sh", "-c", CONFIG, "--scheduler", "slurm", "-q", "gpu", "--gpus-per-node", "8",
                "--dry-run", "--algorithms", "oktopk", "--densities", "0.01", "--ranks", "16", "--prefix", "big"])
    assert lines == [f"scripts/slurm/submit.sh -c {CONFIG} -N 2 --ppn 8 -p gpu name=big-oktopk-d0.01-p16 "
                     f"compression.algorithm=oktopk compression.density=0.01"]


def test_sweep_submits_one_job_per_run(tmp_path):
    env, log = fake_command(tmp_path, "qsub")
    args = ["scripts/sweep.sh", "-c", CONFIG, "--scheduler", "pbs", "-A", "PRJ", "--algorithms", "dense oktopk",
            "--densities", "0.01 0.02", "--ranks", "4 8", f"out_dir={tmp_path / 'runs'}"]
    lines = ok(args, {**env, **LEFTOVERS, "DRY_RUN": "1"}, clean=False)
    calls = recorded_calls(log)
    assert len(calls) == 6 and lines.count("123.fake") == 6
    names = sorted(call[call.index("-N") + 1] for call in calls)
    assert names == sorted(f"cluster-{a}-p{P}" for a in ("dense", "oktopk-d0.01", "oktopk-d0.02") for P in (4, 8))
    assert all(f"select={1 if 'p4' in c[c.index('-N') + 1] else 2}:system=polaris" in c for c in calls)
    # A second sweep with the same names would append to those runs' curves: refused before submitting anything.
    (tmp_path / "runs" / "cluster-oktopk-d0.02-p8").mkdir(parents=True)
    proc = run(args, env)
    assert proc.returncode == 2 and "cluster-oktopk-d0.02-p8 exists already: choose another --prefix" in proc.stderr
    assert len(recorded_calls(log)) == 6
    assert run(args + ["--dry-run"], env).returncode == 0  # a dry run only notes it


# ------------------------------------------------------------------------------------------------ refusals
BAD = [
    (["scripts/polaris/submit.sh", "-c", "configs/nope.yaml", "-A", "P"], "config file 'configs/nope.yaml' not found"),
    (["scripts/polaris/submit.sh", "-A", "P"], "no config given"),
    (["scripts/polaris/submit.sh", "-c", CONFIG], "no project account"),
    (["scripts/polaris/submit.sh", "-c", CONFIG, "-A", "P", "-N", "0"],
     "nodes (-N) must be a positive integer, got '0'"),
    (["scripts/polaris/submit.sh", "-c", CONFIG, "-A", "P", "-N", "two"], "must be a positive integer, got 'two'"),
    (["scripts/polaris/submit.sh", "-c", CONFIG, "-A", "P", "--ppn", "8"], "at most 4"),
    (["scripts/polaris/submit.sh", "-c", CONFIG, "-A", "P", "-t", "1h"], "walltime must be HH:MM:SS, got '1h'"),
    (["scripts/polaris/submit.sh", "-c", CONFIG, "-A", "P", "epochs"], "bad override 'epochs'"),
    (["scripts/polaris/submit.sh", "-c", CONFIG, "-A", "P", "a.b=1,2"], "bad override 'a.b=1,2'"),
    (["scripts/polaris/submit.sh", "-c", CONFIG, "-A", "P", "--nodes"], "option --nodes needs a value"),
    (["scripts/polaris/submit.sh", "-c", CONFIG, "-A", "P", "--frobnicate"], "unknown option '--frobnicate'"),
    (["scripts/slurm/submit.sh", "-c", CONFIG, "-N", "-3"], "option -N needs a value"),
    (["scripts/slurm/submit.sh", "-c", CONFIG, "-t", "25:00"], "walltime must be HH:MM:SS"),
    (["scripts/slurm/submit.sh", "-c", CONFIG, "--cpus-per-task", "0"], "must be a positive integer"),
    (["scripts/slurm/submit.sh", "-c", CONFIG, "-p", "gpu;rm"], "bad partition name"),
    (["scripts/slurm/submit.sh", "-c", CONFIG, "=1"], "bad override '=1'"),
    (["scripts/slurm/train.sbatch"], "not inside a Slurm job: set NODES"),
    (["scripts/polaris/train.pbs"], "not inside a PBS job: set NODES"),
    (["scripts/sweep.sh", "-c", CONFIG, "--scheduler", "lsf"], "unknown scheduler 'lsf'"),
    (["scripts/sweep.sh", "-c", CONFIG, "--algorithms", "dense topk"], "unknown algorithm 'topk'"),
    (["scripts/sweep.sh", "-c", CONFIG, "--densities", "0.02 1.5"], "density must be a number in (0, 1], got '1.5'"),
    (["scripts/sweep.sh", "-c", CONFIG, "--densities", "0"], "got '0'"),
    (["scripts/sweep.sh", "-c", CONFIG, "--densities", "2%"], "got '2%'"),
    (["scripts/sweep.sh", "-c", CONFIG, "--ranks", "4 x"], "rank count must be a positive integer, got 'x'"),
    (["scripts/sweep.sh", "-c", CONFIG, "--scheduler", "pbs", "-A", "P", "--ranks", "6"], "does not fill whole nodes"),
    (["scripts/sweep.sh", "-c", CONFIG, "--scheduler", "pbs"], "needs --account"),
    (["scripts/sweep.sh", "-c", CONFIG, "-A", "P"], "are for --scheduler pbs or slurm"),
    (["scripts/sweep.sh", "-c", CONFIG, "compression.density=0.1"], "is set by the sweep itself"),
    (["scripts/sweep.sh", "-c", CONFIG, "--scheduler", "slurm", "-t", "1:2:3:4"], "walltime must be HH:MM:SS"),
    (["scripts/sweep.sh"], "no config given"),
]


@pytest.mark.parametrize("args, message", BAD, ids=[" ".join(a[1:]) or a[0] for a, _ in BAD])
def test_bad_arguments_are_refused(args, message, tmp_path):
    env, log = fake_command(tmp_path, "qsub")
    env.update(fake_command(tmp_path, "sbatch")[0])
    proc = run(args + ([] if "train." in args[0] else ["--dry-run"]), env)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert message in proc.stderr, proc.stderr
    assert proc.stderr.startswith(Path(args[0]).name + ": error: ")
    assert proc.stdout == "" and not log.exists()  # nothing printed as if it would run, nothing submitted


@pytest.mark.mpi
def test_sweep_local_run_really_trains(an4_manifests, tmp_path):
    """The sweep's local command line is one train.py accepts: a 1-rank smoke run, one epoch."""
    data = [f"data.{s}_manifest={an4_manifests / f'an4_{s}.csv'}" for s in ("train", "dev", "test")]
    proc = run(["scripts/sweep.sh", "-c", SMOKE, "--algorithms", "topka", "--densities", "0.05", "--ranks", "1",
                f"out_dir={tmp_path}", "train.epochs=1", *data], {"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = tmp_path / "smoke-topka-d0.05-p1"
    saved = (run_dir / "config.yaml").read_text()
    assert "algorithm: topka" in saved and "density: 0.05" in saved and "world_size: 1" in saved
    assert list(run_dir.glob("events.out.tfevents.*"))


# ------------------------------------------------------------------------------------------------ config checks
# What train.py would refuse after the queue is refused before anything is printed or submitted (dry runs
# included): train.py's own config loader runs for the job's rank count (training/check_config.py).
REFUSED = [
    (["scripts/polaris/submit.sh", "-c", CONFIG, "-A", "P", "-N", "2", "trian.epochs=3"], "unknown key 'trian'", True),
    (["scripts/polaris/submit.sh", "-c", CONFIG, "-A", "P", "compression.density=5"],
     "compression.density must be in (0, 1], got 5", False),
    (["scripts/polaris/submit.sh", "-c", "configs/lstman4_dense.yaml", "-A", "P", "-N", "3"],
     "train.global_batch_size=64 is not divisible by the 12 ranks", False),
    (["scripts/slurm/submit.sh", "-c", CONFIG, "-N", "2", "trian.epochs=3"], "unknown key 'trian'", False),
    (["scripts/slurm/submit.sh", "-c", SMOKE, "--ppn", "3"],
     "train.global_batch_size=4 is not divisible by the 3 ranks", True),
    (["scripts/sweep.sh", "-c", CONFIG, "trian.epochs=3"], "unknown key 'trian'", True),
    (["scripts/sweep.sh", "-c", SMOKE, "--ranks", "2 3", "--algorithms", "dense"],
     "not divisible by the 3 ranks", False),
    (["scripts/sweep.sh", "-c", CONFIG, "--scheduler", "pbs", "-A", "P", "--ranks", "4 8", "optim.lr=-1"],
     "optim.lr must be in (0, 10], got -1.0", False),
    (["scripts/sweep.sh", "-c", "configs/lstman4_dense.yaml", "--scheduler", "slurm", "--ranks", "12"],
     "not divisible by the 12 ranks", True),
]


@pytest.mark.parametrize("args, message, dry_run", REFUSED,
                         ids=[" ".join(a[:1] + a[2:]) + (" --dry-run" if d else "") for a, _, d in REFUSED])
def test_configs_train_py_would_refuse_are_refused_before_the_queue(args, message, dry_run, tmp_path):
    env, log = fake_command(tmp_path, "qsub")
    env.update(fake_command(tmp_path, "sbatch")[0])
    out_dir = [f"out_dir={tmp_path / 'runs'}"] if "sweep" in args[0] else []
    proc = run(args + out_dir + (["--dry-run"] if dry_run else []), env)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.startswith(Path(args[0]).name + ": error: the config would be refused by train.py:\n")
    assert message in proc.stderr, proc.stderr
    assert proc.stdout == "" and not log.exists()  # nothing printed as if it would run, nothing submitted


def test_config_check_sees_the_job_overrides_and_can_be_skipped(tmp_path):
    # lstman4_dense.yaml says world_size 32, but the job's distributed.world_size=8 comes first and wins.
    assert command_lines(ok(["scripts/polaris/submit.sh", "-c", "configs/lstman4_dense.yaml", "-A", "P", "-N", "2",
                             "--dry-run"]))[1].endswith("distributed.world_size=8 distributed.device=cuda")
    ok(["scripts/slurm/submit.sh", "-c", CONFIG, "--dry-run", "--skip-config-check", "trian.epochs=3"])
    broken = tmp_path / "venv" / "bin" / "python"  # a venv whose python cannot run the check
    broken.parent.mkdir(parents=True)
    broken.write_text("#!/bin/bash\necho 'ModuleNotFoundError: no module named torch' >&2\nexit 1\n")
    broken.chmod(0o755)
    proc = run(["scripts/slurm/submit.sh", "-c", CONFIG, "--venv", str(tmp_path / "venv"), "--dry-run"])
    assert proc.returncode == 2 and proc.stdout == ""
    assert f"could not run the config check ({broken} -m sparse_asr.training.check_config, exit 1)" in proc.stderr
    assert "no module named torch" in proc.stderr and "--skip-config-check" in proc.stderr


@pytest.mark.parametrize("args", [
    ["scripts/polaris/submit.sh", "-c", CONFIG, "-A", "P", "-N", "99999999999999999999"],
    ["scripts/slurm/submit.sh", "-c", CONFIG, "-N", "99999999999999999999"],
    ["scripts/slurm/submit.sh", "-c", CONFIG, "--ppn", "4611686018427387904"],  # 2^62: x 4 nodes would wrap
    ["scripts/sweep.sh", "-c", CONFIG, "--ranks", "4 99999999999999999999"],
])
def test_huge_counts_are_refused_not_wrapped(args):
    proc = run(args + ["--dry-run"])
    assert proc.returncode == 2 and "is too large" in proc.stderr and "at most 999999999" in proc.stderr, proc.stderr
    assert proc.stdout == ""
