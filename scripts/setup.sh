#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment in .venv, install the pinned requirements and the
# project itself (editable: `import sparse_asr` from any directory, code changes take effect at once).
# Idempotent: a second run only checks that everything is installed. .venv may be a symlink to a venv
# elsewhere (e.g. on a cluster's project file system).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
stamp=.venv/.requirements.sha256
want=$( (cat requirements.txt pyproject.toml; pwd -P) | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ] \
        || ! .venv/bin/python -c "import sparse_asr, sys; sys.exit(not sparse_asr.__file__.startswith(sys.argv[1]))" \
                "$(pwd -P)/" 2>/dev/null; then  # the editable install must point at THIS checkout
    .venv/bin/pip install --quiet --disable-pip-version-check -r requirements.txt
    .venv/bin/pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
    echo "$want" > "$stamp"
fi
