"""Time to a new request's first token: the batched route's own prefill against `BatchGenerator`'s.

A script, not a test. In one process, on one model and one generation stream, it
times the two ways a request can get its first token:

- **own prefill** (`engine/prefill.py`, what the batched route does): the whole
  prompt through a fresh cache, one sample;
- **BatchGenerator**: `insert` the prompt and call `next()` until its first token
  comes back (three calls in mlx-lm 0.32), then `remove` it.

Each path gets prompt lengths the other never sees (on a GPU the first use of a
length costs extra), first on a new length, then the same lengths again.

    .venv/bin/python benchmarks/bench_first_token.py                 # tiny model, CPU
    python benchmarks/bench_first_token.py --preset 0.5b             # on a GPU
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LENGTHS = (33, 47, 58, 71, 90)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny", help="embedded model preset: tiny (CPU) or 0.5b (GPU)")
    parser.add_argument("--model", metavar="PATH", help="a local mlx-lm folder (overrides --preset)")
    args = parser.parse_args()

    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.sample_utils import make_sampler

    from mlx_invariants.engine.model import tiny_model_path
    from mlx_invariants.engine.prefill import prefill

    model, tokenizer = load(args.model or str(tiny_model_path(args.preset)))
    generator = BatchGenerator(model, stop_tokens=[[t] for t in tokenizer.eos_token_ids])
    greedy = make_sampler(temp=0.0)

    def prompt(n: int) -> list[int]:
        return [5 + k % 400 for k in range(n)]

    def own(n: int) -> float:
        start = time.perf_counter()
        prefill(model, prompt(n), greedy, generator.stream)
        return time.perf_counter() - start

    def native(n: int) -> tuple[float, int]:
        start, calls = time.perf_counter(), 0
        [uid] = generator.insert([prompt(n)], max_tokens=[1])
        try:
            while True:
                calls += 1
                _, generated = generator.next()
                if any(r.uid == uid for r in generated):
                    return time.perf_counter() - start, calls
        finally:
            generator.remove([uid])

    own(4)
    native(4)  # each path's first-use work, before anything is timed
    rows = []
    for label in ("new length", "seen length"):
        own_ms = [own(n) * 1000 for n in LENGTHS]
        native_runs = [native(n + 2) for n in LENGTHS]  # it forwards n + 1 tokens first: a length own never ran
        native_ms = [t * 1000 for t, _ in native_runs]
        rows.append((label, statistics.median(own_ms), statistics.median(native_ms), native_runs[0][1]))

    print(f"model: {args.model or args.preset}; prompt lengths {', '.join(map(str, LENGTHS))} (BatchGenerator: +2); "
          f"median over them")
    print(f"machine: {platform.system()} {platform.machine()}, MLX {mx.__version__} {mx.default_device()}\n")
    print("| prompt | own prefill ms | BatchGenerator ms | next() calls | BatchGenerator / own |")
    print("|---|---:|---:|---:|---:|")
    for label, own_med, native_med, calls in rows:
        print(f"| {label} | {own_med:.1f} | {native_med:.1f} | {calls} | {native_med / own_med:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
