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


# -- benchmarks/planted/run.py: the set through unseen_mutants' run (nothing is run here) --------------------

from planted import run as planted_run  # noqa: E402


def test_only_selects_in_the_sets_order_and_refuses_unknown_ids():
    assert [m.id for m in planted_run.select("")] == [m.id for m in REGRESSIONS]
    assert [m.id for m in planted_run.select("18, p05")] == ["P05", "P18"]
    with pytest.raises(ValueError, match="P99"):
        planted_run.select("P05,P99")


def test_each_regression_runs_the_engine_tests_of_the_layers_it_changes():
    import unseen_mutants

    by_id = {m.id: planted_run.with_tests(m) for m in REGRESSIONS}
    core, http = set(unseen_mutants.CORE_TESTS), set(unseen_mutants.HTTP_TESTS)
    assert set(by_id["P01"].tests) == core            # serial.py
    assert set(by_id["P07"].tests) == http            # http/app.py
    assert set(by_id["P06"].tests) == core | http     # serial.py and http/payloads.py
    assert all(m.killers == () for m in REGRESSIONS)  # the set itself stays unmeasured


def test_the_table_and_headline_count_kills_out_of_the_whole_set():
    from mlx_invariants.mutants.layers import Outcome
    from mlx_invariants.mutants.runner import Result

    chosen = planted_run.select("P05,P17,P18")
    results = [Result(chosen[0], [Outcome("static", "survived"), Outcome("fuzz", "killed", "batched: some-kind")]),
               Result(chosen[1], [Outcome("tests", "killed", "tests/engine/x.py::t"), Outcome("fuzz", "survived")]),
               Result(chosen[2], [Outcome("static", "survived"), Outcome("tests", "killed", "tests/engine/x.py::t")])]
    table = planted_run.unseen_mutants.render(results, [planted_run.row(m) for m in chosen], ["static", "tests", "fuzz"],
                                              kind="class", place="files")
    assert table.splitlines()[0] == "| mutant | class | files | check | tests | fuzz | killed by | time |"
    assert "| P05 | MLX used off the owner thread | batched.py | survived | not run | KILL batched: some-kind |" in table
    assert planted_run.headline(results, 20) == "fuzz kills 1/20, all layers 3/20"
