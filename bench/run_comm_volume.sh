#!/usr/bin/env bash
# Communication volume of every registered algorithm at the lstman4 size for P = 2, 4, 8.
# Tables go to stdout and bench/results/comm_volume_P<P>.{md,json}.
#   bash bench/run_comm_volume.sh                    # STEPS=8: ~10 minutes on 2 free cores
#   STEPS=64 PROCS="2 4" bash bench/run_comm_volume.sh   # one full Ok-Topk period (needs more cores)
# With fewer than 64 steps Ok-Topk's step-0 recomputation weighs more than in training (see
# bench/comm_volume.py). Ranks may outnumber cores (mpich oversubscribes), which only slows it down.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-8}
NUMEL=${NUMEL:-27569568}
DENSITY=${DENSITY:-0.02}
PROCS=${PROCS:-2 4 8}
OUT=bench/results
mkdir -p "$OUT"
for P in $PROCS; do
  OMP_NUM_THREADS=1 .venv/bin/mpiexec -n "$P" .venv/bin/python bench/comm_volume.py \
    --numel "$NUMEL" --density "$DENSITY" --steps "$STEPS" --json "$OUT/comm_volume_P$P.json" \
    | tee "$OUT/comm_volume_P$P.md"
  echo
done
