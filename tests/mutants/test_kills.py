"""The whole catalogue against the static and test layers: each must kill every mutant it is named for.

This is the check that the harness catches the regressions it exists for: a
must-kill run (`invariants mutants --must-kill --layers static,tests`) on a
clean baseline, where each mutant goes through every one of those layers its
entry names, and a layer that misses fails even when another killed. The fuzz
layer's must-kills are held by tests/mutants/test_fuzz_kills.py (by generation
alone, shrunk, replayed), so they are not run here. About two minutes on two
cores for the whole catalogue (see docs/mutants.md): nightly; each run takes a sample.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mlx_invariants.mutants import CATALOGUE
from mlx_invariants.mutants.runner import Runner
from mlx_invariants.mutants.table import render, summary

REPO = Path(__file__).resolve().parents[2]


# A sample each run (both layers, both routes, a static-only entry): the whole catalogue took 165 s of the
# default run's slower group on two cores, so it is nightly (`-m slow`), as the fuzz layer's hunts are.
SAMPLE = ("M02-lock-reentered", "M04-drain-catches-exception-only", "M09-drain-and-batch-admission",
          "M12-warmup-probe-leaks")
EVERY = pytest.param(tuple(m.id for m in CATALOGUE), id="catalogue", marks=pytest.mark.slow)


@pytest.mark.timeout(900)  # the whole catalogue, not one test: about two minutes on two cores
@pytest.mark.parametrize("ids", [pytest.param(SAMPLE, id="sample"), EVERY])
def test_every_mutant_is_killed_by_each_static_and_test_layer_that_must_kill_it(ids: tuple[str, ...]):
    mutants = [m for m in CATALOGUE if m.id in ids]
    report = Runner(REPO, jobs=2, must_kill=True, layer_names=("static", "tests"), progress=print).run(mutants)
    table = f"{render(report)}\n{summary(report)}"
    print(table)
    assert report.baseline_clean, table
    assert not report.survivors and not report.missing, table
    assert {m.id for m in report.not_required} == {m.id for m in mutants if set(m.must_kill) == {"fuzz"}}
