"""Fuzzer throughput and bite: examples/s on the reference engines (one engine reused across clean
scenarios, and a fresh engine per scenario), and time and examples to the first failure for each
planted seed bug (median of 5 seeds, no shrinking), in the `ci` profile.

    .venv/bin/python benchmarks/bench_fuzz.py [--seeds 5] [--examples 300] [--budget 60]

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
    import mlx.core  # noqa: F401  # imports are not the fuzzer's time
    import mlx_lm.generate  # noqa: F401

    from mlx_invariants.fuzz.runner import run_fuzz
    from mlx_invariants.fuzz.settings import FuzzSettings
    from mlx_invariants.fuzz.target import Target
    from mlx_invariants.mutants.copies import import_copy

    if task["kind"] == "throughput":
        result = run_fuzz(Target.reference(task["engine"]),
                          FuzzSettings(examples=task["examples"], budget_s=600, explicit=(), debug_run=False,
                                       reuse=task["reuse"]))
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--examples", type=int, default=300, help="cap per seed while hunting a planted bug")
    parser.add_argument("--budget", type=float, default=60.0, help="seconds per seed while hunting")
    parser.add_argument("--throughput-examples", type=int, default=300, help="examples per engine, reused")
    parser.add_argument("--fresh-examples", type=int, default=100, help="examples per engine, fresh each")
    parser.add_argument("--rounds", type=int, default=3, help="throughput rounds (modes alternate; median shown)")
    parser.add_argument("--only", nargs="*", default=None, help="planted bugs to hunt (default: all)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(json.loads(args.child))), flush=True)
        return
    import mlx.core as mx

    hunted = _hunted()

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
