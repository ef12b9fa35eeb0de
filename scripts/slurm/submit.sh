#!/bin/bash
# Check the arguments, then submit scripts/slurm/train.sbatch with sbatch (or, with --dry-run, print
# the sbatch command and the exact srun line the job would run, and submit nothing).
set -euo pipefail
REPO=$(realpath "$(dirname "$0")/../..")
source "$REPO/scripts/lib/args.sh"

usage() {
    cat <<'EOF'
usage: scripts/slurm/submit.sh -c CONFIG [options] [key=value ...]
  -c, --config FILE       experiment config (required), e.g. configs/lstman4_oktopk.yaml
  -N, --nodes N           nodes (default 1); ranks = N x ppn
      --ppn R             ranks (one GPU each) per node (default 4)
  -t, --walltime T        HH:MM:SS (default 01:00:00)
  -p, --partition P       partition (default: the site's default)
  -A, --account NAME      account to charge (default: the site's default)
      --cpus-per-task C   cores per rank (default: the site's default)
      --cuda-aware-mpi    pass GPU buffers to MPI (the site MPI must support it)
      --venv DIR          virtual environment the job activates (default REPO/.venv)
      --modules "M ..."   modules the job loads first (default none)
      --srun-mpi PLUGIN   srun --mpi= plugin, e.g. pmix (default: srun's default)
      --dry-run           print the sbatch command and the job's srun line; submit nothing
      --skip-config-check do not run train.py's config checks for the job's rank count first
                          (done by default, dry runs included, with the venv's or .venv's python)
  key=value               config overrides passed to train.py (no spaces, quotes or commas)
EOF
}

config="" nodes=1 ppn=4 walltime=01:00:00 partition="" account="" cpus_per_task="" cuda_aware=0 dry_run=0
venv=$REPO/.venv modules="" srun_mpi="" check=1
overrides=()
while (($#)); do
    case "$1" in
        -c | --config) require_value "$@"; config=$2; shift 2 ;;
        -N | --nodes) require_value "$@"; nodes=$2; shift 2 ;;
        --ppn) require_value "$@"; ppn=$2; shift 2 ;;
        -t | --walltime) require_value "$@"; walltime=$2; shift 2 ;;
        -p | --partition) require_value "$@"; partition=$2; shift 2 ;;
        -A | --account) require_value "$@"; account=$2; shift 2 ;;
        --cpus-per-task) require_value "$@"; cpus_per_task=$2; shift 2 ;;
        --cuda-aware-mpi) cuda_aware=1; shift ;;
        --venv) require_value "$@"; venv=$2; shift 2 ;;
        --modules) require_value "$@"; modules=$2; shift 2 ;;
        --srun-mpi) require_value "$@"; srun_mpi=$2; shift 2 ;;
        --dry-run) dry_run=1; shift ;;
        --skip-config-check) check=0; shift ;;
        -h | --help) usage; exit 0 ;;
        -*) die "unknown option '$1' (see --help)" ;;
        *) require_override "$1"; overrides+=("$1"); shift ;;
    esac
done

config=$(resolve_config "$config" "$REPO")
require_positive_int "nodes (-N)" "$nodes"
require_positive_int "ranks per node (--ppn)" "$ppn"
require_walltime "$walltime"
[[ -z "$cpus_per_task" ]] || require_positive_int "--cpus-per-task" "$cpus_per_task"
[[ -z "$partition" || "$partition" =~ ^[A-Za-z0-9_.-]+$ ]] || die "bad partition name '$partition'"
[[ -z "$account" || "$account" =~ ^[A-Za-z0-9_.-]+$ ]] || die "bad account name '$account'"
[[ -z "$srun_mpi" || "$srun_mpi" =~ ^[a-z0-9_]+$ ]] || die "bad --srun-mpi '$srun_mpi'"
[[ "$modules" =~ ^[A-Za-z0-9_./@+\ -]*$ ]] || die "bad --modules '$modules' (space-separated module names)"
venv=$(realpath -m "$venv")
[[ "$REPO$venv" =~ ^[^[:space:],\'\"]+$ ]] || die "repository and venv paths must not contain spaces, quotes or commas"

# The job's own overrides (train.sbatch) come first, as on its command line: the check sees what train.py will.
if ((check)); then
    job_overrides=("distributed.world_size=$((nodes * ppn))" distributed.device=cuda)
    if ((cuda_aware)); then job_overrides+=(distributed.cuda_aware_mpi=true); fi
    check_config "$(project_python "$venv" "$REPO")" "$REPO" "$config" "$((nodes * ppn))" "${job_overrides[@]}" "${overrides[@]}"
fi

job_name=$(name_override "${overrides[@]}")
job_name=${job_name:-$(basename "${config%.*}")}
job_name=${job_name//[^A-Za-z0-9_.-]/-}

sbatch_command=(sbatch --job-name="$job_name" --nodes="$nodes" --ntasks-per-node="$ppn" --gpus-per-task=1
    --time="$walltime")
[[ -z "$partition" ]] || sbatch_command+=(--partition="$partition")
[[ -z "$account" ]] || sbatch_command+=(--account="$account")
[[ -z "$cpus_per_task" ]] || sbatch_command+=(--cpus-per-task="$cpus_per_task")
# --export=ALL (sbatch's default) keeps the login environment the site's modules need; every variable
# the job script reads is set explicitly, so nothing leaks in from this shell.
job_vars="REPO_DIR=$REPO,VENV=$venv,MODULES=$modules,SRUN_MPI=$srun_mpi,CUDA_AWARE_MPI=$cuda_aware,DRY_RUN=0"
sbatch_command+=(--chdir="$REPO" --output="$REPO/runs/slurm/%x-%j.out" --export="ALL,$job_vars"
    "$REPO/scripts/slurm/train.sbatch" "$config" "${overrides[@]}")

if ((dry_run)); then
    shell_join "${sbatch_command[@]}"
    echo "# the job would run:"
    # The job script itself prints its command, so both layers show the same line.
    env -u SLURM_JOB_ID DRY_RUN=1 NODES="$nodes" RANKS_PER_NODE="$ppn" CPUS_PER_TASK="$cpus_per_task" \
        REPO_DIR="$REPO" VENV="$venv" MODULES="$modules" SRUN_MPI="$srun_mpi" CUDA_AWARE_MPI="$cuda_aware" \
        bash "$REPO/scripts/slurm/train.sbatch" "$config" "${overrides[@]}"
    exit 0
fi
command -v sbatch >/dev/null || die "sbatch not found: run this on a Slurm login node (or use --dry-run)"
mkdir -p "$REPO/runs/slurm" # sbatch does not create the --output directory
"${sbatch_command[@]}"
