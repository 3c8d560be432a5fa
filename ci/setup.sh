#!/usr/bin/env bash
# Create (or reuse) .venv with the project and every extra the tests need. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
stamp=.venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)
if [ ! -f "$stamp" ]; then
    echo "setting up .venv (pip install -e '.[dev]') ..."
    log=.venv/install.log
    if ! { .venv/bin/python -m pip install --upgrade pip && .venv/bin/python -m pip install -e '.[dev]'; } >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        echo "ci/setup.sh: installing the project failed; the whole log is in $log" >&2
        exit 1
    fi
    rm -f .venv/.installed-* && touch "$stamp"
fi
