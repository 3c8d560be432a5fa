#!/usr/bin/env bash
# The test suite, exactly as CI runs it: set-up, static self-check, then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
.venv/bin/invariants check engine fuzz invariants
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
