"""False alarms and missed alarms: fuzz correct engines and their buggy twins, print a table.

    python benchmarks/bench_false_alarms.py [--seeds 3] [--budget 600] [--only NAME ...] [--jobs 1]

Each pair of benchmarks/false_alarms/ (see its README.md) is a correct small engine or server in a style
real MLX serving projects use and a twin one real mistake away. Every one is fuzzed with the `runner`
profile, `--keep-going`, for `--budget` seconds per run and `--seeds` seeds (1, 2, ...), each run in its
own `invariants fuzz` process (`--jobs` of them side by side). A correct engine's run is a false alarm
when it exits 1 or its summary.json holds a finding with status "violation"; its unconfirmed findings are
counted apart. A twin is found in a seed when its run reports a violation. Not a test: it prints timings.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from false_alarms.pairs import BY_NAME, PAIRS, Pair  # noqa: E402

# The console script through this interpreter: works wherever the package imports (an install with
# `pip --target` has no `invariants` beside the interpreter).
INVARIANTS = (sys.executable, "-m", "mlx_invariants")


@dataclass(frozen=True)
class Finding:
    oracle: str
    status: str       # violation | unconfirmed | accepted
    headline: str
    found_after_s: Optional[float] = None


@dataclass(frozen=True)
class RunResult:
    pair: str
    twin: bool
    seed: int
    exit_code: int
    findings: tuple[Finding, ...] = ()
    run_dir: str = ""
    wall_s: float = 0.0
    note: str = ""    # why the run did not happen or did not finish (a skip, a setup error)

    @property
    def violations(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.status == "violation")

    @property
    def unconfirmed(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.status == "unconfirmed")

    @property
    def failing(self) -> bool:
        """A correct engine's false alarm; a twin's find."""
        return self.exit_code == 1 or bool(self.violations)

    @property
    def ran(self) -> bool:
        return self.exit_code in (0, 1)

    @property
    def first_find_s(self) -> Optional[float]:
        times = [f.found_after_s for f in self.violations if f.found_after_s is not None]
        return min(times) if times else None


def fuzz_command(pair: Pair, twin: bool, seed: int, budget: float, report: Path) -> list[str]:
    module = pair.twin_module if twin else pair.module
    if pair.kind == "engine":
        target = ["--engine", f"{module}:make"]
    else:
        target = ["--server-cmd", f"{sys.executable} -m {module} --port {{port}}"]
    return [*INVARIANTS, "fuzz", *target, "--profile", "runner", "--keep-going", "--budget", f"{budget:g}",
            "--seed", str(seed), "--jobs", "0", "--report", str(report)]


def environment() -> dict[str, str]:
    """This environment with benchmarks/ on PYTHONPATH, so the factories and servers import."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    return env


def missing(pair: Pair) -> Optional[str]:
    """The install line for a module the pair needs and this interpreter lacks, else None."""
    if pair.needs is None:
        return None
    module = pair.needs.split("==")[0]
    return None if importlib.util.find_spec(module) is not None else f"needs pip install '{pair.needs}'"


def run_one(pair: Pair, twin: bool, seed: int, budget: float, reports: Path) -> RunResult:
    report = reports / f"{pair.name}{'-twin' if twin else ''}-seed{seed}"
    report.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(report / "fuzz.log", "w") as log:
        code = subprocess.call(fuzz_command(pair, twin, seed, budget, report), cwd=REPO, env=environment(),
                               stdout=log, stderr=subprocess.STDOUT, timeout=budget + 900)
    wall = time.monotonic() - started
    summaries = sorted(report.glob("*/summary.json"))
    if not summaries:
        return RunResult(pair.name, twin, seed, code, wall_s=wall, note=f"no run folder; see {report / 'fuzz.log'}")
    return read_run(pair.name, twin, seed, code, summaries[-1], wall)


def read_run(name: str, twin: bool, seed: int, code: int, summary_path: Path, wall: float) -> RunResult:
    summary = json.loads(summary_path.read_text())
    findings = tuple(Finding(f.get("oracle", "?"), f.get("status", "?"), f.get("headline", ""),
                             f.get("found_after_s")) for f in summary.get("findings", []))
    return RunResult(name, twin, seed, code, findings, str(summary_path.parent), wall)


def _short(text: str, width: int = 110) -> str:
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= width else text[: width - 1] + "…"


