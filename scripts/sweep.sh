#!/bin/bash
# Every algorithm x density x rank count, each run with its own name (<prefix>-<algorithm>-d<density>-p<P>)
# so the runs sit side by side in TensorBoard. The algorithms that ignore the density (dense, PowerSGD, the quantized
# exchanges) run once per P (<prefix>-<algorithm>-p<P>).
# Locally the runs go one after another (mpiexec); on a cluster each becomes one job (submit helper).
#   scripts/sweep.sh -c configs/X.yaml [--scheduler local|pbs|slurm] [--dry-run] [key=value ...]
set -euo pipefail
REPO=$(realpath "$(dirname "$0")/..")
source "$REPO/scripts/lib/args.sh"

# The registry is the one list (compression/__init__.py COMPRESSORS): every algorithm, and those whose volume does not
# depend on the density (uses_density = False: one run per P, whatever the density). Read once the arguments are
# known to be well formed, so that a mistyped option is refused without starting Python and torch.
cd "$REPO"
source scripts/lib/tools.sh  # PYTHON
read_registry() {
    { read -r ALL_ALGORITHMS; read -r DENSITY_FREE; } < <("$PYTHON" -c "from sparse_asr.compression import COMPRESSORS as C
print(' '.join(C)); print(' '.join(name for name, cls in C.items() if not cls.uses_density))") \
        || die "could not read the algorithms from sparse_asr.compression (is the environment set up?)"
    [[ -n "$ALL_ALGORITHMS" ]] || die "could not read the algorithms from sparse_asr.compression (is the environment set up?)"
}

usage() {
    read_registry
    cat <<EOF
usage: scripts/sweep.sh -c CONFIG [options] [key=value ...]
  -c, --config FILE        experiment config (required)
      --scheduler S        local (default), pbs (scripts/polaris/submit.sh) or slurm (scripts/slurm/submit.sh)
      --algorithms "A ..." default: $ALL_ALGORITHMS
      --densities "D ..."  default: 0.01 0.02
      --ranks "P ..."      default: 2 4 (local), 4 8 16 32 (pbs, slurm)
      --prefix NAME        run name prefix (default: the config's file name without .yaml); a sweep refuses
                           names whose run directory exists already, e.g. use --prefix lstman4-\$(date +%m%d)
      --gpus-per-node G    cluster only: ranks per node (default 4); P <= G uses one node with P ranks,
                           larger P must be a multiple of G
  -t, --walltime T         cluster only: HH:MM:SS, passed to the submit helper
  -q, --queue Q            cluster only: PBS queue or Slurm partition
  -A, --account NAME       cluster only: project to charge (required for pbs)
      --dry-run            print every command; run or submit nothing
  key=value                extra overrides for every run (not name, compression.algorithm,
                           compression.density or distributed.world_size: the sweep sets those)
EOF
}

config="" scheduler=local algorithms=all densities="0.01 0.02" ranks="" prefix="" gpus_per_node=4
walltime="" queue="" account="" dry_run=0
overrides=()
while (($#)); do
    case "$1" in
        -c | --config) require_value "$@"; config=$2; shift 2 ;;
        --scheduler) require_value "$@"; scheduler=$2; shift 2 ;;
        --algorithms) require_value "$@"; algorithms=$2; shift 2 ;;
        --densities) require_value "$@"; densities=$2; shift 2 ;;
        --ranks) require_value "$@"; ranks=$2; shift 2 ;;
        --prefix) require_value "$@"; prefix=$2; shift 2 ;;
        --gpus-per-node) require_value "$@"; gpus_per_node=$2; shift 2 ;;
        -t | --walltime) require_value "$@"; walltime=$2; shift 2 ;;
        -q | --queue) require_value "$@"; queue=$2; shift 2 ;;
        -A | --account) require_value "$@"; account=$2; shift 2 ;;
        --dry-run) dry_run=1; shift ;;
        -h | --help) usage; exit 0 ;;
        -*) die "unknown option '$1' (see --help)" ;;
        *)
            require_override "$1"
            case "$1" in
                name=* | compression.algorithm=* | compression.density=* | distributed.world_size=*)
                    die "override '$1' is set by the sweep itself for every run" ;;
            esac
            overrides+=("$1")
            shift
            ;;
    esac
done

config=$(resolve_config "$config" "$REPO")
case "$scheduler" in
    local) ranks=${ranks:-"2 4"} ;;
    pbs | slurm) ranks=${ranks:-"4 8 16 32"} ;;
    *) die "unknown scheduler '$scheduler' (local, pbs or slurm)" ;;
