"""Where one decode step's time goes: the batched route's step against the serialized one, in-process.

A script, not a test. It loads the model on this thread and measures, with no
HTTP in the way:

- steady-state step time (pipelined, as the engines run it) of the serialized
  route (`mlx_lm.generate_step`: `KVCache`, no mask), and of `BatchGenerator`
  at batch 1, 2, 8 and 32, with mlx-lm's `BatchKVCache` ("array mask": what
  the batched route ran before) and with the engine's host-padded cache
  (`engine/kv_cache.py`: no mask when no row is padded), rows unpadded (equal
  prompt lengths) and padded (different lengths);
- one step taken apart, unpipelined: Python building the graph (the model
  call, log-softmax and sampling, no evaluation), `mx.async_eval` (MLX walks
  the graph and encodes every kernel on this thread), the wait for the device,
  and `tolist()`; plus the number of primitives in the step's graph (each one
  at least one kernel launch; views excluded), from `mx.export_to_dot`;
- each engine route in-process, no HTTP: a lone 128-token request's median
  gap between tokens as the event loop receives them, against the step alone
  (what the owner loop and the hand-off to the loop add);
- variants tried: each layer's MLP under `mx.compile`; and, each in a process of
  its own (MLX reads them once), the CUDA backend's settings for how many
  kernels one CUDA graph holds (`MLX_MAX_OPS_PER_BUFFER`, default 20) and
  whether it builds CUDA graphs at all (`MLX_USE_CUDA_GRAPHS`).

Also the memory-bandwidth floor: the model's parameter bytes over the device's
peak bandwidth (known for H100/H200, else `--bandwidth-gbs`).

    .venv/bin/python benchmarks/bench_decode_step.py               # tiny model, CPU
    python benchmarks/bench_decode_step.py --preset 0.5b --json step.json
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VIEWS = {"Reshape", "Slice", "Squeeze", "ExpandDims", "Transpose", "Broadcast", "AsStrided", "Split"}
PEAK_GBS = {"H100": 3350.0, "H200": 4800.0}  # HBM3 (SXM) and HBM3e peak, GB/s
STEPS = 64
WARM = 8
ENV_VARIANTS = {  # name: environment, each measured in a fresh process
    "defaults": {},
    "MLX_MAX_OPS_PER_BUFFER=64": {"MLX_MAX_OPS_PER_BUFFER": "64"},
    "MLX_MAX_OPS_PER_BUFFER=200": {"MLX_MAX_OPS_PER_BUFFER": "200"},
    "MLX_USE_CUDA_GRAPHS=0": {"MLX_USE_CUDA_GRAPHS": "0"},
}


def peak_bandwidth_gbs(device_name: str, given: Optional[float]) -> Optional[float]:
    if given:
        return given
    return next((gbs for key, gbs in PEAK_GBS.items() if key in device_name), None)


def parameter_bytes(model: Any) -> int:
    from mlx.utils import tree_flatten

    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))


def prompt(n: int, salt: int) -> list[int]:
    return [5 + (k * 7 + salt) % 400 for k in range(n)]


def primed(model: Any, lengths: list[int], plain: bool, stream: Any) -> list[Any]:
    """One prefilled cache per length (the engine's prefill); `plain` turns them into mlx-lm's own KVCache."""
    from mlx_lm.models.cache import KVCache
    from mlx_lm.sample_utils import make_sampler

    from mlx_invariants.engine.prefill import prefill

    firsts = [prefill(model, prompt(n, 3 + i), make_sampler(temp=0.0), stream) for i, n in enumerate(lengths)]
    if plain:
        for first in firsts:
            for c in first.cache:
                c.__class__ = KVCache
    return firsts


def batch_step_ms(model: Any, lengths: list[int], plain: bool, stream: Any) -> dict[str, Any]:
    """Steady-state `BatchGenerator.next()` time with these prompt lengths decoding together."""
    from mlx_lm.generate import BatchGenerator

    firsts = primed(model, lengths, plain, stream)
    gen = BatchGenerator(model, stop_tokens=[], completion_batch_size=len(lengths),
                         prefill_batch_size=len(lengths), stream=stream)
    gen.insert([[f.token] for f in firsts], max_tokens=[10 ** 6] * len(lengths),
               caches=[f.cache for f in firsts])
    for _ in range(WARM):
        gen.next()
    cache = gen._generation_batch.prompt_cache[0]
    masked = cache.make_mask(1) is not None
    times = []
    for _ in range(STEPS):
        start = time.perf_counter()
        gen.next()
        times.append((time.perf_counter() - start) * 1000)
    gen.close()
    return {"ms": statistics.median(times), "mean_ms": statistics.fmean(times), "array_mask": masked}


def serial_step_ms(model: Any) -> float:
    """Steady-state token time of `generate_step` (the serialized route's loop)."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    times, last = [], None
    for i, _ in enumerate(generate_step(mx.array(prompt(24, 1)), model, max_tokens=WARM + STEPS)):
        now = time.perf_counter()
        if i >= WARM and last is not None:
            times.append((now - last) * 1000)
        last = now
    return statistics.median(times)


def count_primitives(*outputs: Any) -> dict[str, int]:
    import mlx.core as mx

    dot = io.StringIO()
    mx.export_to_dot(dot, *outputs)
    counts: dict[str, int] = {}
    for line in dot.getvalue().splitlines():
        if "[label =" in line and "shape=rectangle" in line:
            name = line.split('label ="', 1)[1].split('"', 1)[0]
            counts[name] = counts.get(name, 0) + 1
    return counts


def step_parts(model: Any, lengths: list[int], plain: bool, stream: Any, merge: bool = True) -> dict[str, Any]:
    """One decode step at a time, unpipelined: graph building, encoding, waiting, reading back.

    `merge`: the rows' caches merged into one batch cache, as `BatchGenerator` does; without, the
    single row's own `KVCache`, as the serialized route decodes."""
    import mlx.core as mx
    from mlx_lm.generate import _merge_caches

    firsts = primed(model, lengths, plain, stream)
    cache = _merge_caches([f.cache for f in firsts]) if merge else firsts[0].cache
    tokens = mx.array([f.token for f in firsts])
    parts: dict[str, list[float]] = {"build": [], "encode": [], "wait": [], "read": []}
    counts: dict[str, int] = {}
    with mx.stream(stream):
        for i in range(WARM + 16):
            t0 = time.perf_counter()
            logits = model(tokens[:, None], cache=cache)[:, -1, :]
            logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            nxt = mx.argmax(logprobs, axis=-1)
            t1 = time.perf_counter()
            if i == WARM:  # a steady-state step: the first one also holds the caches' merge
                counts = count_primitives(nxt, logprobs)
                t1 = time.perf_counter()
            mx.async_eval(nxt, logprobs)
            t2 = time.perf_counter()
            mx.eval(nxt)
            t3 = time.perf_counter()
            nxt.tolist()
            t4 = time.perf_counter()
            tokens = nxt
            if i >= WARM:
                for key, ms in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                    parts[key].append(ms * 1000)
    kernels = sum(n for name, n in counts.items() if name not in VIEWS)
    return {**{k + "_ms": statistics.median(v) for k, v in parts.items()},
            "primitives": kernels, "by_primitive": dict(sorted(counts.items(), key=lambda kv: -kv[1]))}


def compile_mlps(model: Any) -> Callable[[], None]:
    """Every layer's MLP under `mx.compile`; returns the undo."""
    import mlx.core as mx

    layers = model.model.layers if hasattr(model, "model") else model.layers
    saved = [layer.mlp for layer in layers]
    for layer, mlp in zip(layers, saved):
        layer.mlp = mx.compile(mlp)

    def undo() -> None:
        for layer, mlp in zip(layers, saved):
            layer.mlp = mlp
    return undo


def engine_token_gaps(path: str, tokens: int = 128) -> dict[str, float]:
    """Each route started in this process; one greedy request's median inter-token gap on the loop, ms."""
    import asyncio

    from mlx_invariants.engine import ENGINES, EngineConfig, Pending, SamplingParams

    async def one(name: str) -> float:
        engine = ENGINES[name](EngineConfig(model=path))
        await engine.start()
        try:
            gaps = []
            for k in range(2):  # the first request pays whatever warmup missed
                stream = await engine.submit(Pending(f"{name}-{k}", tuple(prompt(24, 7 + k)),
                                                     SamplingParams(max_tokens=tokens)))
                arrivals = []
                try:
                    async for _ in stream:
                        arrivals.append(time.perf_counter())
                finally:
                    await stream.aclose()
                gaps = [(b - a) * 1000 for a, b in zip(arrivals[4:], arrivals[5:])]
            return statistics.median(gaps)
        finally:
            await engine.shutdown(grace_s=5.0)

    return {name: asyncio.run(one(name)) for name in ("simple", "batched")}


def quick(model: Any, stream: Any) -> dict[str, Any]:
    """What an environment variant is judged on: step times at batch 1, 2 and 8, one step's parts."""
    out: dict[str, Any] = {"serial_ms": serial_step_ms(model)}
    for b in (1, 2, 8):
        out[f"batch {b} unpadded"] = batch_step_ms(model, [24] * b, False, stream)["ms"]
    out["batch 2 padded"] = batch_step_ms(model, [24, 29], False, stream)["ms"]
    for b in (1, 2):
        parts = step_parts(model, [24] * b, False, stream)
        out[f"parts batch {b}"] = {k: v for k, v in parts.items() if k != "by_primitive"}
    return out


def in_fresh_process(path: str, mode: str, env: dict[str, str]) -> dict[str, Any]:
    """This script's `mode` (--quick or --engine-gaps) in a new process: MLX reads its settings once a process.

    The environment is this one's without the variants' variables, plus `env`.
    """
    import os
    import subprocess
    import tempfile

    base = {k: v for k, v in os.environ.items() if not any(k in e for e in ENV_VARIANTS.values())}
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        proc = subprocess.run([sys.executable, __file__, "--model", path, mode, "--json", f.name],
                              env=base | env, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            return {"error": proc.stderr[-500:]}
        return json.loads(Path(f.name).read_text())


def env_variants(path: str, names: list[str]) -> dict[str, Any]:
    """`quick` in a fresh process per environment variant."""
    results = {}
    for name in names:
        results[name] = in_fresh_process(path, "--quick", ENV_VARIANTS[name])
        print(name, json.dumps(results[name]), flush=True)
    return results


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="tiny")
    p.add_argument("--model", metavar="PATH")
    p.add_argument("--batches", default="1,2,8,32")
    p.add_argument("--bandwidth-gbs", type=float, help="the device's peak memory bandwidth (default: known H100/H200)")
    p.add_argument("--json", metavar="OUT")
    p.add_argument("--variants", default="", help=f"environment variants to run too, comma-separated: {', '.join(ENV_VARIANTS)}")
    p.add_argument("--quick", action="store_true", help="only what an environment variant is judged on")
    p.add_argument("--engine-gaps", action="store_true", help="only the in-process engines' inter-token gaps")
    args = p.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(ENV_VARIANTS))
    if unknown:
        p.error(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(ENV_VARIANTS)}")
    import mlx.core as mx
    from mlx_lm import load

    from mlx_invariants.engine.model import tiny_model_path

    path = args.model or str(tiny_model_path(args.preset))
    if args.engine_gaps:  # a process of its own: the engines load their own model on their owner threads
        Path(args.json).write_text(json.dumps(engine_token_gaps(path)))
        return 0
    model, _ = load(path)
    mx.eval(model.parameters())
    stream = mx.new_stream(mx.default_device())
    if args.quick:
        Path(args.json).write_text(json.dumps(quick(model, stream)))
        return 0
    info = mx.device_info()
    name = str(info.get("device_name", ""))
    nbytes = parameter_bytes(model)
    gbs = peak_bandwidth_gbs(name, args.bandwidth_gbs)
    floor_ms = nbytes / (gbs * 1e9) * 1000 if gbs else None
    out: dict[str, Any] = {"model": path, "device": name, "mlx": mx.__version__, "default_device": str(mx.default_device()),
                           "parameter_bytes": nbytes, "peak_gbs": gbs, "bandwidth_floor_ms": floor_ms}
    print(f"{path}: {nbytes / 1e6:.1f} MB of parameters; {name}; floor {floor_ms} ms/step", flush=True)

    out["serial_ms"] = serial_step_ms(model)
    print(f"serialized step {out['serial_ms']:.2f} ms", flush=True)
    batches = [int(b) for b in args.batches.split(",")]
    rows = []
    for b in batches:
        even, uneven = [24] * b, [24 + 5 * (i % 4) for i in range(b)]
        row = {"batch": b,
               "array_mask_unpadded": batch_step_ms(model, even, True, stream),
               "host_padded_unpadded": batch_step_ms(model, even, False, stream)}
        if b > 1:
            row["host_padded_padded"] = batch_step_ms(model, uneven, False, stream)
        rows.append(row)
        print(json.dumps(row), flush=True)
    out["steps"] = rows
    out["parts"] = {}
    for label, plain in (("before: BatchKVCache, array mask", True), ("after: host-padded, no mask", False)):
        for b in (1, 8):
            key = f"{label}, batch {b}"
            out["parts"][key] = step_parts(model, [24] * b, plain, stream)
            print(key, json.dumps({k: v for k, v in out["parts"][key].items() if k != "by_primitive"}), flush=True)
    out["parts"]["serialized: KVCache, batch 1"] = step_parts(model, [24], True, stream, merge=False)
    undo = compile_mlps(model)
    try:
        out["tried"] = {f"mx.compile of every MLP, batch {b}": batch_step_ms(model, [24] * b, False, stream)
                        for b in (1, 8)}
    finally:
        undo()
    print(json.dumps(out["tried"]), flush=True)
    out["engine_gap_ms"] = in_fresh_process(path, "--engine-gaps", {})
    print("in-process engine, median inter-token gap ms", json.dumps(out["engine_gap_ms"]), flush=True)
    out["env_variants"] = env_variants(path, variants)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
