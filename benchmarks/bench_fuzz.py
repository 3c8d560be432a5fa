"""Fuzzer throughput and bite: examples/s on the reference engines, and time and examples to the
first failure for each planted seed bug (median of 5 seeds, no shrinking), in the `ci` profile.

    .venv/bin/python benchmarks/bench_fuzz.py [--seeds 5] [--examples 300] [--budget 60]

Not a test: it prints a markdown table for docs/fuzz.md.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fuzz.adapters.reference import reference_engine  # noqa: E402
from fuzz.runner import run_fuzz  # noqa: E402
from tests.fuzz.planted import PLANTS, plant  # noqa: E402


def throughput(kind: str, examples: int) -> tuple[int, float]:
    result = run_fuzz(reference_engine(kind), profile="ci", examples=examples, budget=600, explicit=(),
                      debug_run=False)
    assert result.ok, result.failure and result.failure.headline
    return result.examples, result.elapsed_s


def first_failure(name: str, root: Path, seed: int, examples: int, budget: float) -> tuple[float | None, int | None]:
    spec = PLANTS[name]
    factory = reference_engine(spec.engine, package=plant(name, root))
    started = time.monotonic()
    result = run_fuzz(factory, profile="ci", examples=examples, budget=budget, seed=seed, explicit=(), replays=0,
                      shrink=False, debug_run=False)
    if result.failure is None or result.failure.violations[0].kind not in spec.finds:
        return None, None
    elapsed = result.first_failure_s if result.first_failure_s is not None else time.monotonic() - started
    return elapsed, result.first_failure_examples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--examples", type=int, default=300, help="cap per seed while hunting a planted bug")
    parser.add_argument("--budget", type=float, default=60.0, help="seconds per seed while hunting")
    parser.add_argument("--throughput-examples", type=int, default=100)
    parser.add_argument("--only", nargs="*", default=None, help="planted bugs to hunt (default: all)")
    args = parser.parse_args()
    import mlx.core as mx

    print(f"machine: {platform.platform()}, {platform.processor() or platform.machine()}, "
          f"MLX {mx.__version__} on {mx.default_device()}\n")
    print("| engine | examples | seconds | examples/s |\n|---|---|---|---|")
    for kind in ("simple", "batched"):
        count, seconds = throughput(kind, args.throughput_examples)
        print(f"| {kind} | {count} | {seconds:.1f} | {count / seconds:.1f} |", flush=True)
    root = Path(tempfile.mkdtemp(prefix="bench-plants-"))
    print(f"\n| planted bug | engine | found | median s to first failure | median examples | per seed (s/examples) |")
    print("|---|---|---|---|---|---|")
    for name in args.only or sorted(PLANTS):
        runs = [first_failure(name, root, seed, args.examples, args.budget) for seed in range(1, args.seeds + 1)]
        found = [r for r in runs if r[0] is not None]
        per_seed = ", ".join("miss" if s is None else f"{s:.1f}/{n}" for s, n in runs)
        if found:
            median_s = statistics.median(r[0] for r in found)
            median_n = statistics.median(r[1] for r in found)
            print(f"| {name} | {PLANTS[name].engine} | {len(found)}/{len(runs)} | {median_s:.1f} | {median_n:g} "
                  f"| {per_seed} |", flush=True)
        else:
            print(f"| {name} | {PLANTS[name].engine} | 0/{len(runs)} | - | - | {per_seed} |", flush=True)


if __name__ == "__main__":
    main()
