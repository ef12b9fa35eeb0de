#!/usr/bin/env bash
# The main job on one machine: set up the environment, prepare AN4, train with P MPI ranks.
#
#   bash scripts/run_local.sh [-n P] [-c CONFIG] [key.sub=value ...]
#   bash scripts/run_local.sh                                   # configs/an4_cpu.yaml, 1 process
#   bash scripts/run_local.sh -n 2 compression.algorithm=oktopk compression.density=0.02
#
# Dev WER is printed after every evaluation; the run (config.yaml, TensorBoard events, metrics.jsonl,
# checkpoints) lands in runs/<name>/ -- watch it with: .venv/bin/tensorboard --logdir runs
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; }
NPROCS=1
CONFIG=configs/an4_cpu.yaml
while getopts "n:c:h" opt; do
    case "$opt" in
        n) NPROCS=$OPTARG ;;
        c) CONFIG=$OPTARG ;;
        h) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
if ! [[ "$NPROCS" =~ ^[1-9][0-9]*$ ]]; then
    echo "run_local.sh: -n must be a positive integer, got '$NPROCS'" >&2; exit 2
fi
if [ ! -f "$CONFIG" ]; then
    echo "run_local.sh: config file '$CONFIG' does not exist" >&2; exit 2
fi
for override in "$@"; do
    if ! [[ "$override" =~ ^[A-Za-z_][A-Za-z0-9_.]*=.*$ ]]; then
        echo "run_local.sh: '$override' is not a key.sub=value override" >&2; exit 2
    fi
done

bash scripts/setup.sh

# The project's copy of CMU's archive when this machine has it, else CMU's download (data.an4's default).
ARCHIVE=../shared/data/an4_sphere.tar.gz
SOURCE_ARGS=()
if [ -f "$ARCHIVE" ]; then SOURCE_ARGS=(--source "$ARCHIVE"); fi
.venv/bin/python -m sparse_asr.data.an4 "${SOURCE_ARGS[@]}" --data-dir datasets --manifest-dir manifests

# CPU threads: the cores shared among the ranks unless the caller chose (train.threads overrides).
if [ -z "${OMP_NUM_THREADS:-}" ]; then
    cores=$(nproc)
    OMP_NUM_THREADS=$(( cores / NPROCS > 0 ? cores / NPROCS : 1 ))
    export OMP_NUM_THREADS
fi
echo "run_local.sh: $NPROCS rank(s), $OMP_NUM_THREADS thread(s) each, config $CONFIG $*"
exec .venv/bin/mpiexec -n "$NPROCS" .venv/bin/python train.py --config "$CONFIG" "$@"
