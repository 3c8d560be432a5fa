"""`invariants mutants` end to end: a clean baseline, a kill through the CLI, a broken baseline refused,
a must-kill layer that misses failing the run."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mlx_invariants.mutants import Edit, Mutant, select
from mlx_invariants.mutants.layers import Settings
from mlx_invariants.mutants.runner import Runner
from mlx_invariants.mutants.table import render, summary

REPO = Path(__file__).resolve().parents[2]
QUICK_TEST = "tests/engine/test_serial.py::test_generates_and_reports_usage"


@pytest.mark.timeout(900)  # a baseline of the engine tests and the mutant's: 85 s on a loaded 2-core box
def test_cli_runs_one_mutant_and_reports_its_killer():
    done = subprocess.run([sys.executable, "-m", "mlx_invariants", "mutants", "--only", "M07", "--layers", "static,tests"],
                          cwd=REPO, capture_output=True, text=True, timeout=800)
    assert done.returncode == 0, done.stdout + done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("M07-stop-flag-ignored"))
    assert "test_cancel_stops_decode_within_one_token" in row and row.split()[-1] == "no"
    assert "baseline tests: clean" in done.stderr
    assert "all 1 mutants killed" in done.stdout


def test_cli_refuses_an_unknown_mutant():
    done = subprocess.run([sys.executable, "-m", "mlx_invariants", "mutants", "--only", "M42"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "no mutant 'M42'" in done.stderr and "Traceback" not in done.stderr


def test_a_broken_baseline_fails_the_run_before_any_mutant(tmp_path):
    """The unmutated engine must pass first: here it already carries M07, so its own test fails."""
    for name in ("engine", "tests/engine"):
        shutil.copytree(REPO / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("tests/__init__.py", "tests/conftest.py", "pyproject.toml"):
        shutil.copy2(REPO / name, tmp_path / name)
    (broken,) = select(["M07"])
    broken.apply(tmp_path / "engine")
    harmless = Mutant("M90-harmless", "t", "s", "i", broken.killers,
                      (Edit("engine/drain.py", "cancelled = False", "cancelled = bool()"),))
    report = Runner(tmp_path, Settings(), layer_names=("tests",)).run([harmless])
    assert not report.baseline_clean and not report.ok
    assert [r.ran for r in report.results] == [False]
    assert "fails its own checks" in summary(report)
    assert "not run" in render(report)


def test_a_must_kill_run_fails_when_a_required_layer_misses_though_another_killed():
    """M16 (a comment) dies to the static rule; required to die to an engine test as well, it must fail the run."""
    (comment,) = select(["M16"])
    overclaimed = dataclasses.replace(comment, killers=(*comment.killers, "test:" + QUICK_TEST),
                                      must_kill=("static", "tests"))
    fuzz_only = dataclasses.replace(comment, id="M91-fuzz-only", must_kill=("fuzz",))
    report = Runner(REPO, Settings(), must_kill=True, layer_names=("static", "tests")).run([overclaimed, fuzz_only])
    assert report.baseline_clean and not report.survivors and not report.ok
    (result,) = report.results
    assert [o.layer for o in result.kills] == ["static"] and result.missed == ["tests"]
    assert [r.mutant for r in report.missing] == [overclaimed] and report.not_required == [fuzz_only]
    table = render(report)
    assert "YES (tests)" in table and "not run, no layer run here must kill them: M91-fuzz-only" in table
    assert "not killed by a layer that must kill them: M16-lock-documented-as-admission (tests)" in summary(report)
