"""Keep finished training runs small enough to commit: config.yaml, provenance.jsonl and metrics.jsonl as xz.

    .venv/bin/python scripts/keep_runs.py bench/results/cell/runs/* --into docs/results/cell/runs

What is kept, skipped and refused: sparse_asr/analysis/keep.py."""
import sys

from sparse_asr.analysis.keep import main

if __name__ == "__main__":
    sys.exit(main())
