#!/usr/bin/env bash
# The main job: the harness against the reference engine on the embedded tiny model.
# Static tripwires on the engine, then the cancellation fuzzer (ci profile) on both routes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
echo "== invariants check engine/"
.venv/bin/invariants check engine
for route in simple batched; do
    echo "== invariants fuzz --engine $route --profile ci"
    .venv/bin/invariants fuzz --engine "$route" --profile ci --report fuzz-reports/"$route"
done
