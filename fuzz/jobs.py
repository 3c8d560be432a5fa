"""Fuzz in child processes: `--jobs N` runs N of them, each with its own seed and work folder.

A child that dies inside MLX (Metal aborts the whole process) cannot report
itself; the parent then reads the `current.json` the child wrote before the
scenario started and turns it into a crash report with a replay command.
The parent hands each child its target and settings as one JSON argument
(`Target.to_dict`, `FuzzSettings.to_dict`), so a child runs exactly what was
asked; children talk to the parent in JSON lines on stdout: progress, then a
result (the child's `fuzz.summary.RunSummary`, the same value its summary.json
holds), or a setup error (a server that never came up), which the parent
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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional

from mlx_invariants.errors import UsageError
from mlx_invariants.fuzz.case import load_case
from mlx_invariants.fuzz.errors import SetupError
from mlx_invariants.fuzz.evidence import JobPart, merge_summaries, summarize, write_merged_folder
from mlx_invariants.fuzz.lifeline import exit_with_parent
from mlx_invariants.fuzz.oracles import Violation
from mlx_invariants.fuzz.report import Failure, device_info, write_report
from mlx_invariants.fuzz.runner import Progress, run_fuzz
from mlx_invariants.fuzz.settings import FuzzSettings
from mlx_invariants.fuzz.summary import RunSummary
from mlx_invariants.fuzz.target import Target
from mlx_invariants.fuzz.trace import Trace


@dataclass
class JobOutcome:
    """One child, as the parent hears from it: its `RunSummary` at the end, or why it died."""

    job: int
    summary: Optional[RunSummary] = None   # the child's result line
    examples: int = 0                      # as last reported (the summary's, once it came)
    crashed: Optional[str] = None
    report_dir: Optional[str] = None       # a child that died: the crash report of the scenario it was running
    setup_error: Optional[str] = None

    @property
    def failed(self) -> bool:
        return self.crashed is not None or (self.summary is not None and self.summary.failed)

    @property
    def headline(self) -> Optional[str]:
        """The first new finding's headline, or why the child died."""
        new = self.summary.new_findings if self.summary else []
        return new[0].headline if new else self.crashed

    @property
    def engines_started(self) -> int:
        return self.summary.engines_started if self.summary else 0


@dataclass
class JobsRun:
    outcomes: list[JobOutcome]
    summary: RunSummary     # the one job's, or merged over the jobs (`fuzz.evidence.merge_summaries`)


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
                take_line(line, states[i], outcomes[i])
            progress(states)
        for i, process in children.items():
            code = process.wait()
            if outcomes[i].setup_error is not None:
                raise SetupError(outcomes[i].setup_error)
            if code != 0 and outcomes[i].summary is None:
                outcomes[i].crashed = _describe_exit(code)
                outcomes[i].examples = states[i]["examples"]
                outcomes[i].report_dir = _crash_report(target, child_settings[i], outcomes[i].crashed)
    finally:
        for process in children.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            process.stdin.close()
    if jobs == 1 and outcomes[0].summary is not None:
        return JobsRun(outcomes, outcomes[0].summary)
    parts = [JobPart(o.job, s.seed, o.summary, o.crashed, o.report_dir, o.examples)
             for o, s in zip(outcomes, child_settings)]
    if jobs == 1 or not settings.report_dir:
        return JobsRun(outcomes, merge_summaries(target, parts))
    return JobsRun(outcomes, write_merged_folder(run_root, target, parts))


def result_line(summary: RunSummary) -> str:
    """The child's last line: its run, as the parent reads it back (`take_line`)."""
    return json.dumps({"result": summary.to_json()})


def take_line(line: str, state: dict[str, Any], outcome: JobOutcome) -> None:
    """One line from a child: progress into `state`, its result or setup error into `outcome`."""
    try:
        message = json.loads(line)
    except json.JSONDecodeError:
        return
    if "progress" in message:
        state.update(message["progress"])
    elif "setup_error" in message:
        outcome.setup_error = message["setup_error"]
    elif "result" in message:
        outcome.summary = RunSummary.from_json(message["result"])
        outcome.examples = outcome.summary.examples
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
    print(result_line(result.summary or summarize(result)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_child(json.loads(sys.argv[1])))
