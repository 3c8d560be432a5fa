"""The three checks a mutant must not get past, each run in a subprocess against a `Workspace`.

A layer *kills* a mutant only by reporting what it exists to report: findings
(static checker exit 1), failing or hanging engine tests (pytest exit 1), or
violations (fuzzer exit 1). A crash, a usage error or a collection error is an
`error`, never a kill: a broken harness must not look like a caught bug.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Optional, Sequence

from mlx_invariants.mutants.fuzzing import MARK
from mlx_invariants.mutants.workspace import Workspace
TAIL = 2000


@dataclass(frozen=True)
class Outcome:
    """What one layer said about one copy."""

    layer: str
    verdict: str           # "killed", "survived", "error" or "timeout"
    by: str = ""           # rule ids, test ids or violation kinds
    seconds: float = 0.0
    detail: str = ""       # the end of the output, for errors

    @property
    def killed(self) -> bool:
        return self.verdict == "killed"


@dataclass(frozen=True)
class Settings:
    test_timeout_s: int = 15       # per engine test: a deadlock is a kill, found in this long
    layer_timeout_s: float = 600.0
    fuzz_timeout_s: float = 300.0  # the ci profile's budget is 120 s: a fuzzer still running at 300 s is hung
    fuzz_budget_s: Optional[float] = None  # the fuzzer's wall budget instead of the ci profile's (benchmarks)
    full_tests: bool = False       # the whole tests/engine instead of the targeted selection


def available(layer: str) -> Optional[str]:
    """None when `layer` can run here, else the reason it cannot."""
    needs = {"static": "mlx_invariants.commands.check", "tests": "pytest", "fuzz": "mlx_invariants.fuzz.runner"}[layer]
    try:
        found = importlib.util.find_spec(needs) is not None
    except ModuleNotFoundError:
        found = False
    return None if found else f"{needs} is not importable"


def _run(argv: Sequence[str], ws: Workspace, timeout: float) -> tuple[Optional[int], str, float]:
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, *argv], cwd=ws.root, env=ws.env(), stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        output = expired.output or ""
        return None, output if isinstance(output, str) else output.decode(errors="replace"), time.monotonic() - started
    return done.returncode, done.stdout, time.monotonic() - started


def static(ws: Workspace, settings: Settings, timeout: float) -> Outcome:
    """`invariants check` on the copy's engine/: any finding kills (the baseline has none)."""
    rc, output, seconds = _run(["-m", "mlx_invariants", "check", str(ws.engine_dir)], ws, timeout)
    rules = sorted(set(re.findall(r"^\S.*:\d+:\d+: (INV\d{3}) ", output, re.M)))
    if rc == 1 and rules:
        return Outcome("static", "killed", " ".join(rules), seconds)
    return _other("static", rc, output, seconds)


def engine_tests(ws: Workspace, settings: Settings, timeout: float, selection: Sequence[str]) -> Outcome:
    """The engine tests on the copy, stopping at the first failure; a hang is caught by the per-test timeout."""
    argv = ["-m", "pytest", "-x", "-v", "-rfE", "-p", "no:cacheprovider", f"--timeout={settings.test_timeout_s}"]
    rc, output, seconds = _run([*argv, *selection], ws, timeout)
    failed = _failed_test(output) if rc == 1 else None
    if failed:
        return Outcome("tests", "killed", failed, seconds)
    return _other("tests", rc, output, seconds)


def _failed_test(output: str) -> Optional[str]:
    """The first failing test, or the one pytest-timeout stopped (it ends the process: the last one started)."""
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", output, re.M)
    if failed:
        return failed[0]
    if re.search(r"^\+{5,} Timeout \+{5,}$", output, re.M):
        started = re.findall(r"^(tests/\S+::\S+)", output, re.M)
        return f"{started[-1]} (hung)" if started else None
    return None


def fuzz(ws: Workspace, settings: Settings, timeout: float, route: str) -> Outcome:
    """The fuzzer's ci profile on one reference route of the copy: a violation kills."""
    argv = ["-m", "mlx_invariants.mutants.fuzzing", route, str(ws.root / "fuzz-report" / route)]
    if settings.fuzz_budget_s is not None:
        argv.append(str(settings.fuzz_budget_s))
    rc, output, seconds = _run(argv, ws, min(timeout, settings.fuzz_timeout_s))
    found = [json.loads(line[len(MARK):]) for line in output.splitlines() if line.startswith(MARK)]
    if rc == 1 and found and found[0]["kind"]:
        return Outcome("fuzz", "killed", f"{route}: {found[0]['kind']}", seconds, found[0]["headline"] or "")
    if rc == 0 and not found:
        return Outcome("fuzz", "error", "exit 0 without a result line", seconds, output[-TAIL:])
    return _other("fuzz", rc, output, seconds)


def _other(layer: str, rc: Optional[int], output: str, seconds: float) -> Outcome:
    if rc == 0:
        return Outcome(layer, "survived", seconds=seconds)
    if rc is None:  # ran past its time limit
        return Outcome(layer, "timeout", seconds=seconds, detail=output[-TAIL:])
    return Outcome(layer, "error", f"exit {rc}", seconds, output[-TAIL:])
