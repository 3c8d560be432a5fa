"""Fuzzer throughput and bite: examples/s on the reference engines (one engine reused across clean
scenarios, and a fresh engine per scenario), and time and examples to the first failure for each
planted seed bug (median of 5 seeds, no shrinking), in the `ci` profile. `--observation` measures
only what the drop-in observation (fuzz/observe.py: locks, work handed to threads, cancellation) costs:
examples/s with it and without it (`MLX_INVARIANTS_OBSERVE=0`), rounds interleaved. `--shapes` measures
what the profile's schedule shapes cost (more requests than capacity, rare long prompts and budgets):
examples/s with them and with the earlier shapes (at most 3 requests, 12 words, 10 tokens), interleaved.
`--against REV` measures the fuzzer of git revision REV (exported with `git archive`, laid out as its wheel
installs it) and the working tree's, each through `fuzz --jobs 0`, interleaved: what the schedules since cost.

    .venv/bin/python benchmarks/bench_fuzz.py [--seeds 5] [--examples 300] [--budget 60]
    .venv/bin/python benchmarks/bench_fuzz.py --observation [--rounds 3] [--throughput-examples 300]
    .venv/bin/python benchmarks/bench_fuzz.py --shapes [--rounds 3] [--throughput-examples 300]
    .venv/bin/python benchmarks/bench_fuzz.py --against 19f4f27 [--rounds 3] [--throughput-examples 300]

Not a test: it prints markdown tables for docs/benchmarks.md. Every measurement runs in a fresh process
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
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional

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


def side_by_side(columns: tuple[str, str], engines: tuple[str, ...], rounds: int, examples: int,
                 rate: Callable[[str, int], float], compare: tuple[str, Callable[[float, float], str]],
                 what: str = "engine") -> None:
    """A markdown table of examples/s for two variants of one run on each engine: `rate(engine, 0 or 1)` runs
    one measurement of that variant. The two alternate round by round (first, second, then second, first),
    so both see the same background load; each round's rate is shown after the median."""
    print(f"| {what} | examples | {columns[0]}: median examples/s (each round) | {columns[1]} | {compare[0]} |")
    print("|---|---|---|---|---|")
    for engine in engines:
        rates: tuple[list[float], list[float]] = ([], [])
        for round_ in range(rounds):
            for variant in ((0, 1) if round_ % 2 == 0 else (1, 0)):
                rates[variant].append(rate(engine, variant))
        first, second = (statistics.median(r) for r in rates)
        each = [", ".join(f"{r:.1f}" for r in variant) for variant in rates]
        print(f"| {engine} | {examples} | {first:.1f} ({each[0]}) | {second:.1f} ({each[1]}) | "
              f"{compare[1](first, second)} |", flush=True)


def _cost(first: float, second: float) -> str:
    """What the first variant costs against the second, in percent of the second's rate."""
    return f"{100 * (second - first) / second:+.0f}%"


def _examples_per_s(task: dict[str, Any]) -> float:
    done = measure(task)
    return done["examples"] / done["elapsed_s"]


def observation_table(rounds: int, examples: int) -> None:
    """Examples/s on each reference engine and the toy engine (reused, `ci` profile) with and without the
    drop-in observation."""
    side_by_side(("with observation", "without"), ("simple", "batched", "toy"), rounds, examples,
                 lambda engine, variant: _examples_per_s({"kind": "throughput", "engine": engine, "examples": examples,
                                                          "reuse": True, "observe": variant == 0}),
                 ("cost", _cost))


def shapes_table(rounds: int, examples: int) -> None:
    """Examples/s on each reference engine (reused, `ci` profile) with the profile's schedule shapes and with
    the earlier short ones."""
    side_by_side(("profile shapes", "earlier short shapes"), ("simple", "batched"), rounds, examples,
                 lambda engine, variant: _examples_per_s({"kind": "throughput", "engine": engine, "examples": examples,
                                                          "reuse": True, "shapes": ("profile", "short")[variant]}),
                 ("cost", _cost))


def against_table(revision: str, rounds: int, examples: int) -> None:
    """Examples/s of the fuzzer at git `revision` and of the working tree, each through the same command
    (`fuzz --jobs 0`, `ci` profile, engine reused) in a fresh process, on both reference routes."""
    sides = (revision, "working tree")
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-against-") as scratch:
        site = export_revision(revision, Path(scratch))
        sites = (site, None)

        def rate(route: str, variant: int) -> float:
            done = fuzz_run(route, examples, sites[variant], Path(scratch))
            runs.setdefault((route, variant), []).append(done)
            return done["examples"] / done["elapsed_s"]

        for side, where in zip(sides, sites):
            origin = imported_from(where)["mlx_invariants"]
            if where is not None and not Path(origin).is_relative_to(where):
                raise SystemExit(f"bench_fuzz: {revision}'s export imports mlx_invariants from {origin}, not {where}")
            print(f"{side}: imports {origin}")
        print()
        side_by_side(sides, ("simple", "batched"), rounds, examples, rate,
                     (f"ratio (tree / {revision})", lambda old, new: f"{new / old:.2f}"), what="route")
    print("\n| route | fuzzer | engines started per run (each round) | MLX calls per example | in MLX |")
    print("|---|---|---|---|---|")
    for (route, variant), done in runs.items():  # in the order first measured: simple, then batched
        if any(run["engines"] is None for run in done):
            continue  # a revision whose run folder says less: its rate is still in the table above
        calls = statistics.median(run["mlx_calls"] / run["examples"] for run in done)
        share = statistics.median(run["mlx_s"] / run["elapsed_s"] for run in done)
        print(f"| {route} | {sides[variant]} | {', '.join(str(run['engines']) for run in done)} | {calls:.0f} | "
              f"{100 * share:.0f}% |")


