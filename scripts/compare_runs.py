"""Compare training runs: TensorBoard event files + config.yaml -> PNG curves and a results table.

    .venv/bin/python scripts/compare_runs.py runs/A runs/B [...] --out results/compare

What it writes, and every option: --help (the code: sparse_asr/analysis/, compare.py)."""
import sys

from sparse_asr.analysis.compare import main

if __name__ == "__main__":
    sys.exit(main())
