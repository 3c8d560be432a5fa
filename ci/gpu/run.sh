#!/usr/bin/env bash
# The GPU evidence, on the lent NVIDIA machine, from a fresh checkout. Made in two device calls
# (MLX's CUDA wheel is larger than one call carries), after `bash ci/gpu/prepare.sh` here:
#   1. carry [".gpuA"]:         bash .gpuA/stage.sh
#   2. carry [".gpuB", ".whl"]: source .gpuB/activate.sh && bash ci/gpu/run.sh [STAGE ...]
# Stages: fuzz (both reference routes, `runner` profile), oracles (every fault kind, the liveness
# faults included, on the four in-process routes and the launched `invariants serve`, all at once,
# `--keep-going`: issue 25's "passes every new oracle on the GPU"), planted (tests/mutants/test_fuzz_kills.py),
# step (benchmarks/bench_decode_step.py: one decode step taken apart, in-process),
# bench (benchmarks/bench_engine.py --preset 0.5b: simple, batched and mlx_lm.server at c=1..32,
# the peer launched with its listen backlog raised, the unmodified one probed). Default: all four. A device command may run
# 10 minutes, so split them over calls on the warm machine if they do not fit together.
# Everything lands in $OUT (default fuzz-reports/gpu/), 8 files at most (what a device call
# returns); ci/gpu/report.py turns those folders into docs/gpu.md.
#
# Environment: FUZZ_BUDGET (s per route, default 120), FUZZ_JOBS (default 4); ORACLES_BUDGET (s for
# each of the five targets, run side by side; default 420: a finding's confirmation re-runs and shrinking come
# after the budget, and the launched server's re-runs each start a server, so 500 overran a 600 s device call); PLANTED_SHARDS
# (parallel pytest processes, default 4), PLANTED_TIMEOUT (s, default 540); BENCH_PRESET
# (default 0.5b), BENCH_PEER (1: also python -m mlx_lm.server, side by side; 0: skip it),
# BENCH_CONCURRENCY (default auto: 1,2,4,8,16,32 on a GPU), BENCH_SERIAL_MAX (serialized route only up
# to this c; default 0: every c), BENCH_REPEATS (rounds per concurrency, pooled; default 3),
# BENCH_MAX_TOKENS (default 128), BENCH_TIMEOUT (s, default 540); STEP_TIMEOUT (s, default 420),
# STEP_VARIANTS (bench_decode_step.py --variants; default: all of them).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
repo=$(pwd)
out=${OUT:-$repo/fuzz-reports/gpu}
mkdir -p "$out"
work=$(mktemp -d)
export PYTHONUNBUFFERED=1
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(fuzz planted step bench)

# -- set-up: wheels into /tmp/site (where activate.sh put MLX), the checkout itself on the path.
if ! python3 -c 'import hypothesis, libcst, starlette, uvicorn, httpx, pytest_timeout' 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || { echo "wheel install failed" >&2; exit 2; }
fi
# The package is not installed there: lay out mlx_invariants as the wheel does (docs/layers.md).
layout=/tmp/mlx-invariants-layout
rm -rf "$layout" && mkdir -p "$layout"
cp -r "$repo/invariants" "$layout/mlx_invariants"
ln -s "$repo/engine" "$layout/mlx_invariants/engine"
ln -s "$repo/fuzz" "$layout/mlx_invariants/fuzz"
export PYTHONPATH="$layout:$repo:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
python3 -c 'import mlx.core as mx, mlx_lm, mlx_invariants.engine, mlx_invariants.fuzz; print("mlx", mx.__version__, mx.default_device(), mx.device_info())' \
    || { echo "MLX or the project does not import; source .gpuB/activate.sh first" >&2; exit 2; }

# -- the device, as MLX and the driver report it (every stage's files name it too).
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv >>"$out/run.txt" 2>&1
python3 ci/metal_smoke.py --json "$out/device.json" >/dev/null

