"""Time to first find, the zoo: how long `invariants fuzz` takes to find each confirmed bug of docs/zoo.md
(a fuzzer finding a standalone reproducer showed, in zoo/results/zoo.json), in the default settings (no
`--profile`: the `ci` profile) and in the `runner` profile, over seeds, one run at a time.

Each run is the server's own fuzz command (zoo/recipes.py: `--server-cmd`, `--model`, `--routes`,
`--capacity`, or `--engine` by its venv's python) with `--seed N --budget CAP --keep-going --jobs 0` and a
fresh example database; nothing else (`--jobs 0` runs the one search in the fuzz process itself, where the
probe below sees it, instead of in the one child process `--jobs 1` starts). `--budget` drops the profile's example cap, so a miss means "not within
CAP seconds"; `--keep-going` lets a run go past another finding, as the zoo's own runs do. The run is
stopped as soon as a finding of the bug's oracle is recorded (confirmed, or listed unconfirmed), and the
time is taken to the first example that showed it, from the command's start (server start-up included);
"reported" is when the finding was recorded (after its confirmation re-runs and shrinking). A probe
in the fuzz process prints each recorded finding as it is booked: `invariants fuzz` itself says which
oracles it found only once it ends. An in-process engine's first start (its imports) is inside the
measured time, as a server's start-up is; the fuzzer times it apart from its baseline and keeps it out of
the budget (fuzz/driver.py: `_start_in_time`).

The servers must be installed first: `bash ci/zoo.sh install`. One fuzz process at a time (a 2-core box
shared with others), the one-minute load average taken before and after each run.

    .venv/bin/python benchmarks/zoo_time_to_find.py [--seeds 5] [--runner-seeds 5] [--cap 120] [--first-seed 1]
        [--only SERVER ...] [--profiles ci runner] --json FILE   (each run appended to FILE as it ends)
    .venv/bin/python benchmarks/zoo_time_to_find.py --from-json FILE   (the table of a saved run)

Not a test: it prints a markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "zoo" / "results" / "zoo.json"
PROFILES = ("ci", "runner")
SEEDS = (1, 2, 3, 4, 5)
PROBE = "zoo-time-to-find: "   # the prefix of the probe's lines in the fuzz process's output


@dataclass(frozen=True)
class Bug:
    """A fuzzer finding of one zoo server that a reproducer showed: hunted by its oracle."""

    server: str
    oracle: str
    id: str

    @property
    def label(self) -> str:
        return f"`{self.oracle}` ({self.id})"


def confirmed_bugs(results: dict[str, Any]) -> list[Bug]:
    """The zoo's confirmed bugs as its last run recorded them: each finding whose reproducer exited 1
    at least once (`zoo.run.shown`), in the order of docs/zoo.md."""
    return [Bug(server["name"], finding["oracle"], finding["id"])
            for server in results["servers"] for finding in server["findings"]
            if finding.get("reproducer") and 1 in finding["reproducer"]["codes"]]


# -- one run ------------------------------------------------------------------------------------------


def fuzz_argv(recipe: Any, venv: Path, model: str, profile: str, seed: int, cap: float, report: Path) -> list[str]:
    """The server's fuzz command with the settings measured, run through this script's probe by the
    python that fuzzes it (an in-process recipe's venv python, else ours)."""
    python = str(venv / "bin" / "python") if recipe.in_process else sys.executable
    argv = [python, __file__, "--probe", "fuzz"]
    if recipe.in_process:
        argv += ["--engine", recipe.engine]
    else:
        argv += ["--server-cmd", recipe.server_command(str(venv), model), "--model", recipe.model_field(model),
                 "--routes", recipe.routes]
    if recipe.capacity is not None:
        argv += ["--capacity", str(recipe.capacity)]
    if profile != "ci":
        argv += ["--profile", profile]
    # --jobs 0: the search in the probed process itself, not in the one child `--jobs 1` (the default) starts
    return argv + ["--seed", str(seed), "--budget", f"{cap:g}", "--keep-going", "--jobs", "0", "--report", str(report)]


def _probe(argv: list[str]) -> int:
    """`invariants fuzz ARGV`, printing a line for each finding the run books, as it books it."""
    from mlx_invariants.cli import main
    from mlx_invariants.fuzz.findings import FindingsBook

    record = FindingsBook.record

    def booked(book: FindingsBook, *args: Any, **kwargs: Any) -> Any:
        finding = record(book, *args, **kwargs)
        elapsed = args[5] if len(args) > 5 else kwargs["elapsed_s"]
        print("\n" + PROBE + json.dumps({"oracle": finding.kind, "status": finding.status.value,
                                         "found_after_s": finding.found_after_s, "elapsed_s": elapsed}), flush=True)
        return finding

    FindingsBook.record = booked
    return main(argv)


def hunt(bug: Bug, profile: str, seed: int, cap: float, work: Path) -> dict[str, Any]:
    """One fuzz run against the bug's server, stopped once the bug's oracle is booked or the budget ends."""
    from zoo import install
    from zoo.recipes import ALL
    from zoo.run import fuzz_env

    from mlx_invariants.engine import tiny_model_path

    recipe = next(r for r in ALL if r.name == bug.server)
    if not install.installed(recipe):
        raise SystemExit(f"{recipe.name} is not installed: run `bash ci/zoo.sh install {recipe.name}` first")
    model = str(tiny_model_path())
    report = work / f"{bug.server}-{profile}-{seed}"
    report.mkdir(parents=True)
    argv = fuzz_argv(recipe, install.venv_dir(recipe), model, profile, seed, cap, report)
    result: dict[str, Any] = {"server": bug.server, "oracle": bug.oracle, "profile": profile, "seed": seed,
                              "cap": cap, "s": None, "reported_s": None, "status": None, "others": [],
                              "load": [round(os.getloadavg()[0], 2)]}
    started = time.monotonic()
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True, env=fuzz_env(recipe, model, report), cwd=ROOT)
    # A backstop past the budget, shrinking and start-up: a run still going then is a miss.
    watchdog = threading.Timer(2 * cap + 300, os.killpg, (child.pid, signal.SIGKILL))
    watchdog.start()
    tail: list[str] = []
    try:
        for line in child.stdout:
            if not line.startswith(PROBE):
                tail = (tail + [line.rstrip()])[-12:] if line.strip() else tail
                continue
            booked = json.loads(line[len(PROBE):])
            if booked["oracle"] != bug.oracle:
                result["others"].append(booked["oracle"])
                continue
            now = time.monotonic() - started
            result.update(reported_s=round(now, 1), status=booked["status"],
                          s=round(now - (booked["elapsed_s"] - (booked["found_after_s"] or booked["elapsed_s"])), 1))
            break
    finally:
        watchdog.cancel()
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)   # the fuzz run and the server it started
        child.wait()
    result.update(wall_s=round(time.monotonic() - started, 1), exit=child.returncode,
                  load=result["load"] + [round(os.getloadavg()[0], 2)])
    if result["s"] is None and (child.returncode not in (0, 1) or not any(report.glob("*/summary.json"))):
        result["error"] = "\n".join(tail)   # a setup error, or a crash (exit 1 with no run folder written)
    return result


