"""Fuzz every zoo recipe for a fixed budget and check each finding with a standalone reproducer.

Each recipe runs as a user would run it: `invariants fuzz --server-cmd CMD` in a child
process, with the server from the recipe's own venv and the embedded tiny model (an
in-process recipe: `invariants fuzz --engine MODULE:FACTORY` by that venv's python). It runs
the `runner` profile, whose prompts (to 300 words) and budgets (to 200 tokens) are long
enough for a gone client's wasted decoding to show, once per recorded seed, each run with a fresh
example database (so the seed alone decides what is drawn), and `--keep-going`,
so every server gets its whole budget and every distinct finding. The run folder's
summary.json gives the findings; the child's progress lines give the wall time at which the
finding count rose (time to first find, server start-up included). A finding counts as a
bug only where a reproducer of `reproducers/` shows it on the same version; the rest are
listed as unconfirmed. Each recipe's known reproducers run too, so a bug the fuzzer misses
within its budget is still reported, marked as such. The load average is recorded around
each run: on a shared machine it says how much of the budget the fuzzer really had.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from zoo import install
from zoo.recipes import BLOCKED, Known, Recipe
from zoo.vllm_engines import MODEL_ENV

DATABASE_ENV = "MLX_INVARIANTS_FUZZ_DB"  # where the runner profile keeps its example database

REPRODUCERS = Path(__file__).resolve().parent / "reproducers"
CHECKOUT = Path(__file__).resolve().parents[1]  # the repository root, from which `zoo.vllm_engines` imports
FOUND = re.compile(r"(\d+) (?:new )?(?:finding\(s\)|failing)")
PROFILE = "runner"  # long prompts and budgets: the ci profile draws at most 12 words / 10 tokens
BUG, NOT_SHOWN, INCONCLUSIVE = 1, 0, 2
CLIENT_GOES = frozenset({"cancel", "cancel-twice", "cancel-in-call", "disconnect", "abort"})  # fault kinds


def run_zoo(recipes: list[Recipe], budget_s: float, model: str, work: Path, repro_runs: int,
            seeds: list[int], note: str = "", say: Callable[[str], None] = print) -> dict[str, Any]:
    """Install (if needed), fuzz every recipe once per seed and reproduce what it found; the JSON-able result
    docs/zoo.md is written from. `note` says what else the machine was doing."""
    servers = []
    for recipe in recipes:
        say(f"== {recipe.name} {recipe.version}")
        try:
            venv = install.install(recipe)
        except install.InstallError as exc:
            servers.append(_entry(recipe, "", error=f"install failed: {exc}"))
            continue
        command = recipe.server_command(str(venv), model)
        entry = _entry(recipe, command or f"invariants fuzz --engine {recipe.engine}")
        entry.update(run_at=_now(), budget_s=budget_s, profile=PROFILE, seeds=list(seeds), model=model, runs=[])
        for seed in seeds:
            load = _load()
            run = fuzz_recipe(recipe, venv, command, model, budget_s, seed, work / recipe.name / f"seed-{seed}", say)
            entry["runs"].append({**run, "seed": seed, "load": [load, _load()]})
        entry.update(merge_runs(entry["runs"]))
        shown_by: dict[str, dict] = {}  # a reproducer runs once however many findings share its oracle
        for finding in entry["findings"]:
            known = _reproducer_for(recipe, finding)
            if known is not None:
                if known.slug not in shown_by:
                    shown_by[known.slug] = dict(reproduce(known, recipe, venv, command, model, repro_runs, say),
                                                title=known.title)
                finding["reproducer"] = shown_by[known.slug]
        entry["known"] = [dict(reproduce(k, recipe, venv, command, model, repro_runs, say), title=k.title)
                          for k in recipe.known if k.slug not in shown_by]
        servers.append(entry)
    return {
        "generated": _now(),
        "budget_s": budget_s,
        "profile": PROFILE,
        "seeds": list(seeds),
        "host": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                 "note": note},
        "servers": servers,
        "blocked": [{"name": b.name, "package": b.package, "version": b.version, "reason": b.reason,
                     "error": b.error} for b in BLOCKED],
    }


def merge_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One server's runs (one per seed) as one entry: scenario counts summed, each distinct finding (by its
    signature id) once, with the seeds that found it and the time each took; each run keeps the ids it found.
    The server counts as not fuzzed only when no run finished."""
    finished = [run for run in runs if not run.get("error")]
    merged: dict[str, Any] = {"examples": sum(r.get("examples", 0) for r in finished),
                              "scenario_runs": sum(r.get("scenario_runs", 0) for r in finished),
                              "elapsed_s": round(sum(r.get("elapsed_s") or 0 for r in finished), 1)}
    if not finished:
        merged["error"] = "\n\n".join(f"seed {r['seed']}: {r['error']}" for r in runs)
    for key in ("pace", "requests", "sentinel", "fuzz_versions"):
        merged[key] = next((r[key] for r in finished if r.get(key)), {} if key != "requests" else None)
    findings: dict[str, dict] = {}
    for run in finished:
        for finding in run.pop("findings", []):
            first_find_s = finding.pop("first_find_s")
            first = findings.setdefault(finding["id"], {**finding, "seeds": [], "first_finds_s": []})
            first["seeds"].append(run["seed"])
            first["first_finds_s"].append(first_find_s)
        run["finding_ids"] = sorted({f["id"] for f in findings.values() if run["seed"] in f["seeds"]})
    merged["findings"] = list(findings.values())
    return merged


