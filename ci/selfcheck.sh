#!/usr/bin/env bash
# Static self-check: the checker on this project's own code, then the regression catalogue
# (each mutant of the reference engine must be killed by its named check).
# SARIF=PATH also writes the findings as SARIF for code scanning.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
paths=(engine fuzz invariants)
if [ -n "${SARIF:-}" ]; then
    # Findings do not fail this step; the plain run below decides.
    .venv/bin/invariants check --format sarif --output "$SARIF" --exit-zero "${paths[@]}"
fi
echo "== invariants check ${paths[*]}"
.venv/bin/invariants check "${paths[@]}"
echo "== invariants mutants"
.venv/bin/invariants mutants
