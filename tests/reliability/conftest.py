"""Reliability fixtures: a `report` each test fills with its outcome and figures.

With RELIABILITY_REPORT=FILE set (the `benchmarks/reliability.py` script does),
every test appends one JSON line to FILE: suite, case, what was tried (the
test's docstring), whether it held (passed), its one-line outcome and figures.
That file is the only source of `docs/reliability.md`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import pytest

REPORT_ENV = "RELIABILITY_REPORT"
LOAD_SECONDS_ENV = "RELIABILITY_LOAD_S"
DEFAULT_LOAD_SECONDS = 12.0


@dataclass
class Report:
    """What a test found, in words and figures, whether it held or not."""

    outcome: str = ""
    figures: dict[str, Any] = field(default_factory=dict)

    def add(self, **figures: Any) -> None:
        self.figures.update(figures)


@pytest.fixture
def report() -> Report:
    return Report()


@pytest.fixture(scope="session")
def load_seconds() -> float:
    """How long each load run lasts: short in the default run, `--minutes` in the script."""
    return float(os.environ.get(LOAD_SECONDS_ENV, DEFAULT_LOAD_SECONDS))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    path = os.environ.get(REPORT_ENV)
    result = outcome.get_result()
    if not path or not (result.when == "call" or (result.when == "setup" and not result.passed)):
        return
    found = getattr(item, "funcargs", {}).get("report")
    doc = (getattr(item, "function", None).__doc__ or "").strip().splitlines()
    known_bug = getattr(result, "wasxfail", None)
    line = {
        "suite": item.module.__name__.rsplit(".", 1)[-1].removeprefix("test_"),
        "case": item.name.removeprefix("test_"),
        "test": item.nodeid,
        "tried": doc[0] if doc else item.name,
        "held": result.passed,
        "known_bug": known_bug,
        "outcome": (found.outcome if found else "") or _failure_line(result),
        "figures": found.figures if found else {},
        "seconds": round(result.duration, 2),
    }
    if not result.passed:
        line["failure"] = _failure_line(result)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(line, default=str) + "\n")


def _failure_line(result: pytest.TestReport) -> str:
    if result.passed:
        return "held"
    if getattr(result, "wasxfail", None) is not None:
        return f"still failing as known: {result.wasxfail}"
    text = str(result.longrepr) if result.longrepr else "failed"
    errors = [l.strip() for l in text.splitlines() if l.lstrip().startswith("E ")]
    return (errors[0].removeprefix("E").strip() if errors else text.splitlines()[-1])[:300]
