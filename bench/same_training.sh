#!/usr/bin/env bash
# Do two checkouts train to the same bits? Short runs of dense and Ok-Topk (configs/verdict_p4x4.yaml, 4 ranks,
# 2 epochs of 160 utterances: dense warm-up steps, then sparse ones) from each tree, then every logged figure
# compared: a refactor or a new exchange may join a running comparison only where this prints "identical".
# Both trees need .venv and prepared manifests; the same CPU type for both (rounding differs between CPUs).
#   bash bench/same_training.sh OLD_TREE NEW_TREE [P]
set -euo pipefail
(($# >= 2)) || { echo "usage: bash bench/same_training.sh OLD_TREE NEW_TREE [P]" >&2; exit 2; }
old=$(realpath "$1") new=$(realpath "$2") ranks=${3:-4}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for tree in "$old" "$new"; do
    side=$([[ $tree == "$old" ]] && echo old || echo new)
    for algorithm in dense oktopk; do
        (cd "$tree" && OMP_NUM_THREADS=1 .venv/bin/mpiexec -n "$ranks" .venv/bin/python train.py \
            --config configs/verdict_p4x4.yaml "out_dir=$out/$side" "name=$algorithm" "compression.algorithm=$algorithm" \
            "distributed.world_size=$ranks" train.epochs=2 data.max_train_utterances=160 > "$out/$side-$algorithm.log" 2>&1) \
            || { echo "same_training: the $side tree's $algorithm run failed:" >&2; tail -5 "$out/$side-$algorithm.log" >&2; exit 1; }
    done
done
"$new/.venv/bin/python" - "$out" <<'PY'
import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
FIGURES = ("train/loss", "train/grad_norm", "comm/bytes_recv", "dev/wer", "dev/loss", "test/wer", "test/loss")
for algorithm in ("dense", "oktopk"):
    rows = {side: [{k: r[k] for k in ("kind", "step", *FIGURES) if k in r}
                   for r in map(json.loads, (out / side / algorithm / "metrics.jsonl").read_text().splitlines())]
            for side in ("old", "new")}
    same = rows["old"] == rows["new"]
    print(f"{algorithm}: {'identical' if same else 'DIFFERENT'} ({len(rows['new'])} logged rows)")
    if not same:
        sys.exit(1)
PY
