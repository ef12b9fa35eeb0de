"""Project each algorithm's communication and step time to P = 4 ... 256 GPUs with an alpha-beta model.

    .venv/bin/python bench/project_scaling.py [--measured bench/results/comm_volume_P*.json] [--density 0.02]
        [--options powersgd.matrix_approximation_rank=4 ...] [--out DIR]

The model, its assumptions and every option: --help (the code: sparse_asr/analysis/scaling.py and
scaling_report.py)."""
import sys

from sparse_asr.analysis.scaling_report import main

if __name__ == "__main__":
    sys.exit(main())
