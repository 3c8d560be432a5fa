"""Time to first find: how long the fuzzer, by generation alone, takes to find each planted bug of the
regression catalogue (invariants/mutants/catalogue.py: every entry with a `fuzz:` killer), in the default
settings (the `ci` profile, what `invariants fuzz` runs when given nothing) and in the `runner` profile,
median over seeds.

Each run is `run_fuzz` on the reference route with the mutant applied, in a fresh process: no seed
scenarios (`explicit=()`, so nothing the catalogue's own examples already name), no confirmation replays
and no shrinking (the clock stops at the first violating example), a wall-clock budget per run. A bug
counts as found when the first violation is of a kind its entry names. Runs go side by side (`--jobs`),
each pinned to its own `--cores` CPU cores (`os.sched_setaffinity`), so a row says what a runner of that
many cores gets; the ci profile is derandomized, so its seeds draw the same scenarios and differ only by
timing.

    .venv/bin/python benchmarks/time_to_find.py [--seeds 5] [--budget 60] [--jobs 1] [--cores 2] [--only M07 ...]
        [--profiles ci runner] [--steer] [--json FILE]   (every run's result)
    .venv/bin/python benchmarks/time_to_find.py --from-json FILE   (the table of a saved run)

Not a test: it prints a markdown table for docs/benchmarks.md.
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from queue import Queue
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PROFILES = ("ci", "runner")


def hunted(only: Optional[list[str]] = None) -> list[Any]:
    """The catalogue's entries the fuzzer is known to find (a `fuzz:` killer), or those `only` names by id prefix."""
    from mlx_invariants.mutants.catalogue import CATALOGUE

    chosen = [m for m in CATALOGUE if m.finds and m.routes]
    return [m for m in chosen if not only or any(m.id.startswith(prefix) for prefix in only)]


def _child(task: dict[str, Any]) -> dict[str, Any]:
    """One run, in this fresh process, on the cores it was given."""
    if task.get("cores"):
        os.sched_setaffinity(0, task["cores"])
    import mlx.core  # noqa: F401  # imports are not the fuzzer's time
    import mlx_lm.generate  # noqa: F401

    from mlx_invariants.fuzz.runner import run_fuzz
    from mlx_invariants.fuzz.settings import FuzzSettings
    from mlx_invariants.fuzz.target import Target
    from mlx_invariants.mutants.copies import import_copy

    mutant = next(m for m in hunted() if m.id == task["mutant"])
    target = Target.reference(mutant.routes[0], package=import_copy(mutant, Path(task["root"])))
    result = run_fuzz(target, FuzzSettings(profile=task["profile"], budget_s=task["budget"], seed=task["seed"],
                                           explicit=(), replays=0, shrink=False, steer=task.get("steer", False)))
    kind = result.failure.violations[0].kind if result.failure is not None else None
    found = kind in mutant.finds
    return {"s": result.first_failure_s if found else None, "examples": result.first_failure_examples if found else None,
            "kind": kind, "ran": result.examples}


def _run(task: dict[str, Any]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, __file__, "--child", json.dumps(task)], cwd=ROOT, capture_output=True,
                          text=True, timeout=task["budget"] * 3 + 300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"s": None, "examples": None, "kind": None, "ran": 0, "error": done.stderr[-2000:]}
    return json.loads(lines[-1])


def run_all(tasks: list[dict[str, Any]], jobs: int, cores: int) -> list[dict[str, Any]]:
    """Every task, `jobs` at a time, each pinned to a free slot of `cores` cores (none when the machine has
    fewer than `jobs * cores`)."""
    available = sorted(os.sched_getaffinity(0))
    slots: Queue = Queue()
    for i in range(jobs):
        pinned = available[i * cores:(i + 1) * cores]
        slots.put(pinned if len(pinned) == cores else [])

    def one(task: dict[str, Any]) -> dict[str, Any]:
        slot = slots.get()
        try:
            return {**task, **_run({**task, "cores": slot})}
        finally:
            slots.put(slot)
    with ThreadPoolExecutor(jobs) as pool:
        return list(pool.map(one, tasks))


