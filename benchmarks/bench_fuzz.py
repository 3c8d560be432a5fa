"""Fuzzer throughput and bite: examples/s on the reference engines (one engine reused across clean
scenarios, and a fresh engine per scenario), and time and examples to the first failure for each
planted seed bug (median of 5 seeds, no shrinking), in the `ci` profile. `--observation` measures
only what the drop-in observation (fuzz/observe.py: locks, work handed to threads, cancellation) costs:
examples/s with it and without it (`MLX_INVARIANTS_OBSERVE=0`), rounds interleaved. `--shapes` measures
what the profile's schedule shapes cost (more requests than capacity, rare long prompts and budgets):
examples/s with them and with the earlier shapes (at most 3 requests, 12 words, 10 tokens), interleaved.

    .venv/bin/python benchmarks/bench_fuzz.py [--seeds 5] [--examples 300] [--budget 60]
    .venv/bin/python benchmarks/bench_fuzz.py --observation [--rounds 3] [--throughput-examples 300]
    .venv/bin/python benchmarks/bench_fuzz.py --shapes [--rounds 3] [--throughput-examples 300]

Not a test: it prints markdown tables for docs/fuzz.md. Every measurement runs in a fresh process
(imports warmed first): MLX keeps an OS thread for every thread that ever ran MLX work, and each one
slows every later MLX call in the process, so measurements in one process would slow each other down.
"in MLX" is the share of the wall time the engine's owner spent inside MLX entry points (the sentinel's
spans): the part no fuzzer change removes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _child(task: dict[str, Any]) -> dict[str, Any]:
    """One measurement, in this (fresh) process."""
    from mlx_invariants.fuzz.sentinel import OBSERVE_ENV

    os.environ[OBSERVE_ENV] = "1" if task.get("observe", True) else "0"
    import mlx.core  # noqa: F401  # imports are not the fuzzer's time
    import mlx_lm.generate  # noqa: F401

    from mlx_invariants.fuzz.runner import run_fuzz
    from mlx_invariants.fuzz.settings import FuzzSettings
    from mlx_invariants.fuzz.target import Target
    from mlx_invariants.mutants.copies import import_copy

    if task["kind"] == "throughput":
        from mlx_invariants.fuzz.strategies import scenarios

        short = scenarios() if task.get("shapes") == "short" else None  # None: the profile's shapes
        result = run_fuzz(_throughput_target(task["engine"]),
                          FuzzSettings(examples=task["examples"], budget_s=600, explicit=(), debug_run=False,
                                       reuse=task["reuse"]), strategy=short)
        assert result.ok, result.failure and result.failure.headline
        return {"examples": result.examples, "elapsed_s": result.elapsed_s, "engines": result.engines_started,
                "mlx_s": result.mlx_s}
    mutant = _hunted()[task["plant"]]
    target = Target.reference(mutant.routes[0], package=import_copy(mutant, Path(task["root"])))
    result = run_fuzz(target, FuzzSettings(examples=task["examples"], budget_s=task["budget"], seed=task["seed"],
                                           explicit=(), replays=0, shrink=False, debug_run=False))
    if result.failure is None or result.failure.violations[0].kind not in mutant.finds:
        return {"s": None, "examples": None}
    return {"s": result.first_failure_s, "examples": result.first_failure_examples}


def _throughput_target(engine: str) -> Any:
    """A reference route, or "toy": the fixed toy third-party engine of tests/fuzz, which marks nothing, so
    every lock, job and cancel of it is observed (the observation's worst case per example)."""
    from mlx_invariants.fuzz.target import Target

    if engine != "toy":
        return Target.reference(engine)
    from tests.fuzz.toy_adapter import target

    return target("make_drain", ("cancel", "disconnect", "cancel-twice"))


def _hunted() -> dict[str, Any]:
    """The planted bugs: the catalogue's mutants the fuzzer must kill, by their seed scenario's name."""
    from mlx_invariants.mutants.catalogue import CATALOGUE

    return {m.seed: m for m in CATALOGUE if m.seed}


def measure(task: dict[str, Any]) -> dict[str, Any]:
    run = subprocess.run([sys.executable, __file__, "--child", json.dumps(task)], cwd=ROOT, capture_output=True,
                         text=True, timeout=900)
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"measurement {task} failed:\n{run.stderr[-3000:]}")
    return json.loads(lines[-1])


