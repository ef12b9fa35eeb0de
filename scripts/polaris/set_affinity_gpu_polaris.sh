#!/bin/bash
# GPU affinity for one MPI rank on a Polaris node: show the rank exactly one GPU, chosen by its
# local rank on the node, then run the command. Use it between mpiexec and the program:
#   mpiexec -n 8 --ppn 4 --depth=8 --cpu-bind depth scripts/polaris/set_affinity_gpu_polaris.sh python train.py ...
# Local rank: PMI_LOCAL_RANK (Cray PALS) or PALS_LOCAL_RANKID. GPUS_PER_NODE defaults to 4.
#
# Local rank r gets GPU 3 - r, as in ALCF's own example, and that is the right choice: a Polaris node
# has one 32-core EPYC in 4 NUMA domains of 8 cores, and its GPUs are wired in reverse order --
# GPU 3 sits next to cores 0-7 (NUMA 0), GPU 2 to 8-15, GPU 1 to 16-23, GPU 0 to 24-31 (nvidia-smi
# topo -m; ALCF's Polaris machine overview). `--depth=8 --cpu-bind depth` gives local rank r cores
# 8r..8r+7, so GPU 3 - r is the one in its own NUMA domain; GPU r would put every host<->GPU copy
# (the staged MPI buffers, the batches) across the chip's Infinity Fabric.
# REVERSE_GPUS=0 maps local rank r to GPU r instead (for a launch that binds cores differently).
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
reverse=${REVERSE_GPUS:-1}
if [[ "$reverse" != 0 && "$reverse" != 1 ]]; then
    echo "$(basename "$0"): error: REVERSE_GPUS must be 0 or 1, got '$reverse'" >&2
    exit 2
fi
gpu=$((local_rank % gpus))
if [[ "$reverse" == 1 ]]; then
    gpu=$((gpus - 1 - gpu))
fi
export CUDA_VISIBLE_DEVICES=$gpu
exec "$@"
