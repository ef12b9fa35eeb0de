#!/bin/bash
# One-time environment for Polaris jobs: a venv on top of ALCF's conda module (which provides CUDA
# PyTorch), with mpi4py built against Cray MPICH. Run it on a login node from the repository root:
#   bash scripts/polaris/setup_env.sh [VENV_DIR]     (default .venv-polaris, what train.pbs activates)
# Never install the `mpich` wheel from requirements.txt here: it would shadow Cray MPICH, and ranks
# on different nodes could not talk over Slingshot.
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=${1:-.venv-polaris}

set +u # the module and conda activation scripts read unset variables
module use /soft/modulefiles
module load conda
conda activate base
set -u

if [[ ! -x "$venv/bin/python" ]]; then
    python -m venv --system-site-packages "$venv" # keeps the conda module's torch and CUDA libraries
fi
source "$venv/bin/activate"
# Everything pinned except what must come from the site: torch/torchaudio (conda module), mpi4py/mpich.
grep -v -E '^(torch|torchaudio|mpi4py|mpich)==' requirements.txt >"$venv/requirements-polaris.txt"
pip install --disable-pip-version-check -r "$venv/requirements-polaris.txt"
# mpi4py against Cray MPICH: the cc compiler wrapper links the site MPI (and its GPU transport layer,
# needed for MPICH_GPU_SUPPORT_ENABLED=1, when craype-accel-nvidia80 is loaded).
MPICC=cc pip install --disable-pip-version-check --force-reinstall --no-cache-dir --no-binary mpi4py mpi4py
python -c "import torch, torchaudio, mpi4py.MPI as M; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), '|', M.Get_library_version().splitlines()[0])"
