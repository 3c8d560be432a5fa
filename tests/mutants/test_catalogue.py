"""The catalogue stays honest: every regression is there, applies to today's engine, and changes it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from mlx_invariants.mutants import CATALOGUE, Edit, Mutant, NoLongerApplies, UnknownMutant, select
from mlx_invariants.mutants.workspace import Workspace

REPO = Path(__file__).resolve().parents[2]


def test_catalogue_has_the_eighteen_regressions_in_order():
    numbers = [m.id.split("-", 1)[0] for m in CATALOGUE]
    assert numbers == [f"M{n:02d}" for n in range(1, 19)]
    for mutant in CATALOGUE:
        assert re.fullmatch(r"M\d\d(-[a-z0-9]+)+", mutant.id), mutant.id
        assert mutant.story.strip() and mutant.invariant and mutant.title and mutant.edits, mutant.id
        assert mutant.killers, f"{mutant.id} names no check expected to kill it"
        assert all(k.split(":", 1)[0] in ("static", "test", "fuzz") for k in mutant.killers), mutant.id
        assert set(mutant.routes) <= {"simple", "batched"}, mutant.id


@pytest.mark.parametrize("mutant", CATALOGUE, ids=[m.id for m in CATALOGUE])
def test_mutant_applies_to_a_copy_and_changes_its_files(mutant: Mutant):
    with Workspace(REPO, mutant) as ws:
        for name in mutant.files:
            mutated = (ws.root / name).read_text()
            assert mutated != (REPO / name).read_text(), f"{mutant.id} left {name} unchanged"
            ast.parse(mutated, filename=name)


@pytest.mark.parametrize("mutant", [m for m in CATALOGUE if m.tests], ids=[m.id for m in CATALOGUE if m.tests])
def test_targeted_tests_exist(mutant: Mutant):
    """A renamed engine test would otherwise turn a targeted run into 'no tests ran'."""
    for node in mutant.tests:
        path, name = node.split("::", 1)
        tree = ast.parse((REPO / path).read_text())
        functions = {f.name for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)}
        assert name.split("[", 1)[0] in functions, f"{mutant.id}: {node} does not exist"


def test_a_stale_anchor_fails_loudly(tmp_path):
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "serial.py").write_text("def f():\n    return 1\n")
    stale = Mutant("M99-stale", "t", "s", "i", ("test:x",), (Edit("engine/serial.py", "return 2", "return 3"),))
    with pytest.raises(NoLongerApplies, match="mutant M99-stale no longer applies: engine changed"):
        stale.apply(tmp_path)
    assert (tmp_path / "engine" / "serial.py").read_text() == "def f():\n    return 1\n"


def test_an_anchor_found_twice_fails_loudly(tmp_path):
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "serial.py").write_text("def f():\n    return 1\n\ndef g():\n    return 1\n")
    twice = Mutant("M98-twice", "t", "s", "i", ("test:x",), (Edit("engine/serial.py", "return 1", "return 0"),))
    with pytest.raises(NoLongerApplies, match="more than once"):
        twice.apply(tmp_path)


def test_edit_keeps_the_anchor_indentation(tmp_path):
    (tmp_path / "m.py").write_text("class A:\n    def f(self):\n        x = 1\n        return x\n")
    Edit("m.py", "x = 1\nreturn x\n", "return 2\n").apply(tmp_path, "M97-indent")
    assert (tmp_path / "m.py").read_text() == "class A:\n    def f(self):\n        return 2\n"


def test_only_selects_by_id_or_number():
    assert [m.id for m in select(["M07"])] == ["M07-stop-flag-ignored"]
    assert [m.id for m in select(["7", "m01-slot-freed-on-cancel"])] == ["M01-slot-freed-on-cancel",
                                                                         "M07-stop-flag-ignored"]
    assert select(None) == list(CATALOGUE)
    with pytest.raises(UnknownMutant, match="no mutant 'M42'"):
        select(["M42"])