def _load() -> float:
    """The machine's one-minute load average (how many cores' worth of work was competing)."""
    return round(os.getloadavg()[0], 2)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _entry(recipe: Recipe, command: str, error: str = "") -> dict[str, Any]:
    return {"name": recipe.name, "package": recipe.package, "version": recipe.version,
            "versions": install.versions(recipe), "command": command, "endpoints": list(recipe.endpoints),
            "notes": recipe.notes, "error": error, "findings": [], "known": []}


def _reproducer_for(recipe: Recipe, finding: dict) -> Optional[Known]:
    """The recipe's reproducer for a finding: one of its oracles, and the kind of client it checks (if it
    checks one kind only) among the finding's clients that went away."""
    return next((k for k in recipe.known if finding["oracle"] in k.oracles
                 and (not k.gone or k.gone in _gone_kinds(finding.get("scenario_json")))), None)


def _gone_kinds(scenario: Optional[dict]) -> set[str]:
    """"stream" / "nonstream": the kinds of the scenario's requests whose client a fault takes away."""
    if not scenario:
        return set()
    streams = {r["rid"]: r.get("stream", False) for r in scenario.get("requests", [])}
    gone = {f["at"]["rid"] for f in scenario.get("faults", []) if f.get("kind") in CLIENT_GOES}
    return {"stream" if streams[rid] else "nonstream" for rid in gone if rid in streams}


def fuzz_argv(recipe: Recipe, venv: Path, command: str, budget_s: float, seed: int, report: Path,
              model: str = "") -> list[str]:
    """The `invariants fuzz` command line for one recipe: the whole budget, every distinct finding.
    `model` is the model folder, for a server whose "model" field is that folder."""
    if recipe.in_process:
        argv = [str(venv / "bin" / "python"), "-m", "mlx_invariants", "fuzz", "--engine", recipe.engine]
    else:
        argv = [sys.executable, "-m", "mlx_invariants", "fuzz", "--server-cmd", command,
                "--model", recipe.model_field(model), "--routes", recipe.routes]
    if recipe.capacity is not None:
        argv += ["--capacity", str(recipe.capacity)]
    return argv + ["--profile", PROFILE, "--seed", str(seed), "--keep-going", "--budget", f"{budget_s:g}",
                   "--report", str(report)]


def fuzz_env(recipe: Recipe, model: str, report: Path) -> dict[str, str]:
    """The fuzz child's environment: the model folder, a fresh example database, and for an in-process
    recipe the checkout on PYTHONPATH, so its venv's python imports the `--engine` module from the zoo."""
    env = {**os.environ, MODEL_ENV: model, DATABASE_ENV: str(report / ".hypothesis")}
    if recipe.in_process:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(CHECKOUT), os.environ.get("PYTHONPATH", "")) if p)
    return env