def row(mutant: Any, results: list[dict[str, Any]], seeds: int) -> str:
    cells = []
    for profile in PROFILES:
        runs = [r for r in results if r["mutant"] == mutant.id and r["profile"] == profile]
        found = sorted(r["s"] for r in runs if r["s"] is not None)
        median = f"{statistics.median(found):.1f}" if len(found) * 2 > seeds else "-"  # a median of the finds only
        per_seed = ", ".join(_seed_cell(r) for r in sorted(runs, key=lambda r: r["seed"]))
        cells.append(f"{len(found)}/{len(runs)} | {median} | {per_seed}")
    kinds = ", ".join(f"`{k}`" for k in sorted(mutant.finds))
    return f"| {mutant.id} | {mutant.routes[0]} | {kinds} | " + " | ".join(cells) + " |"


def _seed_cell(run: dict[str, Any]) -> str:
    """A seed's time, or "miss", or the other violation kind its run stopped at (the bug found under another
    name than its entry gives, e.g. MLX on the loop thread seen as off its owner before the loop's lag)."""
    if run["s"] is not None:
        return f"{run['s']:.1f}"
    return f"other: `{run['kind']}`" if run.get("kind") else "miss"


def table(results: list[dict[str, Any]], mutants: list[Any], seeds: int) -> list[str]:
    return ["| entry | route | kinds it names | ci: found | ci: median s | ci: per seed (s) | runner: found | "
            "runner: median s | runner: per seed (s) |", "|---|---|---|---|---|---|---|---|---|",
            *(row(m, results, seeds) for m in mutants)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--budget", type=float, default=60.0, help="seconds per run")
    parser.add_argument("--jobs", type=int, default=1, help="runs side by side")
    parser.add_argument("--cores", type=int, default=2, help="CPU cores each run is pinned to")
    parser.add_argument("--only", nargs="*", default=None, help="catalogue ids (or prefixes) to hunt")
    parser.add_argument("--profiles", nargs="*", choices=PROFILES, default=list(PROFILES), help="profiles to run")
    parser.add_argument("--steer", action="store_true", help="runs steered by distances to firing (--steer)")
    parser.add_argument("--json", type=Path, help="also write every run's result here")
    parser.add_argument("--from-json", type=Path, help="only print the table of a saved --json run")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(json.loads(args.child))), flush=True)
        return
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        ids = {r["mutant"] for r in saved}
        print("\n".join(table(saved, [m for m in hunted(args.only) if m.id in ids], max(r["seed"] for r in saved))))
        return
    import mlx.core as mx

    mutants = hunted(args.only)
    if not mutants:
        parser.error(f"no catalogue entry the fuzzer finds matches {args.only}")
    root = Path(tempfile.mkdtemp(prefix="time-to-find-"))
    # Interleaved: every mutant's seed 1 in both profiles before any seed 2, so load drifts hit all alike.
    tasks = [{"mutant": m.id, "profile": p, "seed": seed, "budget": args.budget, "steer": args.steer,
              "root": str(root / f"{m.id}-{p}-{seed}")}
             for seed in range(1, args.seeds + 1) for m in mutants for p in args.profiles]
    print(f"machine: {platform.platform()}, {os.cpu_count()} cores, MLX {mx.__version__} on {mx.default_device()}; "
          f"{args.jobs} run(s) side by side, {args.cores} cores each; load average {os.getloadavg()[0]:.1f} at start\n")
    results = run_all(tasks, args.jobs, args.cores)
    print("\n".join(table(results, mutants, args.seeds)))
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")
    errors = [r for r in results if r.get("error")]
    for r in errors[:3]:
        print(f"\n{r['mutant']} {r['profile']} seed {r['seed']} failed:\n{r['error']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
