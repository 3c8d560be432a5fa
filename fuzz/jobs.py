"""Fuzz in child processes: `--jobs N` runs N of them, each with its own seed and work folder.

A child that dies inside MLX (Metal aborts the whole process) cannot report
itself; the parent then reads the `current.json` the child wrote before the
scenario started and turns it into a crash report with a replay command.
The parent hands each child its target and settings as one JSON argument
(`Target.to_dict`, `FuzzSettings.to_dict`), so a child runs exactly what was
asked; children talk to the parent in JSON lines on stdout: progress, then a
result, or a setup error (a server that never came up), which the parent
raises as a `SetupError` (exit 2), never as a crash. Each child writes its run
folder (`fuzz.evidence`): one job its own `<time>-<target>` folder; several jobs
`<time>-<target>/job<i>`, and the parent then writes the merged summary of
all of them in `<time>-<target>` (`fuzz.evidence.write_merged_folder`).
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional

from mlx_invariants.errors import UsageError
from mlx_invariants.fuzz.case import load_case
from mlx_invariants.fuzz.errors import SetupError
from mlx_invariants.fuzz.evidence import distinct, write_merged_folder
from mlx_invariants.fuzz.lifeline import exit_with_parent
from mlx_invariants.fuzz.oracles import Violation
from mlx_invariants.fuzz.report import Failure, device_info, write_report
from mlx_invariants.fuzz.runner import Progress, run_fuzz
from mlx_invariants.fuzz.settings import FuzzSettings
from mlx_invariants.fuzz.target import Target
from mlx_invariants.fuzz.trace import Trace


@dataclass
class JobOutcome:
    job: int
    examples: int = 0
    elapsed_s: float = 0.0
    headline: Optional[str] = None       # the first new finding's
    report_dir: Optional[str] = None     # its report folder (or the crash report's)
    crashed: Optional[str] = None
    engines_started: int = 0
    run_dir: Optional[str] = None
    findings: list[dict[str, Any]] = field(default_factory=list)   # `Finding.to_json()` of each
    setup_error: Optional[str] = None

    @property
    def failed(self) -> bool:
        return self.headline is not None or self.crashed is not None


@dataclass
class JobsRun:
    outcomes: list[JobOutcome]
    findings: list[dict[str, Any]]    # distinct across jobs (`fuzz.evidence.distinct`)
    run_dir: Optional[str] = None     # the merged run folder of several jobs, or the one job's


def run_jobs(target: Target, settings: FuzzSettings, jobs: int, workroot: Path,
             progress: Callable[[list[dict[str, Any]]], None]) -> JobsRun:
    """Start `jobs` children fuzzing `target` with `settings` (seed + 1000·i each, work folder
    `workroot/job<i>`); wait for all, reporting progress as it comes; write the merged run folder."""
    target.check()  # a target that builds nothing fails here, once, not in every child
    workroot.mkdir(parents=True, exist_ok=True)
    base_seed = settings.seed
    if base_seed is None and jobs > 1:
        base_seed = int.from_bytes(os.urandom(4), "little")  # one job alone keeps its profile's seeding
    children: dict[int, subprocess.Popen] = {}
    selector = selectors.DefaultSelector()
    states: list[dict[str, Any]] = [{"examples": 0, "failed": False, "elapsed_s": 0.0} for _ in range(jobs)]
    outcomes = [JobOutcome(i) for i in range(jobs)]
    run_root = (f"{settings.report_dir}/{time.strftime('%Y%m%d-%H%M%S')}-"
                f"{''.join(c if c.isalnum() or c in '_.-' else '-' for c in target.label)[:80]}")
    child_settings = [replace(settings, seed=None if base_seed is None else base_seed + i * 1000,
                              workdir=str(workroot / f"job{i}"),
                              run_dir=f"{run_root}/job{i}" if jobs > 1 and settings.report_dir else None)
                      for i in range(jobs)]
    for i in range(jobs):
        message = json.dumps({"target": target.to_dict(), "settings": child_settings[i].to_dict()})
        # stdin is the child's lifeline: it ends when this process does, however it ends (`fuzz.lifeline`).
        process = subprocess.Popen([sys.executable, "-m", "mlx_invariants.fuzz.jobs", message],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                   text=True, bufsize=1)
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
            if outcomes[i].setup_error is not None:
                raise SetupError(outcomes[i].setup_error)
            if code != 0 and outcomes[i].headline is None:
                outcomes[i].crashed = _describe_exit(code)
                outcomes[i].examples = states[i]["examples"]
                outcomes[i].report_dir = _crash_report(target, child_settings[i], outcomes[i].crashed)
    finally:
        for process in children.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            process.stdin.close()
    if jobs == 1:
        return JobsRun(outcomes, outcomes[0].findings, outcomes[0].run_dir)
    rows = [{"job": o.job, "seed": s.seed, "run_dir": o.run_dir, "crashed": o.crashed, "report": o.report_dir,
             "examples": o.examples} for o, s in zip(outcomes, child_settings)]
    if not settings.report_dir:
        return JobsRun(outcomes, distinct([{**f, "job": o.job} for o in outcomes for f in o.findings]))
    summary = write_merged_folder(run_root, target, rows)
    return JobsRun(outcomes, summary["findings"], run_root)


def _take_line(line: str, state: dict[str, Any], outcome: JobOutcome) -> None:
    try:
        message = json.loads(line)
    except json.JSONDecodeError:
        return
    if "progress" in message:
        state.update(message["progress"])
    elif "setup_error" in message:
        outcome.setup_error = message["setup_error"]
    elif "result" in message:
        result = message["result"]
        outcome.examples = result["examples"]
        outcome.elapsed_s = result["elapsed_s"]
        outcome.headline = result.get("headline")
        outcome.report_dir = result.get("report_dir")
        outcome.engines_started = result.get("engines_started", 0)
        outcome.run_dir = result.get("run_dir")
        outcome.findings = result.get("findings", [])
        state.update(examples=outcome.examples, failed=outcome.failed)


def _describe_exit(code: int) -> str:
    if code < 0:
        return f"the fuzz process was killed by {signal.Signals(-code).name}"
    return f"the fuzz process exited with status {code}"


def _crash_report(target: Target, settings: FuzzSettings, why: str) -> Optional[str]:
    """The scenario that was running when the child died (its `current.json`), as a report."""
    current = Path(settings.workdir) / "current.json"
    if not current.is_file():
        return None
    scenario, _ = load_case(current)
    failure = Failure(scenario, Trace(), [Violation("process-crashed", f"{why} while running this scenario")],
                      target, seed=str(settings.seed), device=device_info())
    return str(write_report(settings.run_dir or settings.report_dir or settings.workdir, failure))


def _child(message: dict[str, Any]) -> int:
    exit_with_parent(sys.stdin.fileno())
    target, settings = Target.from_dict(message["target"]), FuzzSettings.from_dict(message["settings"])
    last = [0.0]

    def progress(state: Progress) -> None:
        now = time.monotonic()
        if now - last[0] >= 0.5:
            last[0] = now
            print(json.dumps({"progress": {"examples": state.examples, "failed": state.failed,
                                           "elapsed_s": round(state.elapsed_s, 1), "findings": state.findings,
                                           "examples_cap": state.examples_cap}}), flush=True)

    try:
        result = run_fuzz(target, settings, progress=progress)
    except UsageError as exc:
        print(json.dumps({"setup_error": str(exc)}), flush=True)
        return 2
    print(json.dumps({"result": {
        "examples": result.examples, "elapsed_s": round(result.elapsed_s, 1),
        "engines_started": result.engines_started,
        "headline": result.failure.headline if result.failure else None,
        "report_dir": str(result.report_dir) if result.report_dir else None,
        "run_dir": str(result.run_dir) if result.run_dir else None,
        "findings": [f.to_json() for f in result.findings],
    }}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_child(json.loads(sys.argv[1])))
