#!/usr/bin/env bash
# The GPU checks (accuracy parity, bf16, speed targets) on a GPU node, in one command: one GPU, no network, <= 8 min.
#
#   bash bench/gpu_suite.sh [--out DIR] [--dry-run] [--trainings-only | --study [--seed S] [--no-speed]]
#
#   env            nvidia-smi, torch / CUDA / cuDNN versions, GPU name, MPI library    -> env.json, nvidia-smi.txt
#   selection      bench/selection.py on CUDA: exact top-k methods vs threshold reuse  -> selection.md
#   step_P1        bench/step_time.py, lstman4, global batch 64, dense topka oktopk    -> step_time_P1.{md,json}
#   step_P1_bf16   the same with train.precision=bf16 (dense, oktopk)                  -> step_time_P1_bf16.{md,json}
#   step_P2        the same on 2 ranks sharing the GPU                                 -> step_time_P2.{md,json}
#   train          four concurrent lstman4 trainings on AN4 (configs/lstman4_recipe.yaml, the
#                  GPU shared): dense on 1 rank in fp32 and in bf16, Ok-Topk on 2 and
#                  on 4 ranks; each stops at $EPOCHS epochs or when the suite's time is
#                  up (train.max_minutes), then is dev- and test-scored                -> runs/, train_*.log
#   summary        bench/gpu_report.py: one markdown report from the raw outputs       -> summary.md
#
# Everything lands in DIR (default bench/results/gpu_suite-<time>/), each step's output in its own
# files and its status in steps.tsv. Each step has its own time limit; the trainings get what is left
# of SUITE_SECONDS (default 470: under 8 minutes in all). A failed step is reported and the suite goes
# on; the exit status is 1 if any step failed. Settable in the environment: STEPS (measured steps per
# algorithm, default 64), EPOCHS (default 60: the trainings' schedule, whose first 5% is the dense
# warm-up) and SUITE_SECONDS. The trainings' checkpoints are deleted at the end unless KEEP_CHECKPOINTS=1.
# --trainings-only: env, train and summary only, the trainings getting all of SUITE_SECONDS (enough for all
# four to finish the same EPOCHS, so that test WERs compare at the same epochs).
# --study [--seed S] [--no-speed]: the GPU throughput study in one call (SUITE_SECONDS default 530):
#   env
#   rate           epochs per minute of dense lstman4 (recipe, 1 rank) alone on the GPU, before and after
#                  the fast settings, RATE_SECONDS (default 45) each: "before" = the recipe as it is
#                  (features recomputed by 2 loader workers, dev scored and a checkpoint every epoch),
#                  "after" = features cached on the GPU (data.cache_features), dev every 2 epochs, checkpoints
#                  only at the best dev WER and the end                                  -> rate_runs/, rate.md
#   selection, step_P1, step_P1_bf16, step_P2: as above with STEPS default 24 and one density (the GPU
#                  speed targets); --no-speed leaves them out and gives their time to the trainings
#   train          dense on 1 rank, Ok-Topk on 1 rank (the exact global top-k), Ok-Topk on 4 ranks and the
#                  remedy (Ok-Topk, compression.options.complete_values=true) on 4 ranks, concurrently, at
#                  the same seed and schedule (EPOCHS default 161, the paper's; each stops when the time is
#                  up), with the "after" settings; each run's metrics copied flat to metrics_<run>.jsonl and
#                  the dev-WER / loss curves of all four in one plot (curves_vs_step.png) -> summary.md
# --dry-run: every step with tiny sizes on the CPU (lstman4_tiny, 2 steps, 16 utterances, 1 epoch) to
# check the commands here rather than on the GPU. On a CPU without bfloat16 kernels (no AVX-512) the bf16
# step and training are recorded as skipped, not run (train.py and step_time.py would refuse them).
# Runs in a checkout (its .venv) or in an offline bundle after `source bootstrap.sh` (python3 and
# mpiexec from PATH); PYTHON and MPIEXEC override. Reads manifests/an4_{train,dev,test}.csv.
set -uo pipefail  # no -e: a failing step must not end the suite
cd "$(dirname "$0")/.."

