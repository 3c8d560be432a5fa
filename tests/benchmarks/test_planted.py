"""benchmarks/planted: the outside helper's regressions still apply to today's engine and stay out of the catalogue.

Fast: each regression's edits are applied to a fresh copy of engine/ and every file they change must
still compile; nothing is run or fuzzed here (benchmarks/planted/run.py measures them).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mlx_invariants.mutants import CATALOGUE
from mlx_invariants.mutants.copies import copy_engine

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from planted.regressions import CLASSES, REGRESSIONS  # noqa: E402


def test_twenty_regressions_numbered_and_unmeasured():
    assert [m.id for m in REGRESSIONS] == [f"P{n:02d}" for n in range(1, 21)]
    assert all(m.killers == () and m.must_kill == () and m.seed == "" for m in REGRESSIONS)
    assert all(m.routes and set(m.routes) <= {"simple", "batched"} for m in REGRESSIONS)


def test_every_regression_in_one_class_and_every_class_twice():
    grouped = [rid for ids in CLASSES.values() for rid in ids]
    assert sorted(grouped) == sorted(m.id for m in REGRESSIONS)
    assert all(len(ids) >= 2 for ids in CLASSES.values())


def test_kept_apart_from_the_catalogue():
    assert not {m.id for m in REGRESSIONS} & {m.id for m in CATALOGUE}
    catalogued = {m.edits for m in CATALOGUE}
    assert not any(m.edits in catalogued for m in REGRESSIONS)


@pytest.mark.parametrize("mutant", REGRESSIONS, ids=lambda m: m.id)
def test_edits_apply_to_todays_engine_and_compile(mutant, tmp_path):
    copy = tmp_path / "engine"
    copy_engine(REPO / "engine", copy, mutant)  # raises NoLongerApplies if an anchor is gone or ambiguous
    for path in mutant.files:
        relative = path[len("engine/"):]
        mutated = (copy / relative).read_text()
        assert mutated != (REPO / path).read_text(), f"{mutant.id} left {path} unchanged"
        compile(mutated, str(copy / relative), "exec")
