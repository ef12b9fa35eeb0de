#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment in .venv and install the pinned requirements.
# Idempotent: a second run only checks that everything is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
stamp=.venv/.requirements.sha256
want=$(sha256sum requirements.txt | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    .venv/bin/pip install --quiet --disable-pip-version-check -r requirements.txt
    echo "$want" > "$stamp"
fi
