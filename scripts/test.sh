#!/usr/bin/env bash
# The test command: set up the environment (idempotent) and run the whole test suite.
#   bash scripts/test.sh                 everything (CI runs this: .ci/run)
#   bash scripts/test.sh --quick         the unit tier only (pytest -m unit): the edit-test loop (about 1.5 minutes on 2 cores)
#   bash scripts/test.sh -m "data or mpi" [pytest arguments]   any tier or selection (tiers: tests/conftest.py)
#   bash scripts/test.sh --cpu-matrix [pytest arguments]   the numerical tiers (all but tooling) once per CPU
#        kernel dispatch this CPU can run: ATEN_CPU_CAPABILITY=default, avx2, avx512 (where the CPU has it) and
#        oneDNN limited to AVX2 (ONEDNN_MAX_CPU_ISA=AVX2). Each torch kernel family rounds differently, so a
#        test that holds under one and not another asserts a float that one CPU happens to give. Run it
#        before every submission; CI runs the suite once.
#   bash scripts/test.sh -p bench.suite_time --suite-time-dir DIR   the suite, each test's wall and CPU seconds
#        recorded in DIR (.venv/bin/python bench/suite_time.py DIR: where the time goes)
# Two pytest-xdist workers share the 2 cores, each test where a worker is free; the tests of one xdist_group
# (those sharing an expensive module fixture, to build it once) run on one worker. Give -n 0 to run in one
# process (e.g. with --pdb).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
workers=(-n 2 --dist loadgroup)
if [[ "${1:-}" == --cpu-matrix ]]; then
    shift
    passes=(ATEN_CPU_CAPABILITY=default ATEN_CPU_CAPABILITY=avx2)
    grep -q -w avx512f /proc/cpuinfo && passes+=(ATEN_CPU_CAPABILITY=avx512)
    passes+=(ONEDNN_MAX_CPU_ISA=AVX2)
    failed=()
    start=$SECONDS
    for pass in "${passes[@]}"; do
        echo "== test.sh --cpu-matrix: $pass ($(env "$pass" .venv/bin/python -c \
            'import torch; print("torch dispatch", torch.backends.cpu.get_cpu_capability())'))"
        t0=$SECONDS
        env "$pass" OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" \
            .venv/bin/python -m pytest "${workers[@]}" -m "not tooling" -q "$@" || failed+=("$pass")
        echo "== $pass: $((SECONDS - t0)) s"
    done
    echo "== test.sh --cpu-matrix: ${#passes[@]} passes in $((SECONDS - start)) s;" \
         "$( ((${#failed[@]})) && echo "FAILED under: ${failed[*]}" || echo "all passed")"
    ((${#failed[@]} == 0))
    exit
fi
if [[ "${1:-}" == --quick ]]; then
    shift
    set -- -m unit "$@"
fi
# One torch thread per process unless asked otherwise: tests share 2 cores with MPI ranks, and torch's
# spinning threads slow each other down many times over when oversubscribed.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec .venv/bin/python -m pytest "${workers[@]}" "$@"