def observation_table(rounds: int, examples: int) -> None:
    """Examples/s on each reference engine and the toy engine (reused, `ci` profile) with and without the
    drop-in observation; the two alternate round by round, so both see the same background load."""
    print("| engine | examples | with observation: median examples/s (each round) | without | cost |")
    print("|---|---|---|---|---|")
    for engine in ("simple", "batched", "toy"):
        rates: dict[bool, list[float]] = {True: [], False: []}
        for round_ in range(rounds):
            for observe in ((True, False) if round_ % 2 == 0 else (False, True)):
                done = measure({"kind": "throughput", "engine": engine, "examples": examples, "reuse": True,
                                "observe": observe})
                rates[observe].append(done["examples"] / done["elapsed_s"])
        on, off = statistics.median(rates[True]), statistics.median(rates[False])
        print(f"| {engine} | {examples} | {on:.1f} ({', '.join(f'{r:.1f}' for r in rates[True])}) | "
              f"{off:.1f} ({', '.join(f'{r:.1f}' for r in rates[False])}) | {100 * (off - on) / off:+.0f}% |",
              flush=True)


def shapes_table(rounds: int, examples: int) -> None:
    """Examples/s on each reference engine (reused, `ci` profile) with the profile's schedule shapes and with
    the earlier short ones; the two alternate round by round, so both see the same background load."""
    print("| engine | examples | profile shapes: median examples/s (each round) | earlier short shapes | cost |")
    print("|---|---|---|---|---|")
    for engine in ("simple", "batched"):
        rates: dict[str, list[float]] = {"profile": [], "short": []}
        for round_ in range(rounds):
            for shapes in (("profile", "short") if round_ % 2 == 0 else ("short", "profile")):
                done = measure({"kind": "throughput", "engine": engine, "examples": examples, "reuse": True,
                                "shapes": shapes})
                rates[shapes].append(done["examples"] / done["elapsed_s"])
        new, old = statistics.median(rates["profile"]), statistics.median(rates["short"])
        print(f"| {engine} | {examples} | {new:.1f} ({', '.join(f'{r:.1f}' for r in rates['profile'])}) | "
              f"{old:.1f} ({', '.join(f'{r:.1f}' for r in rates['short'])}) | {100 * (old - new) / old:+.0f}% |",
              flush=True)


