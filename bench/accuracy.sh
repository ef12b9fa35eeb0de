#!/bin/bash
# Accuracy of every gradient exchange on one config: each algorithm trains at the same P, seed and epochs
# (mpiexec -n P train.py ... name=<run>), then ONE table (final/best dev WER, test WER and CER, bytes
# received per rank per step, time per step, and with dense among the runs the step and bytes at which each
# run first reaches dense's best dev WER within 5%) and curves against step and cumulative bytes received
# (scripts/compare_runs.py), all in the output directory. Given again, the same command resumes an
# interrupted run from its last checkpoint and tables a finished one as it is. With --seeds "1 2 3" every
# algorithm trains at every seed (runs <algorithm>-s<seed>, seed by seed), and with dense among them paired.md
# compares each algorithm with dense seed by seed: the mean difference with a 95% interval and a verdict.
#   bash bench/accuracy.sh [-c CONFIG] [-n P] [-e EPOCHS] [--seed S | --seeds "S ..."] [-a "dense oktopk ..."] [-o DIR] [key=value ...]
set -euo pipefail
REPO=$(realpath "$(dirname "$0")/..")
source "$REPO/scripts/lib/args.sh"

DEFAULT_ALGORITHMS="dense oktopk topka gtopk gaussiank"

usage() {
    cat <<EOF
usage: bash bench/accuracy.sh [options] [key=value ...]
  -c, --config FILE        experiment config (default configs/an4_cpu.yaml)
  -n, --ranks P            MPI ranks of every run (default 4)
  -e, --epochs N           train.epochs of every run (default: the config's)
      --seed S             seed of every run (default: the config's)
      --seeds "S ..."      train every algorithm at each of these seeds, runs named <algorithm>-s<seed>
                           (all algorithms at the first seed, then the next); with several seeds and dense
                           among the algorithms, also paired.md / paired.csv: each algorithm against dense
                           at the same seeds (scripts/compare_runs.py --paired-against dense)
  -a, --algorithms "A ..." default: $DEFAULT_ALGORITHMS (any registered algorithm). An entry
                           ALG:KEY=VALUE[:KEY=VALUE] sets compression.options of that run only and names
                           it ALG-KEYVALUE..., e.g. powersgd:matrix_approximation_rank=4 runs as
                           powersgd-matrix_approximation_rank4 beside powersgd (its default rank)
  -o, --out DIR            output directory (default bench/results/accuracy-<config>-p<P>[-e<N>]):
                           runs/<run>/ (each run), logs/<run>.log, accuracy.md (the table),
                           results.csv, curves_vs_{step,bytes,wall_time}.png, wer_vs_time.md,
                           paired.{md,csv} (--seeds, see above)
  -j, --jobs N             runs at a time (default 1: one after another, they share the cores)
      --dry-run            print the commands; run nothing
  key=value                overrides for every run, e.g. compression.density=0.02 (not name, out_dir,
                           seed, train.epochs, compression.algorithm or distributed.world_size: set above)
EOF
}

config=configs/an4_cpu.yaml ranks=4 epochs="" seed="" seeds_list="" algorithms=$DEFAULT_ALGORITHMS out="" jobs=1 dry_run=0
overrides=()
while (($#)); do
    case "$1" in
        -c | --config) require_value "$@"; config=$2; shift 2 ;;
        -n | --ranks) require_value "$@"; ranks=$2; shift 2 ;;
        -e | --epochs) require_value "$@"; epochs=$2; shift 2 ;;
        --seed) require_value "$@"; seed=$2; shift 2 ;;
        --seeds) require_value "$@"; seeds_list=$2; shift 2 ;;
        -a | --algorithms) require_value "$@"; algorithms=$2; shift 2 ;;
        -o | --out) require_value "$@"; out=$2; shift 2 ;;
        -j | --jobs) require_value "$@"; jobs=$2; shift 2 ;;
        --dry-run) dry_run=1; shift ;;
        -h | --help) usage; exit 0 ;;
        -*) die "unknown option '$1' (see --help)" ;;
        *)
            require_override "$1"
            case "$1" in
                name=* | out_dir=* | seed=* | train.epochs=* | compression.algorithm=* | distributed.world_size=*)
                    die "override '$1' is set by accuracy.sh itself (see --help)" ;;
            esac
            overrides+=("$1")
            shift
            ;;
    esac
done

