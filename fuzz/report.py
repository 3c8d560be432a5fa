"""Failure reports: the minimal scenario, how to reproduce it, what went wrong, in what order.

A report directory holds `scenario.json` (what `--replay` runs: the scenario
and its target, see `fuzz.case`), `report.json` (everything, for tools) and
`report.txt` (for people): headline, violations with both stacks, the device
it ran on, "reproduced k/N", the Hypothesis seed and reproduce blob, the
ordered event trace, and the replay command (`fuzz.reproduce`: one that works
when pasted into a shell anywhere).
"""

from __future__ import annotations

import json
import platform
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from mlx_invariants.fuzz.case import dumps_case
from mlx_invariants.fuzz.followup import is_busy
from mlx_invariants.fuzz.oracles import Violation
from mlx_invariants.fuzz.reproduce import replay_shell_command
from mlx_invariants.fuzz.scenario import Scenario
from mlx_invariants.fuzz.target import Target
from mlx_invariants.fuzz.timeline import write_timeline
from mlx_invariants.fuzz.trace import Trace


@dataclass
class Failure:
    """One violation-producing scenario and everything needed to reproduce it."""

    scenario: Scenario
    trace: Trace
    violations: list[Violation]
    target: Target
    seed: Optional[str] = None            # "1234" or "derandomized"
    blob: Optional[str] = None            # Hypothesis's @reproduce_failure decorator
    reproduced: Optional[tuple[int, int]] = None
    device: dict[str, Any] = field(default_factory=dict)
    server_log: str = ""                  # an HTTP target's last log lines when the failure was seen
    verdict: str = "VIOLATION"            # what the report's first line calls it ("FINDING (unconfirmed ...)")

    @property
    def engine(self) -> str:
        return self.target.label

    @property
    def headline(self) -> str:
        """The first violation, and the cause the trace shows when one is there to see (a refusal)."""
        first = self.violations[0]
        cause = cause_of(self.trace, first.kind)
        return f"{first.kind}: {first.message}" + (f" [{cause}]" if cause else "")




def cause_of(trace: Trace, kind: str) -> str:
    """What the evidence shows behind a violation, in a few words, or "": a refused follow-up is why a
    follow-up differs, and a busy refusal says busy wherever it appears."""
    refused = [(e.rid, str(e.info.get("code", ""))) for e in trace.of("request", "end")
               if e.info.get("outcome") == "refused"]
    if kind == "followup-differs":
        for end in trace.of("request", "end", "followup"):
            outcome = end.info.get("outcome")
            if outcome == "refused":
                said = str(end.info.get("message") or "").strip()
                return f"cause: the follow-up was refused as {_refusal(end.info.get('code'))}" + (f": {said}" if said else "")
            if outcome not in (None, "completed"):
                return f"cause: the follow-up ended {outcome}: {end.info.get('message') or end.info.get('error') or ''}".strip(": ")
    if refused:
        return "evidence: " + ", ".join(f"{rid} refused as {_refusal(code)}" for rid, code in refused)
    return ""


def _refusal(code: Any) -> str:
    return f"busy ({code})" if is_busy(code) else f"{code or 'refused'}"


def device_info() -> dict[str, Any]:
    """Where MLX ran, so a CPU run is never mistaken for a GPU one."""
    info: dict[str, Any] = {"platform": platform.platform(), "python": platform.python_version()}
    try:
        import mlx.core as mx
    except ImportError:
        return info
    info["mlx"] = getattr(mx, "__version__", "?")
    info["default_device"] = str(mx.default_device())
    metal = getattr(mx, "metal", None)
    if metal is not None and metal.is_available():
        details = metal.device_info() if hasattr(metal, "device_info") else {}
        info["metal"] = {k: details[k] for k in ("device_name", "architecture") if k in details}
    else:
        info["metal"] = None
    cuda = getattr(mx, "cuda", None)
    info["cuda"] = bool(cuda is not None and hasattr(cuda, "is_available") and cuda.is_available())
    try:
        import mlx_lm
        info["mlx_lm"] = mlx_lm.__version__
    except (ImportError, AttributeError):
        pass
    return info


