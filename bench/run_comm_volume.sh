#!/usr/bin/env bash
# Communication volume of every registered algorithm at the lstman4 size for P = 2, 4, 8.
# Tables go to stdout and bench/results/comm_volume_P<P>.{md,json} (baselines) and
# bench/results/comm_volume_oktopk_P<P>.{md,json} (Ok-Topk).
#   bash bench/run_comm_volume.sh
#   PROCS="2 4" STEPS=16 OKTOPK_STEPS=128 bash bench/run_comm_volume.sh
#   BASELINES= PROCS="2 4" bash bench/run_comm_volume.sh    # Ok-Topk only
# Ok-Topk runs OKTOPK_STEPS (default 64) steps: one full period of its threshold recomputations
# (every 32) and repartitions (every 64), so its figure is the amortized volume. The baselines
# recompute nothing periodically, so STEPS (default 8) steps give their per-step volume; this keeps
# the P = 8 run (8 ranks oversubscribing 2 cores) within minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-8}
OKTOPK_STEPS=${OKTOPK_STEPS:-64}
NUMEL=${NUMEL:-27569568}
DENSITY=${DENSITY:-0.02}
PROCS=${PROCS:-2 4 8}
BASELINES=${BASELINES-dense topka topkdsa gtopk gaussiank}  # set but empty: none
OUT=bench/results
mkdir -p "$OUT"
run() {  # run P STEPS NAME ALGORITHMS...
  local P=$1 steps=$2 name=$3
  shift 3
  OMP_NUM_THREADS=1 .venv/bin/mpiexec -n "$P" .venv/bin/python bench/comm_volume.py \
    --numel "$NUMEL" --density "$DENSITY" --steps "$steps" --algorithms "$@" --json "$OUT/$name.json" \
    | tee "$OUT/$name.md"
  echo
}
for P in $PROCS; do
  run "$P" "$OKTOPK_STEPS" "comm_volume_oktopk_P$P" oktopk
  [ -z "$BASELINES" ] || run "$P" "$STEPS" "comm_volume_P$P" $BASELINES
done
