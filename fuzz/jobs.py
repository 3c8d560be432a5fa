"""Fuzz in child processes: `--jobs N` runs N of them, each with its own seed and work folder.

A child that dies inside MLX (Metal aborts the whole process) cannot report
itself; the parent then reads the `current.json` the child wrote before the
scenario started and turns it into a crash report with a replay command.
Children talk to the parent in JSON lines on stdout: progress, then a result.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from mlx_invariants.fuzz.oracles import Violation
from mlx_invariants.fuzz.report import Failure, device_info, write_report
from mlx_invariants.fuzz.scenario import Scenario
from mlx_invariants.fuzz.trace import Trace


@dataclass
class JobOutcome:
    job: int
    examples: int = 0
    elapsed_s: float = 0.0
    headline: Optional[str] = None
    report_dir: Optional[str] = None
    crashed: Optional[str] = None
    engines_started: int = 0

    @property
    def failed(self) -> bool:
        return self.headline is not None or self.crashed is not None


def run_jobs(options: dict[str, Any], jobs: int, workroot: Path,
             progress: Callable[[list[dict[str, Any]]], None]) -> list[JobOutcome]:
    """Start `jobs` children on `options` (seed + i each); wait for all, reporting progress as it comes."""
    workroot.mkdir(parents=True, exist_ok=True)
    base_seed = options.get("seed")
    if base_seed is None and jobs > 1:
        base_seed = int.from_bytes(os.urandom(4), "little")  # one job alone keeps its profile's seeding
    children: dict[int, subprocess.Popen] = {}
    selector = selectors.DefaultSelector()
    states: list[dict[str, Any]] = [{"examples": 0, "failed": False, "elapsed_s": 0.0} for _ in range(jobs)]
    outcomes = [JobOutcome(i) for i in range(jobs)]
    for i in range(jobs):
        seed = None if base_seed is None else base_seed + i * 1000
        child_options = {**options, "seed": seed, "workdir": str(workroot / f"job{i}")}
        process = subprocess.Popen([sys.executable, "-m", "mlx_invariants.fuzz.jobs", json.dumps(child_options)],
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        children[i] = process
        selector.register(process.stdout, selectors.EVENT_READ, i)
    try:
        open_streams = jobs
        while open_streams:
            for key, _ in selector.select(timeout=1.0):
                i = key.data
                line = key.fileobj.readline()
                if not line:
                    selector.unregister(key.fileobj)
                    open_streams -= 1
                    continue
                _take_line(line, states[i], outcomes[i])
            progress(states)
        for i, process in children.items():
            code = process.wait()
            if code != 0 and outcomes[i].headline is None:
                outcomes[i].crashed = _describe_exit(code)
                outcomes[i].report_dir = _crash_report(options, workroot / f"job{i}", outcomes[i].crashed)
    finally:
        for process in children.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
    return outcomes


def _take_line(line: str, state: dict[str, Any], outcome: JobOutcome) -> None:
    try:
        message = json.loads(line)
    except json.JSONDecodeError:
        return
    if "progress" in message:
        state.update(message["progress"])
    elif "result" in message:
        result = message["result"]
        outcome.examples = result["examples"]
        outcome.elapsed_s = result["elapsed_s"]
        outcome.headline = result.get("headline")
        outcome.report_dir = result.get("report_dir")
        outcome.engines_started = result.get("engines_started", 0)
        state.update(examples=outcome.examples, failed=outcome.failed)


def _describe_exit(code: int) -> str:
    if code < 0:
        return f"the fuzz process was killed by {signal.Signals(-code).name}"
    return f"the fuzz process exited with status {code}"


def _crash_report(options: dict[str, Any], workdir: Path, why: str) -> Optional[str]:
    """The scenario that was running when the child died, as a report."""
    current = workdir / "current.json"
    if not current.is_file():
        return None
    scenario = Scenario.loads(current.read_text())
    failure = Failure(scenario, Trace(), [Violation("process-crashed", f"{why} while running this scenario")],
                      engine=options.get("label", "engine"), engine_args=options.get("engine_args"),
                      seed=str(options.get("seed")), device=device_info())
    return str(write_report(options.get("report_dir") or workdir, failure))


def _child(options: dict[str, Any]) -> int:
    from mlx_invariants.fuzz.command import build_factory
    from mlx_invariants.fuzz.driver import DriverSettings
    from mlx_invariants.fuzz.runner import run_fuzz

    factory = build_factory(options)
    last = [0.0]

    def progress(state: Any) -> None:
        now = time.monotonic()
        if now - last[0] >= 0.5:
            last[0] = now
            print(json.dumps({"progress": {"examples": state.examples, "failed": state.failed,
                                           "elapsed_s": round(state.elapsed_s, 1)}}), flush=True)

    result = run_fuzz(factory, profile=options["profile"], budget=options.get("budget"),
                      examples=options.get("examples"), seed=options["seed"],
                      report_dir=options.get("report_dir"), workdir=options["workdir"], progress=progress,
                      reuse=options.get("reuse"), settings=DriverSettings(strict=bool(options.get("strict"))))
    print(json.dumps({"result": {
        "examples": result.examples, "elapsed_s": round(result.elapsed_s, 1),
        "engines_started": result.engines_started,
        "headline": result.failure.headline if result.failure else None,
        "report_dir": str(result.report_dir) if result.report_dir else None,
    }}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_child(json.loads(sys.argv[1])))
