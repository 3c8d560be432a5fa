"""The whole catalogue against the static and test layers: each must kill every mutant it is named for.

This is the check that the harness catches the regressions it exists for: a
must-kill run (`invariants mutants --must-kill --layers static,tests`) on a
clean baseline, where each mutant goes through every one of those layers its
entry names, and a layer that misses fails even when another killed. The fuzz
layer's must-kills are held by tests/mutants/test_fuzz_kills.py (by generation
alone, shrunk, replayed), so they are not run here. About two minutes on two
cores (see docs/mutants.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mlx_invariants.mutants import CATALOGUE
from mlx_invariants.mutants.runner import Runner
from mlx_invariants.mutants.table import render, summary

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(900)  # the whole catalogue, not one test: about two minutes on two cores
def test_every_mutant_is_killed_by_each_static_and_test_layer_that_must_kill_it():
    report = Runner(REPO, jobs=2, must_kill=True, layer_names=("static", "tests"), progress=print).run(CATALOGUE)
    table = f"{render(report)}\n{summary(report)}"
    print(table)
    assert report.baseline_clean, table
    assert not report.survivors and not report.missing, table
    assert {m.id for m in report.not_required} == {m.id for m in CATALOGUE if set(m.must_kill) == {"fuzz"}}
