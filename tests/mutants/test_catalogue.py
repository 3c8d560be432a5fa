"""The catalogue stays honest: every regression is there, applies to today's engine, changes it, says
which layers must kill it, and names the seed scenario of every fuzz kill it claims."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

from mlx_invariants.fuzz.corpus import SEED_SCENARIOS
from mlx_invariants.mutants import CATALOGUE, Edit, Mutant, NoLongerApplies, UnknownMutant, select
from mlx_invariants.mutants.copies import copy_engine, import_copy
from mlx_invariants.mutants.mutant import LAYERS
from mlx_invariants.mutants.workspace import Workspace

REPO = Path(__file__).resolve().parents[2]


def test_catalogue_has_the_twenty_four_regressions_in_order():
    numbers = [m.id.split("-", 1)[0] for m in CATALOGUE]
    assert numbers == [f"M{n:02d}" for n in range(1, 25)]
    for mutant in CATALOGUE:
        assert re.fullmatch(r"M\d\d(-[a-z0-9]+)+", mutant.id), mutant.id
        assert mutant.story.strip() and mutant.invariant and mutant.title and mutant.edits, mutant.id
        assert mutant.killers, f"{mutant.id} names no check expected to kill it"
        assert all(k.split(":", 1)[0] in ("static", "test", "fuzz") for k in mutant.killers), mutant.id
        assert set(mutant.routes) <= {"simple", "batched"}, mutant.id


KILLER_OF = {"static": "static:", "tests": "test:", "fuzz": "fuzz:"}


@pytest.mark.parametrize("mutant", CATALOGUE, ids=[m.id for m in CATALOGUE])
def test_every_layer_that_must_kill_names_how(mutant: Mutant):
    """tests/mutants/test_kills.py holds static and tests to it, test_fuzz_kills.py fuzz: each needs its killer."""
    assert mutant.must_kill, f"{mutant.id} names no layer that must kill it"
    assert len(set(mutant.must_kill)) == len(mutant.must_kill) and set(mutant.must_kill) <= set(LAYERS), mutant.id
    for layer in mutant.must_kill:
        named = any(k.startswith(KILLER_OF[layer]) for k in mutant.killers)
        assert named, f"{mutant.id}: {layer} must kill it, but its killers name no check of that layer"
    fuzzed = "fuzz" in mutant.must_kill
    assert bool(mutant.seed) == fuzzed, f"{mutant.id}: a seed scenario goes with a fuzz must-kill, and only with one"
    assert not fuzzed or (mutant.routes and mutant.seed in SEED_SCENARIOS), f"{mutant.id}: no route or no seed"


def test_every_seed_scenario_is_the_seed_of_one_entry():
    """The fuzzer's seed corpus and the catalogue cannot drift: each seed belongs to exactly one entry."""
    owners = {key: [m.id for m in CATALOGUE if m.seed == key] for key in SEED_SCENARIOS}
    assert {key: ids for key, ids in owners.items() if len(ids) != 1} == {}


def test_an_entry_kept_apart_from_its_sibling_says_which_one():
    numbers = {m.id[:3] for m in CATALOGUE}
    for mutant in (m for m in CATALOGUE if m.apart):
        siblings = set(re.findall(r"\bM\d\d\b", mutant.apart)) - {mutant.id[:3]}
        assert siblings and siblings <= numbers, f"{mutant.id}: `apart` names no sibling entry of the catalogue"


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
    (tmp_path / "serial.py").write_text("def f():\n    return 1\n")
    stale = Mutant("M99-stale", "t", "s", "i", ("test:x",), (Edit("engine/serial.py", "return 2", "return 3"),))
    with pytest.raises(NoLongerApplies, match="mutant M99-stale no longer applies: engine changed"):
        stale.apply(tmp_path)
    assert (tmp_path / "serial.py").read_text() == "def f():\n    return 1\n"


def test_an_anchor_found_twice_fails_loudly(tmp_path):
    (tmp_path / "serial.py").write_text("def f():\n    return 1\n\ndef g():\n    return 1\n")
    twice = Mutant("M98-twice", "t", "s", "i", ("test:x",), (Edit("engine/serial.py", "return 1", "return 0"),))
    with pytest.raises(NoLongerApplies, match="more than once"):
        twice.apply(tmp_path)


def test_edit_keeps_the_anchor_indentation(tmp_path):
    (tmp_path / "m.py").write_text("class A:\n    def f(self):\n        x = 1\n        return x\n")
    Edit("engine/m.py", "x = 1\nreturn x\n", "return 2\n").apply(tmp_path, "M97-indent")
    assert (tmp_path / "m.py").read_text() == "class A:\n    def f(self):\n        return 2\n"


def test_an_edit_outside_the_engine_is_refused():
    with pytest.raises(ValueError, match="changes the engine only"):
        Edit("tests/engine/test_serial.py", "a", "b")


@pytest.mark.parametrize("mutant", CATALOGUE, ids=[m.id for m in CATALOGUE])
def test_a_renamed_copy_is_the_workspace_copy_under_another_name(mutant: Mutant, tmp_path: Path):
    """One copy mechanism: the fuzz-kill tests' in-process copy differs from the workspace's only by its name."""
    renamed = tmp_path / mutant.package
    copy_engine(REPO / "engine", renamed, mutant, package=mutant.package)
    with Workspace(REPO, mutant) as ws:
        for original in sorted(ws.engine_dir.rglob("*.py")):
            relative = original.relative_to(ws.engine_dir)
            text = (renamed / relative).read_text()
            assert "mlx_invariants.engine" not in text, f"{relative} still imports the real engine"
            assert text == original.read_text().replace("mlx_invariants.engine", mutant.package), relative


def test_a_renamed_copy_imports_beside_the_real_engine(tmp_path: Path):
    (mutant,) = select(["M16"])  # a comment: importing the copy runs nothing it changed
    package = import_copy(mutant, tmp_path)
    module = sys.modules[package]
    assert package == mutant.package and module.SimpleEngine.__module__ == f"{package}.serial"
    assert "# Admission: requests wait here" in (Path(module.__file__).parent / "serial.py").read_text()
    assert "# Admission" not in (REPO / "engine" / "serial.py").read_text()
    assert import_copy(mutant, tmp_path / "elsewhere") == package and not (tmp_path / "elsewhere").exists()


def test_only_selects_by_id_or_number():
    assert [m.id for m in select(["M07"])] == ["M07-stop-flag-ignored"]
    assert [m.id for m in select(["7", "m01-slot-freed-on-cancel"])] == ["M01-slot-freed-on-cancel",
                                                                         "M07-stop-flag-ignored"]
    assert select(None) == list(CATALOGUE)
    with pytest.raises(UnknownMutant, match="no mutant 'M42'"):
        select(["M42"])