esac
read -r -a algorithm_list <<<"$algorithms"
read -r -a density_list <<<"$densities"
read -r -a rank_list <<<"$ranks"
((${#algorithm_list[@]})) || die "no algorithms given"
((${#density_list[@]})) || die "no densities given"
((${#rank_list[@]})) || die "no rank counts given"
for density in "${density_list[@]}"; do
    require_density "$density"
done
require_positive_int "--gpus-per-node" "$gpus_per_node"
for P in "${rank_list[@]}"; do
    require_positive_int "rank count" "$P"
    if [[ "$scheduler" != local ]] && ((P > gpus_per_node && P % gpus_per_node != 0)); then
        die "rank count $P does not fill whole nodes of $gpus_per_node GPUs (use a multiple of $gpus_per_node)"
    fi
done
prefix=${prefix:-$(basename "${config%.*}")}
[[ "$prefix" =~ ^[A-Za-z0-9_.-]+$ ]] || die "bad --prefix '$prefix' (letters, digits, _ . - only)"
[[ -z "$walltime" ]] || require_walltime "$walltime"
if [[ "$scheduler" == local && -n "$walltime$queue$account" ]]; then
    die "--walltime, --queue and --account are for --scheduler pbs or slurm"
fi
if [[ "$scheduler" == pbs && -z "$account" ]]; then
    die "--scheduler pbs needs --account (Polaris charges every job to a project)"
fi
read_registry
[[ "$algorithms" != all ]] || read -r -a algorithm_list <<<"$ALL_ALGORITHMS"
for algorithm in "${algorithm_list[@]}"; do
    [[ " $ALL_ALGORITHMS " == *" $algorithm "* ]] || die "unknown algorithm '$algorithm' (known: $ALL_ALGORITHMS)"
done

# The command for one run, into the array `run_command`.
make_command() {
    local algorithm=$1 density=$2 P=$3 name nodes ppn
    if [[ " $DENSITY_FREE " == *" $algorithm "* ]]; then
        name="$prefix-$algorithm-p$P"
        run_overrides=("name=$name" "compression.algorithm=$algorithm")
    else
        name="$prefix-$algorithm-d$density-p$P"
        run_overrides=("name=$name" "compression.algorithm=$algorithm" "compression.density=$density")
    fi
    if [[ "$scheduler" == local ]]; then
        run_command=(.venv/bin/mpiexec -n "$P" .venv/bin/python train.py --config "$config"
            "${run_overrides[@]}" "distributed.world_size=$P" "${overrides[@]}")
        return
    fi
    if ((P <= gpus_per_node)); then nodes=1 ppn=$P; else nodes=$((P / gpus_per_node)) ppn=$gpus_per_node; fi
    run_command=("scripts/$([[ "$scheduler" == pbs ]] && echo polaris || echo slurm)/submit.sh"
        -c "$config" -N "$nodes" --ppn "$ppn")
    [[ -z "$walltime" ]] || run_command+=(-t "$walltime")
    if [[ -n "$queue" ]]; then
        run_command+=("$([[ "$scheduler" == pbs ]] && echo -q || echo -p)" "$queue")
    fi
    [[ -z "$account" ]] || run_command+=(-A "$account")
    run_command+=("${run_overrides[@]}" "${overrides[@]}")
}

# The runs, as "algorithm density P".
runs=()
for P in "${rank_list[@]}"; do
    for algorithm in "${algorithm_list[@]}"; do
        for density in "${density_list[@]}"; do
            runs+=("$algorithm $density $P")
            [[ " $DENSITY_FREE " != *" $algorithm "* ]] || break # one run per P
        done
    done
done

# A run directory that exists already would get a second set of curves appended (out_dir: runs/, or the
# out_dir= override; a config with another out_dir is not checked).
out_dir=runs
for override in "${overrides[@]}"; do
    [[ "$override" != out_dir=* ]] || out_dir=${override#out_dir=}
done
[[ "$out_dir" == /* ]] || out_dir="$REPO/$out_dir"
for run in "${runs[@]}"; do
    make_command $run
    name=${run_overrides[0]#name=}
    if [[ -e "$out_dir/$name" ]]; then
        ((dry_run)) || die "run directory $out_dir/$name exists already: choose another --prefix"
        echo "# note: $out_dir/$name exists already (a real sweep would refuse)" >&2
    fi
done

cd "$REPO"
# train.py's config checks for every run at its rank count, in one go (dry runs too): nothing starts or
# waits in a queue to be refused. The world size comes first, as the job scripts put it.
venv=.venv
[[ "$scheduler" != pbs ]] || venv=.venv-polaris
for run in "${runs[@]}"; do
    make_command $run
    echo "${run##* } distributed.world_size=${run##* } ${run_overrides[*]} ${overrides[*]}"
done | check_config "$(project_python "$REPO/$venv" "$REPO")" "$REPO" "$config" --runs
# Cluster jobs: every submit helper checks its arguments (its own dry run) before anything is submitted;
# the configs are checked already.
if [[ "$scheduler" != local ]]; then
    for run in "${runs[@]}"; do
        make_command $run
        "${run_command[@]}" --dry-run --skip-config-check >/dev/null ||
            die "the submit helper refused: $(shell_join "${run_command[@]}")"
    done
fi
count=0
for run in "${runs[@]}"; do
    make_command $run
    count=$((count + 1))
    shell_join "${run_command[@]}"
    if ((!dry_run)); then
        if [[ "$scheduler" != local ]]; then run_command+=(--skip-config-check); fi
        "${run_command[@]}" || die "run $count of ${#runs[@]} failed: $(shell_join "${run_command[@]}")"
    fi
done
echo "# $count runs ($scheduler$( ((dry_run)) && echo ', dry run: nothing was started'))" >&2