config=$(resolve_config "$config" "$REPO")
require_positive_int "--ranks" "$ranks"
require_positive_int "--jobs" "$jobs"
[[ -z "$epochs" ]] || require_positive_int "--epochs" "$epochs"
[[ -z "$seed" || "$seed" =~ ^[0-9]+$ ]] || die "--seed must be an integer >= 0, got '$seed'"
# seeds: the seed of each round of runs ("" = the config's); with --seeds the run names carry it
read -r -a seeds <<<"$seeds_list"
if [[ -n "$seeds_list" ]]; then
    [[ -z "$seed" ]] || die "give --seed or --seeds, not both"
    ((${#seeds[@]})) || die "--seeds needs at least one seed"
    for s in "${seeds[@]}"; do
        [[ "$s" =~ ^[0-9]+$ ]] || die "--seeds must be integers >= 0, got '$s' in '$seeds_list'"
    done
    [[ $(printf '%s\n' "${seeds[@]}" | sort | uniq -d) == "" ]] || die "a seed is listed twice: $seeds_list"
    suffix_seed=1
else
    seeds=("$seed")
    suffix_seed=0
fi
read -r -a entries <<<"$algorithms"
((${#entries[@]})) || die "no algorithms given"
# Each entry -> a run name and the overrides of that run alone (the algorithm and its options).
run_names=() run_overrides=()
for entry in "${entries[@]}"; do
    IFS=: read -r -a parts <<<"$entry"
    name=${parts[0]} own=("compression.algorithm=${parts[0]}")
    for option in "${parts[@]:1}"; do
        require_override "compression.options.$option"
        name+="-${option/=/}"
        own+=("compression.options.$option")
    done
    run_names+=("$name")
    run_overrides+=("${own[*]}")  # words without spaces (require_override): split again below
done
[[ $(printf '%s\n' "${run_names[@]}" | sort | uniq -d) == "" ]] || die "an algorithm is listed twice: $algorithms"
config_name=$(basename "${config%.*}")
out=${out:-bench/results/accuracy-$config_name-p$ranks${epochs:+-e$epochs}}
cd "$REPO"
source scripts/lib/tools.sh  # PYTHON, MPIEXEC

common=("distributed.world_size=$ranks")
[[ -z "$epochs" ]] || common+=("train.epochs=$epochs")
common+=("${overrides[@]}")

# Every run, seed by seed (a benchmark stopped half-way holds whole rounds to pair): its name, the index of
# its algorithm entry, and its seed ("" = the config's).
runs=() run_entries=() run_seeds=()
for s in "${seeds[@]}"; do
    for i in "${!run_names[@]}"; do
        if ((suffix_seed)); then runs+=("${run_names[$i]}-s$s"); else runs+=("${run_names[$i]}"); fi
        run_entries+=("$i")
        run_seeds+=("$s")
    done
done
# Every run's config is checked now (unknown algorithm, bad override, batch not divisible by P), not
# hours into the benchmark; prints the resolved epochs, seed, global batch and model.
check_seed=(${seeds[0]:+"seed=${seeds[0]}"})  # the first seed stands for all: a seed cannot make a config invalid
settings=$("$PYTHON" - "$config" "$ranks" "${run_overrides[@]}" -- "${common[@]}" "${check_seed[@]}" <<'EOF'
import sys

from sparse_asr.training.config import ConfigError, load_config

args = sys.argv[1:]
config, ranks, runs, overrides = args[0], int(args[1]), args[2:args.index("--")], args[args.index("--") + 1:]
try:
    for run in runs:
        cfg = load_config(config, overrides + run.split())
except ConfigError as e:
    sys.exit(f"accuracy.sh: error: {e}")
if cfg.train.global_batch_size % ranks:
    sys.exit(f"accuracy.sh: error: train.global_batch_size={cfg.train.global_batch_size} is not divisible by {ranks} ranks")
print(cfg.train.epochs, cfg.seed, cfg.train.global_batch_size, cfg.model.name, str(cfg.model.sync_batchnorm).lower())
EOF
) || exit 2
read -r epochs_used seed_used batch model sync_bn <<<"$settings"

# finished RUN_DIR: its metrics.jsonl holds a test row at the configured epochs (run again with more epochs,
# it resumes instead)
finished() {
    "$PYTHON" - "$1" "$epochs_used" <<'EOF'
import sys

from sparse_asr.training.runlog import read_metrics

run_dir, epochs = sys.argv[1], int(sys.argv[2])
try:
    rows = read_metrics(run_dir)
except (OSError, ValueError):
    sys.exit(1)
sys.exit(0 if any(row.get("kind") == "test" and row.get("epoch") == epochs for row in rows) else 1)
EOF
}

# A finished run is tabled as it is, not reopened (a resume would score the test set again and rewrite its
# files); an unfinished one resumes from its last checkpoint.
commands=() run_dirs=() todo=()
for r in "${!runs[@]}"; do
    run_dir=$out/runs/${runs[$r]}
    run_dirs+=("$run_dir")
    if [[ -e "$run_dir" ]] && finished "$run_dir"; then
        echo "accuracy.sh: ${runs[$r]}: finished ($epochs_used epochs and its test WER in $run_dir/metrics.jsonl): not run again" >&2
        continue
    fi
    [[ -e "$run_dir/checkpoints/last" || ! -e "$run_dir" ]] ||
        die "$run_dir exists but holds no checkpoint to resume from; remove it to train again"
    read -r -a own <<<"${run_overrides[${run_entries[$r]}]}"
    s=${run_seeds[$r]}
    command=("$MPIEXEC" -n "$ranks" "$PYTHON" train.py --config "$config" "out_dir=$out/runs"
             "name=${runs[$r]}" "${own[@]}" "${common[@]}" ${s:+"seed=$s"})
    [[ ! -e "$run_dir/checkpoints/last" ]] || command+=(--resume "$run_dir")
    commands+=("$(shell_join "${command[@]}")")
    todo+=("$r")
done
if ((dry_run)); then
    ((${#commands[@]} == 0)) || printf '%s\n' "${commands[@]}"
    exit 0
fi

if ((jobs > 1)) && [[ -z "${OMP_NUM_THREADS:-}" ]]; then  # runs side by side share the cores
    threads=$(($(nproc) / (ranks * jobs)))
    export OMP_NUM_THREADS=$((threads > 0 ? threads : 1))
fi
mkdir -p "$out/logs"
started=$(date '+%Y-%m-%d %H:%M:%S')
failed=()
running=0
for c in "${!commands[@]}"; do
    name=${runs[${todo[$c]}]}
    echo "accuracy.sh: $name: ${commands[$c]}" >&2
    # Logs are appended to: a resumed run's log keeps its beginning.
    if ((jobs == 1)); then
        bash -c "${commands[$c]}" 2>&1 | tee -a "$out/logs/$name.log" || failed+=("$name")
    else
        bash -c "${commands[$c]}" >>"$out/logs/$name.log" 2>&1 &
        running=$((running + 1))
        if ((running >= jobs)); then
            wait -n || failed+=("some run (see $out/logs)")
            running=$((running - 1))
        fi
    fi
done
while ((running > 0)); do
    wait -n || failed+=("some run (see $out/logs)")
    running=$((running - 1))
done
((${#failed[@]} == 0)) || die "failed: ${failed[*]} (logs in $out/logs)"

# "reaches dense's WER": the step and bytes at which each run first gets within 5% of it (with --seeds,
# of the dense run at its own seed: compare_runs.py takes "dense" as the label of dense-s<seed>)
target=() paired=()
[[ " ${run_names[*]} " != *" dense "* ]] || target=(--target-run dense --target-slack 0.05)
((${#target[@]} == 0 || ${#seeds[@]} < 2 || ${#run_names[@]} < 2)) || paired=(--paired-against dense)
rm -f "$out/paired.md" "$out/paired.csv"  # never leave a previous benchmark's pairing beside this table
"$PYTHON" scripts/compare_runs.py "${run_dirs[@]}" --out "$out" "${target[@]}" "${paired[@]}" >/dev/null
"$PYTHON" bench/wer_vs_time.py "${run_dirs[@]}" >"$out/wer_vs_time.md"
{
    if ((suffix_seed)); then
        echo "# Accuracy: $config_name, $model, $ranks rank(s), $epochs_used epochs, seeds ${seeds[*]}"
    else
        echo "# Accuracy: $config_name, $model, $ranks rank(s), $epochs_used epochs, seed $seed_used"
    fi
    echo
    echo "\`bash bench/accuracy.sh $(shell_join -c "$config" -n "$ranks" ${epochs:+-e "$epochs"} ${seed:+--seed "$seed"} \
        ${seeds_list:+--seeds "${seeds[*]}"} -a "$algorithms" -o "$out" "${overrides[@]}")\`"
    echo
    echo "Global batch $batch, model.sync_batchnorm $sync_bn. Bytes are received per rank: bytes_recv_per_step by"
    echo "the gradient exchange, syncbn_bytes_per_step by synchronized BatchNorm. Times in ms per optimizer step."
    ((${#target[@]} == 0)) || echo "step_at_target, bytes_at_target: the first dev evaluation at WER <= target_dev_wer" \
        "(dense's best x 1.05${seeds_list:+, dense at the same seed})."
    echo "Trained $started to $(date '+%Y-%m-%d %H:%M:%S') on $(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) cores, $jobs run(s) at a time;"
    echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg). Every epoch: wer_vs_time.md."
    echo
    cat "$out/results.md"
    echo
    if ((${#paired[@]})); then
        echo "## Paired by seed against dense (paired.csv holds every figure)"
        echo
        cat "$out/paired.md"
        echo
    fi
    echo "![dev WER and train loss against step](curves_vs_step.png)"
    echo "![against cumulative bytes received per rank](curves_vs_bytes.png)"
} >"$out/accuracy.md"
cat "$out/accuracy.md"
