#!/usr/bin/env bash
# The long fuzz run for accelerator runners (self-hosted Apple Silicon, the lent NVIDIA GPU)
# and the nightly job: record the device, then fuzz each route with the `runner` profile.
#
#   ci/fuzz_runner.sh [ROUTE ...]         routes default to: simple batched
#
# Environment:
#   FUZZ_BUDGET   seconds per route (default 600)
#   FUZZ_PROFILE  ci | runner (default runner)
#   FUZZ_REPORTS  report folder (default fuzz-reports); one sub-folder per route, device.json beside
#   FUZZ_JOBS     parallel processes per route (default: the fuzzer's own)
#   CI_PYTHON     an interpreter that already has the project and its fuzz extra; skips ci/setup.sh
#                 (the GPU machine has no package registry, see ci/gpu/run.sh)
# Exit: 0 no violation on any route, 1 a violation (reports written), 2 usage or internal error.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
if [ -n "${CI_PYTHON:-}" ]; then
    py=$CI_PYTHON
else
    bash ci/setup.sh || exit 2
    py=.venv/bin/python
fi
budget=${FUZZ_BUDGET:-600}
profile=${FUZZ_PROFILE:-runner}
reports=${FUZZ_REPORTS:-fuzz-reports}
routes=("$@")
[ ${#routes[@]} -gt 0 ] || routes=(simple batched)
jobs=()
[ -n "${FUZZ_JOBS:-}" ] && jobs=(--jobs "$FUZZ_JOBS")
mkdir -p "$reports"
# What the run really got (CPU, paravirtual Metal, Metal GPU, CUDA): never gates the run.
"$py" ci/metal_smoke.py --json "$reports/device.json" >/dev/null || true
echo "device: $("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["verdict"])' "$reports/device.json" 2>/dev/null || echo unknown)"
worst=0
for route in "${routes[@]}"; do
    echo "== invariants fuzz --engine $route --profile $profile --budget $budget ${jobs[*]+${jobs[*]}}"
    "$py" -m mlx_invariants fuzz --engine "$route" --profile "$profile" --budget "$budget" \
        ${jobs[@]+"${jobs[@]}"} --report "$reports/$route" 2>&1 | tee "$reports/$route.log"
    code=${PIPESTATUS[0]}
    echo "== $route: exit $code"
    [ "$code" -gt "$worst" ] && worst=$code
done
exit "$worst"