# -- the table ----------------------------------------------------------------------------------------


def cells(runs: list[dict[str, Any]]) -> str:
    """found k/n, then median, min and max seconds to the first example showing the bug, a miss counted as
    past the cap (so a median or max past it reads "> CAP"), then each seed's time or "miss"."""
    if not runs:
        return "- | - | - | - | not run"
    cap = runs[0]["cap"]
    times = [r["s"] if r["s"] is not None else float("inf") for r in runs]
    found = sum(r["s"] is not None for r in runs)

    def shown(t: float) -> str:
        return f"{t:.1f}" if t != float("inf") else f"> {cap:g}"
    median = statistics.median(times)
    per_seed = ", ".join(_seed_cell(r) for r in sorted(runs, key=lambda r: r["seed"]))
    return f"{found}/{len(runs)} | {shown(median)} | {shown(min(times))} | {shown(max(times))} | {per_seed}"


def _seed_cell(run: dict[str, Any]) -> str:
    """A seed's time (then when it was reported, and "u" where it was booked unconfirmed), or "miss"."""
    if run.get("error"):
        return "error"
    if run["s"] is None:
        return "miss"
    unconfirmed = " u" if run["status"] == "unconfirmed" else ""
    return f"{run['s']:.1f} (r {run['reported_s']:.1f}{unconfirmed})"