def export_revision(revision: str, into: Path) -> Path:
    """`git archive revision` unpacked under `into/tree` and laid out under `into/site` as its wheel installs it;
    returns the site folder, for PYTHONPATH. ValueError if git knows no such revision."""
    tree = into / "tree"
    tree.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", revision], cwd=ROOT, capture_output=True)
    if archive.returncode:
        raise ValueError(f"git archive {revision} failed: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return lay_out(tree, into / "site")


def lay_out(tree: Path, site: Path) -> Path:
    """Copy each folder of `tree`'s pyproject `[tool.setuptools.package-dir]` to its import path under `site`
    (parents first: `invariants/` to `mlx_invariants/`, then `engine/` to `mlx_invariants/engine/` ...), so that
    `mlx_invariants` on PYTHONPATH=site is that tree's, as its wheel would install it. Read from the tree, not
    assumed: a revision maps its own folders."""
    import tomllib

    from mlx_invariants.mutants.copies import IGNORED

    mapping = tomllib.loads((tree / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for package, folder in sorted(mapping.items(), key=lambda item: item[0].count(".")):
        shutil.copytree(tree / folder, site.joinpath(*package.split(".")), ignore=IGNORED)
    return site


def _environment(site: Optional[Path]) -> dict[str, str]:
    """This process's environment, with `site` first on PYTHONPATH (ahead of the editable install's finder)."""
    env = dict(os.environ)
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(site), env.get("PYTHONPATH"))))
    return env


def imported_from(site: Optional[Path]) -> dict[str, str]:
    """Where a fresh process (PYTHONPATH=site, or the working tree's install if None) finds the harness, its
    engine and its fuzzer: a check that a comparison does not measure one tree twice."""
    probe = ("import importlib.util, json; print(json.dumps({name: importlib.util.find_spec(name).origin for name in "
             "('mlx_invariants', 'mlx_invariants.engine', 'mlx_invariants.fuzz')}))")
    with tempfile.TemporaryDirectory() as elsewhere:  # run as the fuzz runs are: from a folder holding nothing
        found = subprocess.run([sys.executable, "-c", probe], cwd=elsewhere, env=_environment(site),
                               capture_output=True, text=True, check=True)
    return json.loads(found.stdout)


_VERDICT = re.compile(r"no new finding in (\d+) example\(s\), ([\d.]+)s")


def parse_verdict(output: str) -> dict[str, Any]:
    """Examples and seconds from the fuzz command's verdict line (`ENGINE: no new finding in N example(s), Xs`,
    printed the same by this tree and by the revisions compared); a run that found something is no rate."""
    found = _VERDICT.findall(output)
    if not found:
        raise RuntimeError(f"the fuzz run printed no 'no new finding' verdict:\n{output[-3000:]}")
    examples, elapsed = found[-1]
    return {"examples": int(examples), "elapsed_s": float(elapsed)}


def fuzz_run(route: str, examples: int, site: Optional[Path], scratch: Path) -> dict[str, Any]:
    """One `fuzz --jobs 0` run of `route` in a fresh process, with the harness from `site` (or the tree):
    examples and seconds from its verdict line; engines started, MLX calls and seconds in MLX from its
    run folder's summary.json where it writes them (None where not)."""
    with tempfile.TemporaryDirectory(dir=scratch) as reports:
        run = subprocess.run([sys.executable, "-m", "mlx_invariants", "fuzz", "--jobs", "0", "--engine", route,
                              "--examples", str(examples), "--budget", "900", "--report", reports],
                             cwd=scratch, env=_environment(site), capture_output=True, text=True, timeout=1200)
        done = parse_verdict(run.stdout + run.stderr)
        summaries = sorted(Path(reports).glob("*/summary.json"))
        summary = json.loads(summaries[-1].read_text()) if summaries else {}
    sentinel = summary.get("sentinel", {})
    return {**done, "engines": summary.get("engines_started"), "mlx_calls": sentinel.get("mlx_calls"),
            "mlx_s": sentinel.get("mlx_s")}


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
    parser.add_argument("--against", metavar="REV",
                        help="only examples/s of the fuzzer at git revision REV and of the working tree, side by side")
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
    if args.against:
        print(f"machine: {platform.platform()}, {os.cpu_count()} cores, MLX {mx.__version__} on "
              f"{mx.default_device()}, load average {os.getloadavg()[0]:.1f} at start\n")
        try:
            against_table(args.against, args.rounds, args.throughput_examples)
        except ValueError as error:  # an unknown revision: a usage mistake, exit 2
            parser.error(str(error))
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
