#!/usr/bin/env bash
# Per-step time split (compute / selection / communication / other) of the real training step, for
# the CPU model with every algorithm and for lstman4 with dense, TopkA and Ok-Topk, at P = 2 and 4.
# Tables to stdout and bench/results/step_time_<model>_P<P>.{md,json}. Ranks get 1 thread each; on
# a 2-core machine P = 4 oversubscribes the cores (the header says so).
#   bash bench/run_step_time.sh
#   PROCS="2" STEPS=10 bash bench/run_step_time.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PROCS=${PROCS:-2 4}
STEPS=${STEPS:-5}
OUT=bench/results
mkdir -p "$OUT"
run() {  # run P MODEL GLOBAL_BATCH STEPS ALGORITHMS...
  local P=$1 model=$2 batch=$3 steps=$4
  shift 4
  OMP_NUM_THREADS=1 .venv/bin/mpiexec -n "$P" .venv/bin/python bench/step_time.py --model "$model" \
    --algorithms "$@" --density 0.02 --global-batch "$batch" --steps "$steps" --warmup 1 \
    --json "$OUT/step_time_${model}_P$P.json" | tee "$OUT/step_time_${model}_P$P.md"
  echo
}
for P in $PROCS; do
  run "$P" lstman4_small 16 "$STEPS" dense topka topkdsa gtopk gaussiank oktopk
  run "$P" lstman4 4 3 dense topka oktopk   # the paper's model: seconds per step on 1 CPU thread, so a small batch
done
