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
# redis-server, for the shared example database test (tests/fuzz/test_database.py), on CI's Debian machines
# only and never failing the set-up: without it (no apt, no root, no network) that test skips and says why.
if [ "${CI:-}" = true ] && ! command -v redis-server >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    as_root=()
    if [ "$(id -u)" -ne 0 ]; then as_root=(sudo -n); fi
    if ! { "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server \
           || { "${as_root[@]}" apt-get update -q && "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
                apt-get install -y -q redis-server; }; } >.venv/apt-redis.log 2>&1; then
        echo "ci/setup.sh: could not install redis-server (.venv/apt-redis.log); the Redis database test will skip" >&2
    fi
fi
