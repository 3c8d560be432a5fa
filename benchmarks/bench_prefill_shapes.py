"""What a prompt length never seen before costs the owner thread: exact against padded prefill.

A script, not a test. MLX's CUDA backend builds kernels, cuDNN attention graphs
and GEMM plans for every new prefill shape; the build blocks the owner thread,
so a request with a new prompt length stalls every running stream. The batched
route pads each prefill chunk to a power of two on CUDA (engine/prefill.py) and
warms every such length at startup. Three configurations, each in its own
process (MLX reads MLX_CUDA_USE_CUDNN_SDPA once):

- exact: prompt lengths as they come, what mlx-lm does;
- exact, MLX_CUDA_USE_CUDNN_SDPA=0: the other remedy, MLX's own attention kernels;
- padded: the batched route on CUDA, after its warmup.

Each measures prefill on lengths never seen before, then the same lengths again,
a PREFILL_STEP-token prompt, and `BatchGenerator` decode of BATCH sequences
through DECODE_TOKENS tokens, whose slowest steps show what decode itself still
stalls on (padding does not touch decode). On a CPU or Apple Silicon nothing is
built per shape; the rows differ only by padding's extra work.

    .venv/bin/python benchmarks/bench_prefill_shapes.py             # tiny model, CPU
    python benchmarks/bench_prefill_shapes.py --preset 0.5b         # on an NVIDIA GPU
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

NEW_LENGTHS = (19, 37, 58, 83, 121, 170)
DECODE_TOKENS = 600
BATCH = 4
CONFIGS = {  # name: (pad, MLX_CUDA_USE_CUDNN_SDPA)
    "exact": (False, "1"),
    "exact, cuDNN SDPA off": (False, "0"),
    "padded": (True, "1"),
}


def measure(model_path: str, pad: bool) -> dict:
    """One configuration's numbers, in this process."""
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.sample_utils import make_sampler

    from mlx_invariants.engine.prefill import PREFILL_STEP, prefill, warmup_lengths

    model, _ = load(model_path)
    greedy = make_sampler(temp=0.0)
    stream = mx.new_stream(mx.default_device())

    def prompt(n: int, salt: int) -> list[int]:
        return [5 + (k * 7 + salt) % 400 for k in range(n)]

    def timed_prefill(n: int, salt: int) -> float:
        start = time.perf_counter()
        prefill(model, prompt(n, salt), greedy, stream, pad=pad)
        return (time.perf_counter() - start) * 1000

    for n in [4] + (warmup_lengths() if pad else []):  # the batched route's warmup prefills for this config
        timed_prefill(n, 0)
    new = [timed_prefill(n, 1) for n in NEW_LENGTHS]
    seen = [timed_prefill(n, 2) for n in NEW_LENGTHS]
    timed_prefill(PREFILL_STEP, 3)
    long = statistics.median(timed_prefill(PREFILL_STEP, 4 + k) for k in range(3))

    generator = BatchGenerator(model, stop_tokens=[], stream=stream)
    generator.insert([prompt(8, 9 + k) for k in range(BATCH)], max_tokens=[DECODE_TOKENS] * BATCH)
    steps, finished = [], 0
    while finished < BATCH:
        start = time.perf_counter()
        _, generated = generator.next()
        steps.append((time.perf_counter() - start) * 1000)
        finished += sum(1 for r in generated if r.finish_reason is not None)
    generator.close()
    decode = steps[3:]  # the prompts' own next() calls are not decode steps
    return {"new_ms": statistics.median(new), "new_max_ms": max(new), "seen_ms": statistics.median(seen),
            "long_ms": long, "step_ms": statistics.median(decode), "step_max_ms": max(decode),
            "stalls": sum(1 for s in decode if s > 5 * statistics.median(decode))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny", help="embedded model preset: tiny (CPU) or 0.5b (GPU)")
    parser.add_argument("--model", metavar="PATH", help="a local mlx-lm folder (overrides --preset)")
    parser.add_argument("--one", choices=CONFIGS, help=argparse.SUPPRESS)  # a child: measure, print JSON
    args = parser.parse_args()

    from mlx_invariants.engine.model import tiny_model_path

    model_path = args.model or str(tiny_model_path(args.preset))
    if args.one:
        print(json.dumps(measure(model_path, CONFIGS[args.one][0])))
        return 0

    import mlx.core as mx

    rows = {}
    for name, (_, cudnn) in CONFIGS.items():
        child = subprocess.run([sys.executable, __file__, "--model", model_path, "--one", name], capture_output=True,
                               text=True, env=os.environ | {"MLX_CUDA_USE_CUDNN_SDPA": cudnn}, check=True)
        rows[name] = json.loads(child.stdout.strip().splitlines()[-1])

    print(f"model: {model_path}; new prompt lengths {', '.join(map(str, NEW_LENGTHS))} (median, max); "
          f"decode: batch {BATCH}, {DECODE_TOKENS} tokens")
    print(f"machine: {platform.system()} {platform.machine()}, MLX {mx.__version__} {mx.default_device()}\n")
    print("| prefill | new length ms | max | seen length ms | 2048 tokens ms | decode step ms | slowest step ms | "
          "steps > 5x median |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in rows.items():
        print(f"| {name} | {r['new_ms']:.1f} | {r['new_max_ms']:.1f} | {r['seen_ms']:.1f} | {r['long_ms']:.1f} | "
              f"{r['step_ms']:.2f} | {r['step_max_ms']:.1f} | {r['stalls']} |")
    exact = rows["exact"]
    for name in list(CONFIGS)[1:]:
        r = rows[name]
        print(f"\n{name} / exact: new length {r['new_ms'] / exact['new_ms']:.2f}x, seen length "
              f"{r['seen_ms'] / exact['seen_ms']:.2f}x, 2048 tokens {r['long_ms'] / exact['long_ms']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
