#!/usr/bin/env bash
# Accuracy of Ok-Topk vs dense on real AN4: the CPU model on P ranks (default 4), same config, seed
# and epochs, only the gradient exchange differs. Then the comparison table and plots.
#   bash bench/accuracy_p4.sh                       # EPOCHS=10 P=4 DENSITY=0.02
#   EPOCHS=20 P=4 bash bench/accuracy_p4.sh [key.sub=value ...]   (overrides for both runs)
# Runs land in runs/acc-p<P>-{dense,oktopk}-e<EPOCHS>; the comparison in bench/results/accuracy_p<P>/.
set -euo pipefail
cd "$(dirname "$0")/.."
EPOCHS=${EPOCHS:-10}
P=${P:-4}
DENSITY=${DENSITY:-0.02}
CONFIG=${CONFIG:-configs/an4_cpu.yaml}
OUT=bench/results/accuracy_p$P
cores=$(nproc)
threads=$(( cores / P > 0 ? cores / P : 1 ))
runs=()
for algo in dense oktopk; do
  name=acc-p$P-$algo-e$EPOCHS
  if [ -e "runs/$name" ]; then
    echo "accuracy_p4.sh: runs/$name exists; remove it to measure again" >&2; exit 2
  fi
  OMP_NUM_THREADS=$threads .venv/bin/mpiexec -n "$P" .venv/bin/python train.py --config "$CONFIG" \
    name="$name" train.epochs="$EPOCHS" compression.algorithm="$algo" compression.density="$DENSITY" \
    distributed.world_size="$P" "$@"
  runs+=("runs/$name")
done
.venv/bin/python scripts/compare_runs.py "${runs[@]}" --out "$OUT"
.venv/bin/python bench/wer_vs_time.py "${runs[@]}" | tee "$OUT/wer_vs_time.md"
cat "$OUT/results.md"