def table(results: list[dict[str, Any]], bugs: list[Bug]) -> list[str]:
    head = ["| bug | server |"]
    for profile in PROFILES:
        head.append(f" {profile}: found | median s | min s | max s | per seed: seen (reported) |")
    lines = ["".join(head), "|---|---" + "|---" * 5 * len(PROFILES) + "|"]
    for bug in bugs:
        per = [cells([r for r in results if (r["server"], r["oracle"], r["profile"]) == (bug.server, bug.oracle, p)])
               for p in PROFILES]
        lines.append(f"| {bug.label} | {bug.server} | " + " | ".join(per) + " |")
    return lines


def loads(results: list[dict[str, Any]]) -> str:
    """The range of the load averages taken around the runs."""
    values = [v for r in results for v in r["load"]]
    return f"{min(values):.1f}-{max(values):.1f} (median {statistics.median(values):.1f})" if values else "-"


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--probe":
        sys.exit(_probe(sys.argv[2:]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=len(SEEDS), help="seeds of the ci (default settings) runs")
    parser.add_argument("--runner-seeds", type=int, default=len(SEEDS), help="seeds of the runner profile's runs")
    parser.add_argument("--first-seed", type=int, default=1, help="the seeds run are this one and the next ones")
    parser.add_argument("--cap", type=float, default=120.0, help="fuzz budget per run, seconds")
    parser.add_argument("--only", nargs="*", default=None, help="zoo servers to hunt in")
    parser.add_argument("--profiles", nargs="*", choices=PROFILES, default=list(PROFILES))
    parser.add_argument("--json", type=Path, help="append every run's result here as it ends")
    parser.add_argument("--from-json", type=Path, help="only print the table of a saved --json run")
    args = parser.parse_args()
    bugs = [b for b in confirmed_bugs(json.loads(RESULTS.read_text())) if not args.only or b.server in args.only]
    if args.from_json:
        saved = [json.loads(line) for line in args.from_json.read_text().splitlines() if line.strip()]
        print("\n".join(table(saved, bugs)) + f"\n\nload average around the runs: {loads(saved)}")
        return
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="zoo-time-to-find-"))
    # Defaults first, every bug's seed 1 before any seed 2, so a cut-short run still has every bug.
    plan = [(bug, profile, seed) for profile in args.profiles
            for seed in range(args.first_seed, args.first_seed + (args.seeds if profile == "ci" else args.runner_seeds))
            for bug in bugs]
    print(f"machine: {platform.platform()}, {os.cpu_count()} cores; {len(plan)} runs of up to {args.cap:g} s, "
          f"one at a time; work folder {work}", flush=True)
    results = []
    for bug, profile, seed in plan:
        run = hunt(bug, profile, seed, args.cap, work)
        results.append(run)
        print(json.dumps(run), flush=True)
        if args.json:
            with open(args.json, "a") as out:
                out.write(json.dumps(run) + "\n")
    print("\n".join(table(results, bugs)) + f"\n\nload average around the runs: {loads(results)}")


if __name__ == "__main__":
    main()