def fuzz_recipe(recipe: Recipe, venv: Path, command: str, model: str, budget_s: float, seed: int, report: Path,
                say: Callable[[str], None]) -> dict[str, Any]:
    """One `invariants fuzz` run (`--server-cmd`, or `--engine` by the recipe's python): its counts,
    findings and time to each first find. Its example database lives in its report folder, so an
    earlier run (or another server's) is not replayed into it."""
    if report.exists():
        shutil.rmtree(report)
    report.mkdir(parents=True)
    argv = fuzz_argv(recipe, venv, command, budget_s, seed, report, model)
    say("$ " + shlex.join(argv))
    started = time.monotonic()
    found_at: list[float] = []
    tail: list[str] = []
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                             env=fuzz_env(recipe, model, report))
    # Shrinking, replays and the server's start-up come on top of the budget.
    killer = threading.Timer(3 * budget_s + 600, os.killpg, (child.pid, signal.SIGKILL))
    killer.start()
    try:
        for line in _lines(child):
            tail = (tail + [line])[-30:]
            match = FOUND.search(line)
            while match and int(match.group(1)) > len(found_at):
                found_at.append(round(time.monotonic() - started, 1))
        code = child.wait()
    finally:
        killer.cancel()
        if child.poll() is None:  # this runner was interrupted: the fuzz run (and its server) go with it
            os.killpg(child.pid, signal.SIGTERM)
    result: dict[str, Any] = {"fuzz_exit": code, "wall_s": round(time.monotonic() - started, 1)}
    summary = _summary(report)
    if code not in (0, 1) or summary is None:
        result["error"] = f"invariants fuzz exited with {code}:\n" + "\n".join(tail[-12:])
        return result
    result.update(examples=summary.get("examples", 0), scenario_runs=summary.get("scenario_runs", 0),
                  elapsed_s=summary.get("elapsed_s"), pace=summary.get("pace", {}),
                  requests=summary.get("requests"),
                  sentinel=summary.get("sentinel", {}), fuzz_versions=summary.get("versions", {}))
    result["findings"] = [_finding(f, i, found_at) for i, f in enumerate(summary.get("findings", []))]
    return result


def _lines(child: subprocess.Popen) -> Iterator[str]:
    """The child's output lines, split on carriage returns too (progress lines redraw in place)."""
    buffer = b""
    while True:
        chunk = child.stdout.read1(4096)
        if not chunk:
            break
        buffer += chunk
        *done, buffer = re.split(rb"[\r\n]", buffer)
        for raw in done:
            if raw.strip():
                yield raw.decode(errors="replace")
    if buffer.strip():
        yield buffer.decode(errors="replace")


def _summary(report: Path) -> Optional[dict]:
    runs = sorted(report.glob("*/summary.json"), key=lambda p: p.stat().st_mtime)
    if not runs:
        return None
    return json.loads(runs[-1].read_text())


def _finding(raw: dict, index: int, found_at: list[float]) -> dict[str, Any]:
    folder = Path(raw.get("report", ""))
    scenario = folder / "scenario.json"
    return {
        "id": raw.get("id", ""),
        "status": raw.get("status", ""),
        "oracle": raw.get("oracle", ""),
        "headline": raw.get("headline", ""),
        "scenario": raw.get("scenario", ""),
        "scenario_json": json.loads(scenario.read_text()) if scenario.exists() else None,
        "replayed": raw.get("reproduced") or raw.get("confirmation"),
        "shrunk": raw.get("shrunk"),
        "first_find_s": found_at[index] if index < len(found_at) else None,
        "reproducer": None,
    }


def reproduce(known: Known, recipe: Recipe, venv: Path, command: str, model: str, runs: int,
              say: Callable[[str], None]) -> dict[str, Any]:
    """Run `known`'s script `runs` times (a fresh server or engine each time); its exit codes. An
    in-process reproducer runs on the recipe's python, an HTTP one on ours against the server command."""
    script = REPRODUCERS / known.script
    args = [arg.replace("{model}", model) for arg in known.args]
    in_process = recipe.in_process or known.engine_api
    if in_process:
        argv = [str(venv / "bin" / "python"), str(script), *args]
    else:
        argv = [sys.executable, str(script), *args, "--ready-path", recipe.ready_path, "--", *shlex.split(command)]
    codes, last = [], ""
    for _ in range(runs):
        say("$ " + shlex.join(argv))
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
            codes.append(done.returncode)
            last = (done.stdout + done.stderr).strip()
        except subprocess.TimeoutExpired:
            codes.append(INCONCLUSIVE)
            last = "(timed out after 900 s)"
        say(last)
    return {"slug": known.slug, "script": known.script, "args": list(known.args), "codes": codes, "output": last,
            "in_process": in_process}


def shown(reproducer: Optional[dict]) -> bool:
    """A reproducer shows its bug if at least one of its runs exited 1."""
    return bool(reproducer) and BUG in reproducer["codes"]