def write_report(directory: str | Path, failure: Failure, name: Optional[str] = None) -> Path:
    """Write the report into a new folder under `directory` (named `name`, or by time, engine and oracle);
    returns that folder: scenario.json, report.json, report.txt, replay.sh, timeline.svg."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", name or f"{stamp}-{failure.engine}-{failure.violations[0].kind}")
    folder = Path(directory) / slug
    suffix = 1
    while folder.exists():
        suffix += 1
        folder = Path(directory) / f"{slug}-{suffix}"
    folder.mkdir(parents=True)
    scenario_path = folder / "scenario.json"
    scenario_path.write_text(dumps_case(failure.scenario, failure.target) + "\n")
    replay = replay_shell_command(scenario_path, failure.target)
    (folder / "report.json").write_text(json.dumps({
        "headline": failure.headline,
        "engine": failure.engine,
        "target": failure.target.to_dict(),
        "scenario": failure.scenario.to_json(),
        "violations": [v.to_json() for v in failure.violations],
        "seed": failure.seed,
        "reproduce_blob": failure.blob,
        "reproduced": list(failure.reproduced) if failure.reproduced else None,
        "device": failure.device,
        "replay": replay,
        "server_log": failure.server_log or None,
        "trace": failure.trace.to_json(),
    }, indent=2, default=str) + "\n")
    (folder / "report.txt").write_text(render(failure, replay))
    (folder / "replay.sh").write_text(f"#!/bin/sh\n{replay}\n")
    # Further views of the same failure are written here, beside the report.
    write_timeline(folder / "timeline.svg", failure.trace, f"{failure.engine}: {failure.headline}",
                   [f"scenario: {failure.scenario.describe()}"])
    return folder


def render(failure: Failure, replay: str) -> str:
    """The human report (report.txt), ending its header with the `replay` command: what to read first comes
    first."""
    lines = [f"FUZZ {failure.verdict} in {failure.engine}: {failure.headline}", ""]
    lines.append(f"target:     {failure.target.describe()}")
    lines.append(f"scenario:   {failure.scenario.describe()}")
    if failure.reproduced:
        k, n = failure.reproduced
        lines.append(f"reproduced: {k}/{n} automatic replays")
    lines.append(f"device:     {device_line(failure.device)}")
    lines.append(f"seed:       {failure.seed or 'n/a'}")
    if failure.blob:
        lines.append(f"blob:       {failure.blob}")
    server = failure.trace.meta.get("server")
    if server:
        state = "running" if server.get("exit") is None else f"exited ({server['exit']})"
        lines.append(f"server:     pid {server.get('pid')} at {server.get('url')}, start {server.get('start')} of this "
                     f"run, {state} when the scenario ended")
    if failure.trace.meta.get("reused"):
        lines.append(f"engine:     reused; it had run {failure.trace.meta['reused']} scenario(s) before this one")
    lines.append(f"replay:     {replay}")
    lines.append("")
    for number, violation in enumerate(failure.violations, 1):
        lines.append(f"[{number}] {violation.kind}: {violation.message}")
        for label, stack in zip(("first", "second"), violation.stacks):
            if stack:
                lines.append(f"    {label} stack:")
                lines.extend(f"      {frame}" for frame in stack[-12:])
        if violation.detail:
            lines.append("    detail:")
            lines.extend(f"      {line}" for line in violation.detail.splitlines()[:200])
        lines.append("")
    if failure.server_log:
        lines.append("server log (last lines):")
        lines.extend(f"  {line}" for line in failure.server_log.splitlines())
        lines.append("")
    lines.append("minimal scenario:")
    lines.extend(f"  {line}" for line in failure.scenario.dumps().splitlines())
    lines.append("")
    lines.append("event trace (MLX spans folded into counts):")
    lines.extend(f"  {line}" for line in _trace_lines(failure.trace))
    return "\n".join(lines) + "\n"


def device_line(device: dict[str, Any]) -> str:
    if not device:
        return "unknown"
    accel = "Metal " + str(device["metal"]) if device.get("metal") else ("CUDA" if device.get("cuda") else "CPU only")
    return f"{device.get('default_device', '?')} ({accel}), mlx {device.get('mlx', '?')}, {device.get('platform', '')}"


def _trace_lines(trace: Trace) -> list[str]:
    """Every non-MLX event; runs of MLX spans on one thread become one line, unless they matter."""
    out: list[str] = []
    run: list[Any] = []

    def flush() -> None:
        if run:
            out.append(f"{run[0].seq:>5}..{run[-1].end or run[-1].seq:<5} {len(run)} MLX call(s) "
                       f"[{run[0].who}]")
            run.clear()
    for event in sorted(trace.events, key=lambda e: e.seq):
        if event.kind == "mlx" and not event.info and (not run or run[-1].thread == event.thread):
            run.append(event)
            continue
        flush()
        out.append(event.line())
    flush()
    return out