def render_table(pairs: Sequence[Pair], results: Sequence[RunResult], skipped: dict[str, str] | None = None) -> str:
    """The markdown table: per pair, the correct engine's runs and false alarms, the twin's finds."""
    skipped = skipped or {}
    lines = ["| engine | style | correct: runs / failing | correct: unconfirmed | twin: found | "
             "twin: median s to first find | twin: headline |",
             "|---|---|---|---|---|---|---|"]
    for pair in pairs:
        if pair.name in skipped:
            lines.append(f"| {pair.name} | {pair.style} | skipped: {skipped[pair.name]} | | | | |")
            continue
        correct = [r for r in results if r.pair == pair.name and not r.twin]
        twins = [r for r in results if r.pair == pair.name and r.twin]
        errors = [r for r in correct + twins if not r.ran]
        failing = sum(r.failing for r in correct)
        unconfirmed = sorted({f.oracle for r in correct for f in r.unconfirmed})
        found = [r for r in twins if r.failing]
        times = [r.first_find_s for r in found if r.first_find_s is not None]
        median = f"{statistics.median(times):.1f}" if times else "—"
        hints = sorted({f.oracle for r in twins for f in r.unconfirmed})
        missed = "missed" + (f" (unconfirmed only: {', '.join(hints)})" if hints else "")
        headline = next((f.headline for r in found for f in r.violations), missed)
        correct_cell = f"{len(correct)} / {failing}"
        if errors:
            correct_cell += f" ({len(errors)} run(s) exited 2: {_short(errors[0].note or 'setup error', 60)})"
        unconfirmed_cell = f"{sum(len(r.unconfirmed) for r in correct)}" + (f" ({', '.join(unconfirmed)})"
                                                                            if unconfirmed else "")
        lines.append(f"| {pair.name} | {pair.style} | {correct_cell} | {unconfirmed_cell} | "
                     f"{len(found)}/{len(twins)} | {median} | {_short(headline)} |")
    return "\n".join(lines)


def render_false_alarms(results: Sequence[RunResult]) -> str:
    """Every finding on a correct engine, verbatim, with its run folder."""
    lines = []
    for result in results:
        if result.twin:
            continue
        for finding in result.findings:
            lines.append(f"- {result.pair} seed {result.seed} ({finding.status}, {finding.oracle}): "
                         f"{finding.headline}\n  run folder: {result.run_dir}")
        if result.exit_code == 1 and not result.violations:
            lines.append(f"- {result.pair} seed {result.seed}: exit 1 with no violation in summary.json "
                         f"({result.run_dir})")
    return "\n".join(lines) if lines else "none"


SIDES = {"both": (False, True), "correct": (False,), "twin": (True,)}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds per engine: 1..N (default 3)")
    parser.add_argument("--budget", type=float, default=600, help="seconds per fuzz run (default 600)")
    parser.add_argument("--only", action="append", choices=sorted(BY_NAME), metavar="NAME",
                        help="only this pair (repeatable)")
    parser.add_argument("--jobs", type=int, default=1, help="fuzz processes side by side (default 1)")
    parser.add_argument("--side", choices=("both", "correct", "twin"), default="both",
                        help="fuzz the correct engines, their twins, or both (default both)")
    parser.add_argument("--report", type=Path, default=REPO / "fuzz-reports" / "false-alarms",
                        help="where each run's folder goes")
    args = parser.parse_args(argv)
    pairs = [BY_NAME[name] for name in args.only] if args.only else list(PAIRS)
    skipped = {pair.name: why for pair in pairs if (why := missing(pair))}
    reports = args.report / time.strftime("%Y%m%d-%H%M%S")
    runs = [(pair, twin, seed) for pair in pairs if pair.name not in skipped
            for seed in range(1, args.seeds + 1) for twin in SIDES[args.side]]
    print(f"{len(runs)} fuzz run(s) of {args.budget:g}s, {args.jobs} at a time; reports under {reports}",
          flush=True)
    results = []
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futures = [pool.submit(run_one, pair, twin, seed, args.budget, reports) for pair, twin, seed in runs]
        for future in concurrent.futures.as_completed(futures):
            result = future.result()
            results.append(result)
            print(f"  {result.pair}{' twin' if result.twin else ''} seed {result.seed}: exit {result.exit_code}, "
                  f"{len(result.violations)} violation(s), {len(result.unconfirmed)} unconfirmed, "
                  f"{result.wall_s:.0f}s", flush=True)
    print()
    print(render_table(pairs, results, skipped))
    print("\nFindings on correct engines (false alarms and unconfirmed):")
    print(render_false_alarms(sorted(results, key=lambda r: (r.pair, r.seed))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