usage() { sed -n '2,43p' "$0" | sed 's/^# \{0,1\}//'; }
DRY_RUN=0
TRAININGS_ONLY=0
STUDY=0
SPEED=1
SEED=1
OUT=""
while (($#)); do
    case "$1" in
        --dry-run) DRY_RUN=1; shift ;;
        --trainings-only) TRAININGS_ONLY=1; shift ;;
        --study) STUDY=1; shift ;;
        --no-speed) SPEED=0; shift ;;
        --seed) [[ $# -ge 2 && "$2" =~ ^[0-9]+$ ]] || { echo "gpu_suite.sh: error: --seed needs an integer" >&2; exit 2; }
                SEED=$2; shift 2 ;;
        --out) [[ $# -ge 2 && -n "$2" ]] || { echo "gpu_suite.sh: error: --out needs a directory" >&2; exit 2; }
               OUT=$2; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "gpu_suite.sh: error: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
done
source scripts/lib/tools.sh  # PYTHON, MPIEXEC
for manifest in manifests/an4_train.csv manifests/an4_dev.csv manifests/an4_test.csv; do
    [[ -f "$manifest" ]] || { echo "gpu_suite.sh: error: $manifest is missing (prepare AN4, see README.md)" >&2; exit 2; }
done
((SPEED)) || ((STUDY)) || { echo "gpu_suite.sh: error: --no-speed goes with --study" >&2; exit 2; }
((SPEED)) || TRAININGS_ONLY=1
STEPS=${STEPS:-$( ((STUDY)) && echo 24 || echo 64 )}
EPOCHS=${EPOCHS:-$( ((STUDY)) && echo 161 || echo 60 )}
SUITE_SECONDS=${SUITE_SECONDS:-$( ((STUDY)) && echo 530 || echo 470 )}
RATE_SECONDS=${RATE_SECONDS:-45}
[[ "$STEPS" =~ ^[1-9][0-9]*$ && "$EPOCHS" =~ ^[1-9][0-9]*$ && "$SUITE_SECONDS" =~ ^[1-9][0-9]*$ &&
   "$RATE_SECONDS" =~ ^[1-9][0-9]*$ ]] || {
    echo "gpu_suite.sh: error: STEPS, EPOCHS, SUITE_SECONDS and RATE_SECONDS must be positive integers, got" \
         "'$STEPS', '$EPOCHS', '$SUITE_SECONDS', '$RATE_SECONDS'" >&2; exit 2; }
OUT=${OUT:-bench/results/gpu_suite-$( ((DRY_RUN)) && echo "dry-" )$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT" || exit 2

if ((DRY_RUN)); then  # the same commands, sized for seconds on a CPU
    SELECTION=(--devices cpu --numel 100000 --densities 0.02 --repeats 1)
    STEP_TIME=(--model lstman4_tiny --global-batch 4 --steps 2 --warmup 1
               --set distributed.device=cpu train.threads=1)
    TRAIN=(model.name=lstman4_tiny data.max_train_utterances=16 data.max_eval_utterances=8 train.epochs=1
           train.global_batch_size=4 train.eval_batch_size=8 train.log_every_steps=1 data.num_workers=0
           optim.lr_warmup_steps=0 distributed.device=cpu train.threads=1)
    LIMITS=(env=60 selection=60 step_P1=90 step_P1_bf16=90 step_P2=120 summary=30)
    TRAIN_SECONDS=240  # fixed: on two CPU cores the 8 processes' start-up alone takes most of a minute
    RATE_SECONDS=90
    RATE=(train.epochs=3)  # at least two epoch ends to time
else
    SELECTION=(--devices cuda --densities 0.02 0.01 --repeats 10)
    ((STUDY)) && SELECTION=(--devices cuda --densities 0.02 --repeats 5)
    STEP_TIME=(--model lstman4 --global-batch 64 --steps "$STEPS" --warmup 3
               --set distributed.device=cuda train.threads=4)
    TRAIN=(train.epochs="$EPOCHS" distributed.device=cuda train.threads=2)  # 8 processes on the node's cores
    # 280 s at most before the trainings, plus 5 s each to kill a step that ignores SIGTERM
    LIMITS=(env=25 selection=40 step_P1=70 step_P1_bf16=40 step_P2=95 summary=10)
    ((STUDY)) && LIMITS=(env=25 selection=25 step_P1=50 step_P1_bf16=35 step_P2=65 summary=10)
    TRAIN_SECONDS=""  # what is left of SUITE_SECONDS when the trainings start
    RATE=()
fi
limit() {  # limit STEP -> its time limit in seconds
    local entry
    [[ "$1" == train ]] && { echo "$TRAIN_SECONDS"; return; }
    [[ "$1" == rate ]] && { echo $((2 * RATE_SECONDS)); return; }
    for entry in "${LIMITS[@]}"; do [[ "${entry%%=*}" == "$1" ]] && echo "${entry#*=}"; done
}

printf 'step\tstatus\tseconds\tlimit_s\n' > "$OUT/steps.tsv"
FAILED=0
record() {  # record STEP RC SECONDS [SKIPPED_BECAUSE]
    local status=ok
    if [[ -n "${4:-}" ]]; then
        status="skipped ($4)"
    elif (($2 == 124 || $2 == 137)); then
        status="timed out"
    elif (($2 != 0)); then
        status="failed (exit $2)"
    fi
    [[ "$status" == ok || "$status" == skipped* ]] || FAILED=1  # a step this machine cannot run is no failure
    printf '%s\t%s\t%s\t%s\n' "$1" "$status" "$3" "$(limit "$1")" >> "$OUT/steps.tsv"
    echo "[gpu_suite] $1: $status after $3 s (limit $(limit "$1") s)"
}
run_step() {  # run_step STEP STDOUT_FILE COMMAND...: stderr goes to $OUT/STEP.log
    local step=$1 stdout=$2 t0 rc
    shift 2
    echo "[gpu_suite] $step: $*"
    t0=$SECONDS
    timeout --kill-after=5 "$(limit "$step")" "$@" > "$stdout" 2> "$OUT/$step.log"
    rc=$?
    record "$step" "$rc" $((SECONDS - t0))
}
step_time() {  # step_time STEP P ALGORITHMS... [-- MORE step_time.py ARGUMENTS]
    local step=$1 ranks=$2
    shift 2
    run_step "$step" "$OUT/step_time_${step#step_}.md" "$MPIEXEC" -n "$ranks" "$PYTHON" bench/step_time.py \
        --density 0.02 --json "$OUT/step_time_${step#step_}.json" --algorithms "$@"
}

# Where bf16 cannot run (a dry run on a CPU without oneDNN's bfloat16 kernels), its step and training are skipped.
NO_BF16=""
if ((DRY_RUN)); then
    NO_BF16=$("$PYTHON" -c "import torch; from sparse_asr.training.runtime import precision_problem as p
print('' if p('bf16', torch.device('cpu')) is None else 'this CPU has no bfloat16 kernels')" 2>/dev/null) \
        || NO_BF16="the bf16 check failed"
fi

echo "[gpu_suite] results in $OUT ($( ((DRY_RUN)) && echo "dry run on the CPU" || echo "GPU run" ))"
run_step env "$OUT/env.txt" "$PYTHON" bench/gpu_report.py env "$OUT" $( ((DRY_RUN)) || echo --require-cuda)

# The fast settings: features cached on the GPU (no audio, no STFT, no host-to-device copy after the first
# epoch), dev scored every 2 epochs, a checkpoint only at a new best dev WER and at the end.
FAST=(data.num_workers=0 data.cache_features=true train.eval_every_epochs=2 train.checkpoint_every_epochs=100000)
if ((STUDY)); then  # epochs per minute of dense lstman4 alone on the GPU, before and after those settings
    rate_minutes=$(awk -v s="$RATE_SECONDS" 'BEGIN { printf "%.2f", (s - 20) / 60 }')
    t0=$SECONDS rate_rc=0
    for side in before after; do
        extra=()
        [[ $side == after ]] && extra=("${FAST[@]}")
        timeout --kill-after=5 "$RATE_SECONDS" "$MPIEXEC" -n 1 "$PYTHON" train.py --config configs/lstman4_recipe.yaml \
            name="$side" out_dir="$OUT/rate_runs" distributed.world_size=null "${TRAIN[@]}" "${RATE[@]}" \
            train.max_minutes="$rate_minutes" seed="$SEED" data.test_manifest= "${extra[@]}" \
            > "$OUT/rate_$side.log" 2>&1 || rate_rc=$?
        [[ -f "$OUT/rate_runs/$side/metrics.jsonl" ]] && cp "$OUT/rate_runs/$side/metrics.jsonl" "$OUT/metrics_rate_$side.jsonl"
    done
    rm -rf "$OUT"/rate_runs/*/checkpoints
    "$PYTHON" bench/gpu_report.py rate "$OUT" --epochs "$EPOCHS" > "$OUT/rate.md" || rate_rc=1
    record rate "$rate_rc" $((SECONDS - t0))
fi
if ! ((TRAININGS_ONLY)); then
    run_step selection "$OUT/selection.md" "$PYTHON" bench/selection.py "${SELECTION[@]}"
    step_time step_P1 1 dense topka oktopk "${STEP_TIME[@]}"
    if [[ -n "$NO_BF16" ]]; then
        record step_P1_bf16 0 0 "$NO_BF16"
    else
        step_time step_P1_bf16 1 dense oktopk "${STEP_TIME[@]}" train.precision=bf16
    fi
    step_time step_P2 2 dense topka oktopk "${STEP_TIME[@]}"
fi

# The four trainings share the GPU (and the time limit); each has its own log. Each stops by itself when
# train.max_minutes is up, leaving a minute for start-up and the test scoring before the hard limit.
if [[ -z "$TRAIN_SECONDS" ]]; then
    TRAIN_SECONDS=$((SUITE_SECONDS - SECONDS - $(limit summary)))
    ((TRAIN_SECONDS >= 120)) || TRAIN_SECONDS=120
fi
max_minutes=$(awk -v s="$TRAIN_SECONDS" 'BEGIN { printf "%.2f", (s - 60) / 60 }')
if ((STUDY)); then
    echo "[gpu_suite] train (study, seed $SEED): dense and oktopk on 1 rank, oktopk and oktopk complete_values" \
         "on 4 ranks, concurrently, $TRAIN_SECONDS s (train.max_minutes=$max_minutes)"
else
    echo "[gpu_suite] train: dense fp32 and bf16 on 1 rank, oktopk on 2 and 4 ranks, concurrently," \
         "$TRAIN_SECONDS s (train.max_minutes=$max_minutes)"
fi
t0=$SECONDS
common=(distributed.world_size=null out_dir="$OUT/runs" "${TRAIN[@]}" train.max_minutes="$max_minutes" seed="$SEED")
if ((STUDY)); then
    common+=("${FAST[@]}")
fi
declare -A train_pids=()
train_run() {  # train_run NAME RANKS OVERRIDES...: in the background, its output in train_NAME.log
    local name=$1 ranks=$2
    shift 2
    timeout --kill-after=5 "$TRAIN_SECONDS" "$MPIEXEC" -n "$ranks" "$PYTHON" train.py \
        --config configs/lstman4_recipe.yaml name="$name" "${common[@]}" "$@" > "$OUT/train_$name.log" 2>&1 &
    train_pids[$name]=$!
}
train_run dense-p1 1
if ((STUDY)); then
    train_run oktopk-p1 1 compression.algorithm=oktopk
    train_run oktopk-p4 4 compression.algorithm=oktopk
    train_run oktopk-cv-p4 4 compression.algorithm=oktopk compression.options.complete_values=true
else
    if [[ -n "$NO_BF16" ]]; then
        echo "[gpu_suite] train: dense-p1-bf16 skipped ($NO_BF16)"
    else
        train_run dense-p1-bf16 1 train.precision=bf16
    fi
    train_run oktopk-p2 2 compression.algorithm=oktopk
    train_run oktopk-p4 4 compression.algorithm=oktopk
fi
train_rc=0
for name in "${!train_pids[@]}"; do
    wait "${train_pids[$name]}"; rc=$?
    ((rc == 0)) || { echo "[gpu_suite] train: $name failed (exit $rc), see $OUT/train_$name.log"; train_rc=$rc; }
done
record train "$train_rc" $((SECONDS - t0))

if [[ -z "${KEEP_CHECKPOINTS:-}" ]]; then  # hundreds of MB per lstman4 run, of no use after the scoring
    rm -rf "$OUT"/runs/*/checkpoints
fi
if ((STUDY)); then  # flat files (a device returns no deep trees) and the four runs' curves in one plot
    for run_dir in "$OUT"/runs/*/; do
        name=$(basename "$run_dir")
        [[ -f "$run_dir/metrics.jsonl" ]] && cp "$run_dir/metrics.jsonl" "$OUT/metrics_$name.jsonl"
        [[ -f "$run_dir/config.yaml" ]] && cp "$run_dir/config.yaml" "$OUT/config_$name.yaml"
    done
    "$PYTHON" scripts/compare_runs.py "$OUT"/runs/*/ --out "$OUT/compare" > "$OUT/compare.log" 2>&1 \
        && cp "$OUT/compare/curves_vs_step.png" "$OUT/compare/results.md" "$OUT/" \
        || echo "[gpu_suite] compare_runs.py failed, see $OUT/compare.log"
fi
run_step summary "$OUT/summary.md" "$PYTHON" bench/gpu_report.py summary "$OUT"
cat "$OUT/summary.md"
echo "[gpu_suite] done in $SECONDS s: $OUT/summary.md$( ((FAILED)) && echo " (some steps FAILED, see steps.tsv)")"
exit "$FAILED"