def observed_operations(repeats: int = 2000) -> None:
    """Microseconds per observed operation, without and with the observation (median of 5 rounds of
    `repeats`, in this process): what each lock, job and cancel of an engine costs on top."""
    import asyncio
    import threading
    import time

    from mlx_invariants.fuzz.sentinel import Sentinel

    async def lock_round() -> None:
        lock = asyncio.Lock()
        for _ in range(repeats):
            async with lock:
                pass

    async def to_thread_round() -> None:
        for _ in range(repeats // 10):
            await asyncio.to_thread(int)

    async def cancel_round() -> None:
        for _ in range(repeats // 10):
            task = asyncio.ensure_future(asyncio.sleep(1))
            await asyncio.sleep(0)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def thread_lock_round() -> None:
        lock = threading.Lock()
        for _ in range(repeats):
            with lock:
                pass

    operations = {"asyncio.Lock acquire + release": (lambda: asyncio.run(lock_round()), repeats),
                  "threading.Lock acquire + release": (thread_lock_round, repeats),
                  "asyncio.to_thread job": (lambda: asyncio.run(to_thread_round()), repeats // 10),
                  "task created, cancelled, ended": (lambda: asyncio.run(cancel_round()), repeats // 10)}
    print("| operation | without (us) | with observation (us) |")
    print("|---|---|---|")
    for name, (run, count) in operations.items():
        timings: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(5):
            for observe in (False, True):
                with Sentinel(observe=observe):
                    start = time.perf_counter()
                    run()
                    timings[observe].append((time.perf_counter() - start) / count * 1e6)
        print(f"| {name} | {statistics.median(timings[False]):.1f} | {statistics.median(timings[True]):.1f} |",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--examples", type=int, default=300, help="cap per seed while hunting a planted bug")
    parser.add_argument("--budget", type=float, default=60.0, help="seconds per seed while hunting")
    parser.add_argument("--throughput-examples", type=int, default=300, help="examples per engine, reused")
    parser.add_argument("--fresh-examples", type=int, default=100, help="examples per engine, fresh each")
    parser.add_argument("--rounds", type=int, default=3, help="throughput rounds (modes alternate; median shown)")
    parser.add_argument("--only", nargs="*", default=None, help="planted bugs to hunt (default: all)")
    parser.add_argument("--observation", action="store_true",
                        help="only examples/s with and without the drop-in observation, side by side")
    parser.add_argument("--shapes", action="store_true",
                        help="only examples/s with the profile's schedule shapes and the earlier short ones")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(json.loads(args.child))), flush=True)
        return
    import mlx.core as mx

    hunted = _hunted()

    if args.observation:
        print(f"machine: {platform.platform()}, {os.cpu_count()} cores, MLX {mx.__version__} on "
              f"{mx.default_device()}, load average {os.getloadavg()[0]:.1f} at start\n")
        observation_table(args.rounds, args.throughput_examples)
        print()
        observed_operations()
        print(f"\nload average {os.getloadavg()[0]:.1f} at the end")
        return
    if args.shapes:
        print(f"machine: {platform.platform()}, {os.cpu_count()} cores, MLX {mx.__version__} on "
              f"{mx.default_device()}, load average {os.getloadavg()[0]:.1f} at start\n")
        shapes_table(args.rounds, args.throughput_examples)
        print(f"\nload average {os.getloadavg()[0]:.1f} at the end")
        return
    print(f"machine: {platform.platform()}, {os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
          f"MLX {mx.__version__} on {mx.default_device()}, load average {os.getloadavg()[0]:.1f} at start\n")
    print("| engine | engine per | examples | median examples/s (each round) | engines started | in MLX |")
    print("|---|---|---|---|---|---|")
    for engine in ("simple", "batched"):
        modes = ((True, args.throughput_examples), (False, args.fresh_examples))
        rounds: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
        for _ in range(args.rounds):  # alternate, so both modes see the same background load
            for reuse, count in modes:
                rounds[reuse].append(measure({"kind": "throughput", "engine": engine, "examples": count,
                                              "reuse": reuse}))
        for reuse, count in modes:
            results = sorted(rounds[reuse], key=lambda r: r["examples"] / r["elapsed_s"])
            rates = [r["examples"] / r["elapsed_s"] for r in rounds[reuse]]
            middle = results[len(results) // 2]
            print(f"| {engine} | {'run (reused)' if reuse else 'scenario'} | {count} | "
                  f"{statistics.median(rates):.1f} ({', '.join(f'{rate:.1f}' for rate in rates)}) | "
                  f"{middle['engines']} | {100 * middle['mlx_s'] / middle['elapsed_s']:.0f}% |", flush=True)
    root = tempfile.mkdtemp(prefix="bench-plants-")
    print("\n| planted bug | engine | found | median s to first failure | median examples | per seed (s/examples) |")
    print("|---|---|---|---|---|---|")
    for name in args.only or sorted(hunted):
        runs = [measure({"kind": "hunt", "plant": name, "root": root, "seed": seed, "examples": args.examples,
                         "budget": args.budget}) for seed in range(1, args.seeds + 1)]
        found = [r for r in runs if r["s"] is not None]
        per_seed = ", ".join("miss" if r["s"] is None else f"{r['s']:.1f}/{r['examples']}" for r in runs)
        if found:
            median_s = statistics.median(r["s"] for r in found)
            median_n = statistics.median(r["examples"] for r in found)
            print(f"| {name} | {hunted[name].routes[0]} | {len(found)}/{len(runs)} | {median_s:.1f} | {median_n:g} "
                  f"| {per_seed} |", flush=True)
        else:
            print(f"| {name} | {hunted[name].routes[0]} | 0/{len(runs)} | - | - | {per_seed} |", flush=True)
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
