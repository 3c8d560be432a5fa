"""A layer kills only with evidence: a finding, a failing or hung test, a violation; a crash is an error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlx_invariants.mutants import layers
from mlx_invariants.mutants.fuzzing import MARK
from mlx_invariants.mutants.layers import Settings
from mlx_invariants.mutants.workspace import Workspace


@pytest.fixture
def answer(monkeypatch):
    """Make every layer's subprocess answer with (exit code, output)."""
    def set_answer(rc, output):
        monkeypatch.setattr(layers, "_run", lambda argv, ws, timeout: (rc, output, 0.5))
    return set_answer


WS = Workspace(Path("."))


@pytest.mark.parametrize("rc, output, verdict, by", [
    (1, "/tmp/x/engine/serial.py:12:9: INV105 shield the worker\n/tmp/x/engine/a.py:1:1: INV101 m\n",
     "killed", "INV101 INV105"),
    (0, "", "survived", ""),
    (1, "Traceback (most recent call last):\nModuleNotFoundError: No module named 'x'\n", "error", "exit 1"),
    (2, "invariants check: bad option\n", "error", "exit 2"),
    (None, "", "timeout", ""),
])
def test_static_layer_kills_only_on_findings(answer, rc, output, verdict, by):
    answer(rc, output)
    outcome = layers.static(WS, Settings(), 10)
    assert (outcome.verdict, outcome.by) == (verdict, by)


@pytest.mark.parametrize("rc, output, verdict, by", [
    (1, "FAILED tests/engine/test_serial.py::test_a - AssertionError\n", "killed", "tests/engine/test_serial.py::test_a"),
    (1, "tests/engine/test_serial.py::test_a PASSED\ntests/engine/test_serial.py::test_b \n"
        "++++++++++++++++++++ Timeout ++++++++++++++++++++\n", "killed", "tests/engine/test_serial.py::test_b (hung)"),
    (1, "Traceback (most recent call last):\nImportError: boom\n", "error", "exit 1"),
    (2, "ERROR collecting tests/engine/test_serial.py\n", "error", "exit 2"),
    (5, "no tests ran\n", "error", "exit 5"),
])
def test_tests_layer_kills_only_on_a_failing_or_hung_test(answer, rc, output, verdict, by):
    answer(rc, output)
    outcome = layers.engine_tests(WS, Settings(), 10, ["tests/engine"])
    assert (outcome.verdict, outcome.by) == (verdict, by)


def _fuzz_line(kind):
    return MARK + json.dumps({"kind": kind, "headline": f"{kind}: x" if kind else None, "examples": 3,
                              "seconds": 1.0, "report": None}) + "\n"


@pytest.mark.parametrize("rc, output, verdict, by", [
    (1, _fuzz_line("slot-freed-early"), "killed", "simple: slot-freed-early"),
    (0, _fuzz_line(None), "survived", ""),
    (1, "Traceback (most recent call last):\nRuntimeError: the driver broke\n", "error", "exit 1"),
    (0, "", "error", "exit 0 without a result line"),
])
def test_fuzz_layer_kills_only_on_a_violation(answer, rc, output, verdict, by):
    answer(rc, output)
    outcome = layers.fuzz(WS, Settings(), 10, "simple")
    assert (outcome.verdict, outcome.by) == (verdict, by)