status=0
for stage in "${stages[@]}"; do
    start=$(date +%s)
    case $stage in
    fuzz)
        FUZZ_REPORTS="$work/fuzz-reports" FUZZ_BUDGET=${FUZZ_BUDGET:-120} FUZZ_JOBS=${FUZZ_JOBS:-4} \
            CI_PYTHON=python3 FUZZ_PROFILE=runner MLX_INVARIANTS_FUZZ_DB="$work/fuzz-db" \
            bash ci/fuzz_runner.sh simple batched >"$out/fuzz.log" 2>&1
        code=$?
        ;;
    oracles)
        inproc=cancel,abort,disconnect,cancel-twice,raise,worker-dies,worker-wedges,shutdown,cancel-in-call,restart
        budget=${ORACLES_BUDGET:-420}
        cap=$((budget + 120))  # each target is stopped here, so the stage always writes its log within the call
        pids=()
        for route in simple batched http-simple http-batched; do
            faults=()
            [[ $route == http-* ]] || faults=(--faults "$inproc")
            timeout "$cap" python3 -m mlx_invariants fuzz --engine "$route" --profile runner --budget "$budget" --keep-going \
                ${faults[@]+"${faults[@]}"} --report "$work/oracles/$route" >"$work/oracles-$route.log" 2>&1 &
            pids+=($!)
        done
        # The launched server's own stall watch at 10 s: a first use of a sampling path on CUDA (logprobs, top_p)
        # compiles kernels for about 6.7 s, and at 3 s the server called itself stalled twice in two runs.
        timeout "$cap" python3 -m mlx_invariants fuzz --server-cmd "python3 -m mlx_invariants serve --engine batched --port {port} --stall-timeout 10" \
            --model mlx-invariants-tiny --health /health --faults cancel,disconnect,worker-dies,worker-wedges --profile runner \
            --budget "$budget" --keep-going --report "$work/oracles/served" >"$work/oracles-served.log" 2>&1 &
        pids+=($!)
        code=0
        for pid in "${pids[@]}"; do
            wait "$pid" || code=1
        done
        for log in "$work"/oracles-*.log; do
            echo "== $(basename "$log" .log)"; grep -v "job(s) failing" "$log" | tail -n 40
        done >"$out/oracles.log"
        ;;
    planted)
        # The catalogue's fuzz kills are independent tests: shards in parallel processes, one junit file merged.
        # The package is laid out on PYTHONPATH, not installed, so load the plugin by module unless installed.
        plugin=(-p mlx_invariants.fuzz.pytest_plugin)
        python3 -c 'import importlib.metadata as m, sys
sys.exit(not any(e.name == "mlx_invariants" for e in m.entry_points(group="pytest11")))' && plugin=()
        python3 -m pytest ${plugin[@]+"${plugin[@]}"} -p no:cacheprovider -o addopts= --collect-only -q \
            tests/mutants/test_fuzz_kills.py 2>/dev/null | grep '::' >"$work/planted-ids.txt"
        shards=${PLANTED_SHARDS:-4}
        pids=()
        for ((i = 0; i < shards; i++)); do
            awk -v n="$shards" -v i="$i" 'NR % n == i' "$work/planted-ids.txt" >"$work/shard-$i.txt"
            mapfile -t ids <"$work/shard-$i.txt"
            [ ${#ids[@]} -gt 0 ] || continue
            timeout "${PLANTED_TIMEOUT:-540}" python3 -m pytest ${plugin[@]+"${plugin[@]}"} -p no:cacheprovider \
                -o addopts= -v --durations=0 --junitxml="$work/planted-$i.xml" "${ids[@]}" \
                >"$work/planted-$i.log" 2>&1 &
            pids+=($!)
        done
        code=0
        for pid in "${pids[@]}"; do
            wait "$pid" || code=1
        done
        cat "$work"/planted-*.log >"$out/planted.log"
        python3 ci/gpu/junit_merge.py "$out/planted.xml" "$work"/planted-*.xml
        ;;
    step)
        timeout "${STEP_TIMEOUT:-420}" python3 benchmarks/bench_decode_step.py --preset "${BENCH_PRESET:-0.5b}" \
            --variants "${STEP_VARIANTS-defaults,MLX_MAX_OPS_PER_BUFFER=64,MLX_MAX_OPS_PER_BUFFER=200,MLX_USE_CUDA_GRAPHS=0}" \
            --json "$out/step.json" >"$out/step.log" 2>&1
        code=$?
        ;;
    bench)
        mkdir -p "$work/bench-logs"
        peer=()
        [ "${BENCH_PEER:-1}" = 1 ] || peer=(--no-peer)
        timeout "${BENCH_TIMEOUT:-540}" python3 benchmarks/bench_engine.py --preset "${BENCH_PRESET:-0.5b}" \
            ${peer[@]+"${peer[@]}"} --concurrency "${BENCH_CONCURRENCY:-auto}" --serial-max "${BENCH_SERIAL_MAX:-0}" \
            --repeats "${BENCH_REPEATS:-3}" --max-tokens "${BENCH_MAX_TOKENS:-128}" \
            --json "$out/bench.json" --log-dir "$work/bench-logs" >"$out/bench.log" 2>&1
        code=$?
        ;;
    *)
        echo "unknown stage $stage: fuzz, oracles, planted, step or bench" >&2
        exit 2
        ;;
    esac
    echo "stage $stage: exit $code in $(( $(date +%s) - start ))s" | tee -a "$out/run.txt"
    [ "$code" -gt "$status" ] && status=$code
done
# Fuzz reports and server logs are folders of many files: one archive comes back.
tar -czf "$out/extra.tar.gz" -C "$work" . 2>/dev/null
rm -rf "$work"
exit "$status"
