# The interpreter and MPI launcher of a bench script, for the current directory: the checkout's .venv, or
# python3 and mpiexec from PATH (an offline bundle after `source bootstrap.sh`). PYTHON / MPIEXEC override.
# Source it from the repository root; sets PYTHON and MPIEXEC.
if [[ -x .venv/bin/python ]]; then
    PYTHON=${PYTHON:-.venv/bin/python} MPIEXEC=${MPIEXEC:-.venv/bin/mpiexec}
else
    PYTHON=${PYTHON:-python3} MPIEXEC=${MPIEXEC:-mpiexec}
fi
