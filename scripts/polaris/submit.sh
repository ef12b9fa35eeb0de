#!/bin/bash
# Check the arguments, then submit scripts/polaris/train.pbs with qsub (or, with --dry-run, print
# the qsub command and the exact mpiexec line the job would run, and submit nothing).
set -euo pipefail
REPO=$(realpath "$(dirname "$0")/../..")
source "$REPO/scripts/lib/args.sh"

usage() {
    cat <<'EOF'
usage: scripts/polaris/submit.sh -c CONFIG -A ACCOUNT [options] [key=value ...]
  -c, --config FILE      experiment config (required), e.g. configs/lstman4_oktopk.yaml
  -A, --account NAME     project to charge (required on Polaris)
  -N, --nodes N          nodes (default 1); ranks = N x ppn
      --ppn R            ranks (GPUs) per node, 1-4 (default 4)
  -t, --walltime T       HH:MM:SS (default 01:00:00)
  -q, --queue Q          default: debug (1-2 nodes), debug-scaling (3-10), prod (more)
      --filesystems FS   -l filesystems= value (default home:eagle)
      --cuda-aware-mpi   hand GPU buffers to Cray MPICH (MPICH_GPU_SUPPORT_ENABLED=1)
      --venv DIR         virtual environment the job activates (default REPO/.venv-polaris, see setup_env.sh)
      --dry-run          print the qsub command and the job's mpiexec line; submit nothing
      --skip-config-check  do not run train.py's config checks for the job's rank count first
                         (done by default, dry runs included, with the venv's or .venv's python)
  key=value              config overrides passed to train.py (no spaces, quotes or commas)
EOF
}

config="" account="" nodes=1 ppn=4 walltime=01:00:00 queue="" filesystems=home:eagle cuda_aware=0 dry_run=0
check=1
venv=$REPO/.venv-polaris
overrides=()
while (($#)); do
    case "$1" in
        -c | --config) require_value "$@"; config=$2; shift 2 ;;
        -A | --account) require_value "$@"; account=$2; shift 2 ;;
        -N | --nodes) require_value "$@"; nodes=$2; shift 2 ;;
        --ppn) require_value "$@"; ppn=$2; shift 2 ;;
        -t | --walltime) require_value "$@"; walltime=$2; shift 2 ;;
        -q | --queue) require_value "$@"; queue=$2; shift 2 ;;
        --filesystems) require_value "$@"; filesystems=$2; shift 2 ;;
        --cuda-aware-mpi) cuda_aware=1; shift ;;
        --venv) require_value "$@"; venv=$2; shift 2 ;;
        --dry-run) dry_run=1; shift ;;
        --skip-config-check) check=0; shift ;;
        -h | --help) usage; exit 0 ;;
        -*) die "unknown option '$1' (see --help)" ;;
        *) require_override "$1"; overrides+=("$1"); shift ;;
    esac
done

config=$(resolve_config "$config" "$REPO")
[[ -n "$account" ]] || die "no project account: pass -A ACCOUNT (Polaris charges every job to a project)"
[[ "$account" =~ ^[A-Za-z0-9_.-]+$ ]] || die "bad account name '$account'"
require_positive_int "nodes (-N)" "$nodes"
require_positive_int "ranks per node (--ppn)" "$ppn"
((ppn <= 4)) || die "ranks per node (--ppn) must be at most 4 (Polaris nodes have 4 GPUs), got $ppn"
require_walltime "$walltime"
if [[ -z "$queue" ]]; then
    if ((nodes <= 2)); then queue=debug; elif ((nodes <= 10)); then queue=debug-scaling; else queue=prod; fi
fi
[[ "$queue" =~ ^[A-Za-z0-9_.@-]+$ ]] || die "bad queue name '$queue'"
[[ "$filesystems" =~ ^[a-z0-9_]+(:[a-z0-9_]+)*$ ]] || die "bad --filesystems '$filesystems' (e.g. home:eagle)"
venv=$(realpath -m "$venv")
[[ "$REPO$venv" =~ ^[^[:space:],\'\"]+$ ]] || die "repository and venv paths must not contain spaces, quotes or commas (qsub -v)"

# The job's own overrides (train.pbs) come first, as on its command line: the check sees what train.py will.
if ((check)); then
    job_overrides=("distributed.world_size=$((nodes * ppn))" distributed.device=cuda)
    if ((cuda_aware)); then job_overrides+=(distributed.cuda_aware_mpi=true); fi
    check_config "$(project_python "$venv" "$REPO")" "$REPO" "$config" "$((nodes * ppn))" "${job_overrides[@]}" "${overrides[@]}"
fi

# Job name: the run's name= override, else the config's file name; PBS wants a letter first.
job_name=$(name_override "${overrides[@]}")
job_name=${job_name:-$(basename "${config%.*}")}
job_name=${job_name//[^A-Za-z0-9_.-]/-}
[[ "$job_name" =~ ^[A-Za-z] ]] || job_name="run-$job_name"
job_name=${job_name:0:200}

# Every variable the job script reads is set here (PBS passes no other environment without -V).
job_vars="REPO_DIR=$REPO,CONFIG=$config,RANKS_PER_NODE=$ppn,VENV=$venv,CUDA_AWARE_MPI=$cuda_aware,OVERRIDES=${overrides[*]}"
qsub_command=(qsub -A "$account" -q "$queue" -N "$job_name"
    -l "select=$nodes:system=polaris" -l place=scatter -l "walltime=$walltime" -l "filesystems=$filesystems"
    -v "$job_vars" "$REPO/scripts/polaris/train.pbs")

if ((dry_run)); then
    shell_join "${qsub_command[@]}"
    echo "# the job would run:"
    # The job script itself prints its command, so both layers show the same line.
    env -u PBS_NODEFILE -u PBS_O_WORKDIR DRY_RUN=1 NODES="$nodes" RANKS_PER_NODE="$ppn" \
        REPO_DIR="$REPO" CONFIG="$config" VENV="$venv" CUDA_AWARE_MPI="$cuda_aware" OVERRIDES="${overrides[*]}" \
        bash "$REPO/scripts/polaris/train.pbs"
    exit 0
fi
command -v qsub >/dev/null || die "qsub not found: run this on a Polaris login node (or use --dry-run)"
"${qsub_command[@]}"
