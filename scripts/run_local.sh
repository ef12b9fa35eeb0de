#!/usr/bin/env bash
# The main job on one machine: set up the environment, prepare AN4, train with P MPI ranks.
#
#   bash scripts/run_local.sh [-n P] [-c CONFIG] [--resume RUN_DIR|auto] [--dry-run] [key.sub=value ...]
#   bash scripts/run_local.sh                                   # configs/an4_cpu.yaml, 1 process
#   bash scripts/run_local.sh -n 2 compression.algorithm=oktopk compression.density=0.02
#   bash scripts/run_local.sh -n 2 --resume runs/NAME train.epochs=40   # continue a run with its own config
#   bash scripts/run_local.sh -n 2 --resume auto name=NAME      # continue runs/NAME if it has a checkpoint
#
# Dev WER is printed after every evaluation; the run (config.yaml, TensorBoard events, metrics.jsonl,
# checkpoints/) lands in runs/<name>/ -- watch it with: .venv/bin/tensorboard --logdir runs
# --dry-run prints the training command instead of setting up and running it.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/args.sh  # shell_join

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; }
NPROCS=1
CONFIG=configs/an4_cpu.yaml
CONFIG_GIVEN=""
RESUME=""
DRY_RUN=""
rest=()  # the long options are taken out here; getopts reads the short ones
while (($#)); do
    case "$1" in
        --resume)
            if (($# < 2)) || [ -z "$2" ]; then
                echo "run_local.sh: --resume needs a run directory, a checkpoint directory or 'auto'" >&2; exit 2
            fi
            RESUME=$2; shift 2 ;;
        --resume=*) RESUME=${1#--resume=}; shift ;;
        --dry-run) DRY_RUN=1; shift ;;
        *) rest+=("$1"); shift ;;
    esac
done
set -- "${rest[@]+"${rest[@]}"}"
while getopts "n:c:h" opt; do
    case "$opt" in
        n) NPROCS=$OPTARG ;;
        c) CONFIG=$OPTARG; CONFIG_GIVEN=1 ;;
        h) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
if ! [[ "$NPROCS" =~ ^[1-9][0-9]*$ ]]; then
    echo "run_local.sh: -n must be a positive integer, got '$NPROCS'" >&2; exit 2
fi
# Resuming a run directory uses the run's own saved config unless -c names one (then it must agree).
TRAIN_ARGS=()
if [ -z "$RESUME" ] || [ "$RESUME" = auto ] || [ -n "$CONFIG_GIVEN" ]; then
    if [ ! -f "$CONFIG" ]; then
        echo "run_local.sh: config file '$CONFIG' does not exist" >&2; exit 2
    fi
    TRAIN_ARGS+=(--config "$CONFIG")
fi
if [ -n "$RESUME" ]; then
    if [ "$RESUME" != auto ] && [ ! -e "$RESUME" ]; then
        echo "run_local.sh: --resume: '$RESUME' does not exist (give a run directory, e.g. runs/NAME)" >&2; exit 2
    fi
    TRAIN_ARGS+=(--resume "$RESUME")
fi
for override in "$@"; do
    if ! [[ "$override" =~ ^[A-Za-z_][A-Za-z0-9_.]*=.*$ ]]; then
        echo "run_local.sh: '$override' is not a key.sub=value override" >&2; exit 2
    fi
done

if [ -n "$DRY_RUN" ]; then
    shell_join .venv/bin/mpiexec -n "$NPROCS" .venv/bin/python train.py "${TRAIN_ARGS[@]}" "$@"
    exit 0
fi

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
echo "run_local.sh: $NPROCS rank(s), $OMP_NUM_THREADS thread(s) each, ${TRAIN_ARGS[*]} $*"
train_log=$(mktemp)
trap 'rm -f "$train_log"' EXIT
.venv/bin/mpiexec -n "$NPROCS" .venv/bin/python train.py "${TRAIN_ARGS[@]}" "$@" | tee "$train_log"

# The end: the test set decoded greedily (as the run scored it) and by the beam with the lexicon and n-gram LM of
# the training transcripts, its settings tuned on the dev set first (printed; lm/<train>-3gram/tuned.json).
run_dir=$(sed -n 's/^done: \([^ ]*\).*/\1/p' "$train_log" | tail -n 1)
if [ -z "$run_dir" ] || [ ! -d "$run_dir/checkpoints" ]; then
    echo "run_local.sh: no finished run directory in the training output; skipping the beam decoding" >&2; exit 0
fi
read -r dev test < <(.venv/bin/python -c 'import sys, yaml; d = yaml.safe_load(open(sys.argv[1]))["data"]
print(d["dev_manifest"] or "-", d["test_manifest"] or "-")' "$run_dir/config.yaml")
if [ "${dev:--}" = - ] || [ "${test:--}" = - ]; then
    echo "run_local.sh: the run has no dev or test set; skipping the beam decoding" >&2; exit 0
fi
started=$SECONDS
.venv/bin/mpiexec -n "$NPROCS" .venv/bin/python evaluate.py "$run_dir" --manifest "$test" --decoder beam \
    --tune-on "$dev" --worst 0 | tee "$train_log"
echo "run_local.sh: test WER of $run_dir ($test), the last checkpoint; the beam took $((SECONDS - started)) s more:"
awk '/^decoder: /{name=substr($0, 10)} /^  wer /{printf "  %-8s %s\n", $2, name}' "$train_log"
