"""The whole catalogue against every layer: each mutant must be killed, on a clean baseline.

This is the check that the harness catches the regressions it exists for; a
survivor is a missing rule, oracle or engine test. It takes about two minutes
on two cores (see docs/mutants.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mlx_invariants.mutants import CATALOGUE
from mlx_invariants.mutants.runner import Runner
from mlx_invariants.mutants.table import render, summary

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(900)  # the whole catalogue, not one test: about two minutes on two cores
def test_every_mutant_in_the_catalogue_is_killed():
    report = Runner(REPO, jobs=2, progress=print).run(CATALOGUE)
    table = f"{render(report)}\n{summary(report)}"
    print(table)
    assert report.baseline_clean, table
    assert not report.survivors, table
