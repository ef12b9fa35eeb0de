#!/usr/bin/env bash
# The test command: set up the environment (idempotent) and run the whole test suite.
#   bash scripts/test.sh                 everything (CI runs this: .ci/run)
#   bash scripts/test.sh --quick         the unit tier only (pytest -m unit): the edit-test loop, under a minute
#   bash scripts/test.sh -m "data or mpi" [pytest arguments]   any tier or selection (tiers: tests/conftest.py)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [[ "${1:-}" == --quick ]]; then
    shift
    set -- -m unit "$@"
fi
# One torch thread per process unless asked otherwise: tests share 2 cores with MPI ranks, and torch's
# spinning threads slow each other down many times over when oversubscribed.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec .venv/bin/python -m pytest "$@"
