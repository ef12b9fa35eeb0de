#!/bin/bash
# GPU affinity for one MPI rank on a Polaris node: show the rank exactly one GPU, chosen by its
# local rank on the node, then run the command. Use it between mpiexec and the program:
#   mpiexec -n 8 --ppn 4 --depth=8 --cpu-bind depth scripts/polaris/set_affinity_gpu_polaris.sh python train.py ...
# Local rank: PMI_LOCAL_RANK (Cray PALS) or PALS_LOCAL_RANKID. GPUS_PER_NODE defaults to 4.
# REVERSE_GPUS=1 maps local rank 0 to the last GPU, as ALCF's example script does, so that with
# --cpu-bind depth each rank's cores and its GPU are close in the node's topology.
set -euo pipefail
local_rank=${PMI_LOCAL_RANK:-${PALS_LOCAL_RANKID:-}}
if [[ ! "$local_rank" =~ ^[0-9]+$ ]]; then
    echo "$(basename "$0"): error: no local rank (PMI_LOCAL_RANK / PALS_LOCAL_RANKID unset or not a number: '$local_rank'); run it under Cray mpiexec" >&2
    exit 2
fi
gpus=${GPUS_PER_NODE:-4}
if [[ ! "$gpus" =~ ^[1-9][0-9]*$ ]]; then
    echo "$(basename "$0"): error: GPUS_PER_NODE must be a positive integer, got '$gpus'" >&2
    exit 2
fi
gpu=$((local_rank % gpus))
if [[ "${REVERSE_GPUS:-0}" == 1 ]]; then
    gpu=$((gpus - 1 - gpu))
fi
export CUDA_VISIBLE_DEVICES=$gpu
exec "$@"
