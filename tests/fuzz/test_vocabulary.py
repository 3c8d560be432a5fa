"""The fuzzer's vocabularies are each declared once, used as declared, and documented.

In the manner of flake8-async's tests/test_messages_documented.py, which ties its codes to
README, changelog and eval files: the sources are scanned (with `ast`, never imported for
this) for what they use, and each use is tied to its one declaration and to docs/fuzz-reference.md.

- violation kinds: every `Violation("kind", ...)` in fuzz/ names a kind an oracle declared
  once (`@yields`), with a one-line doc, that docs/fuzz-reference.md lists and `invariants explain`
  prints; every declared kind is yielded somewhere; the exact ones are the decided ones;
- points (`mlx_invariants.points.Point`): each is reached somewhere in engine/ or the
  fuzzer's adapters, and listed in docs/fuzz-reference.md;
- fault kinds (`fuzz.scenario.FaultKind`): each has a delivery (a row of
  `ScenarioRun.DELIVERIES`, or the injector's own) and a doc in docs/fuzz-reference.md;
- trace events (`fuzz.trace.EVENTS`): every literal kind and name in a `record`, `of` or
  `first` call in fuzz/ is declared;
- docs/fuzz-reference.md's generated tables are fresh (ci/fuzz_docs.py).

Each check is a function of its inputs, so the second half feeds each one a broken input (an
undeclared kind, a point nobody reaches, a fault kind with no delivery, ...) and watches it
fail.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Iterable, Mapping

import pytest

from mlx_invariants import cli
from mlx_invariants.fuzz.driver import ScenarioRun
from mlx_invariants.fuzz.oracles import EXACT_KINDS, KINDS, declared_kinds, is_exact
from mlx_invariants.fuzz.scenario import (FAULT_KINDS, INDEXED_POINTS, POINTS, RAISE_POINTS, VICTIM_KINDS, Delivery,
                                          FaultKind, Scenario)
from mlx_invariants.fuzz.trace import EVENTS, EventKind
from mlx_invariants.fuzz.violation import ViolationKind
from mlx_invariants.points import Point

ROOT = Path(__file__).resolve().parents[2]
FUZZ = ROOT / "fuzz"
DOC = ROOT / "docs" / "fuzz-reference.md"
GENERATOR = ROOT / "ci" / "fuzz_docs.py"
# Where points are reached: the engine, and the fuzzer's adapters (an HTTP client's own points).
REACHERS = (ROOT / "engine", FUZZ / "adapters")
# Decided, not derived: exact = one sighting fails the run without a replay, only where the verdict cannot
# depend on timing. Changing this set is a decision about findings, so it is spelt out here.
DECIDED_EXACT = frozenset({"mlx-concurrent", "mlx-off-owner", "mlx-no-stream", "lock-reentered",
                           "request-ended-twice", "request-crashed", "unclear-error", "abort-completed",
                           "loop-error", "startup-failed", "refusal-differs-by-transport",
                           "stop-string-returned", "logprobs-not-as-asked", "health-while-stopping"})


# -- the scanners ------------------------------------------------------------------------------------

def sources(*roots: Path) -> list[Path]:
    return sorted(path for root in roots for path in root.rglob("*.py") if "__pycache__" not in path.parts)


def _calls(paths: Iterable[Path]) -> Iterable[tuple[Path, ast.Call]]:
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Call):
                yield path, node


def _literal(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _named(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def violations_built(paths: Iterable[Path], root: Path = ROOT) -> list[tuple[str, int, str | None]]:
    """Every `Violation(...)` call: (file, line, its kind if written as a literal, else None)."""
    return [(path.relative_to(root).as_posix(), call.lineno, _literal(call.args[0] if call.args else None))
            for path, call in _calls(paths) if _named(call) == "Violation"]


def points_reached(paths: Iterable[Path]) -> set[str]:
    """The `Point` members passed to a `reach(...)` call (the engine's `reach`, an adapter's `self.reach`, or the
    HTTP adapter's `reached`, which awaits what the fuzzer hands back)."""
    reached = set()
    for _, call in _calls(paths):
        first = call.args[0] if call.args else None
        if _named(call) in ("reach", "reached") and isinstance(first, ast.Attribute) and isinstance(first.value, ast.Name) \
                and first.value.id == "Point":
            reached.add(first.attr)
    return reached


def events_used(paths: Iterable[Path], root: Path = ROOT) -> list[tuple[str, int, str, str | None]]:
    """Every `x.record(...)`, `x.of(...)`, `x.first(...)` whose kind is a literal: (file, line, kind, name)."""
    used = []
    for path, call in _calls(paths):
        if _named(call) in ("record", "of", "first") and isinstance(call.func, ast.Attribute) and call.args:
            kind = _literal(call.args[0])
            if kind is not None:
                name = _literal(call.args[1]) if len(call.args) > 1 else None
                used.append((path.relative_to(root).as_posix(), call.lineno, kind, name))
    return used


# -- the checks, each a function of its inputs -----------------------------------------------------------

def undeclared(built: list[tuple[str, int, str | None]], kinds: Mapping[str, ViolationKind]) -> list[str]:
    return [f"{path}:{line}: Violation({kind!r}) is declared by no oracle (add it to the oracle's @yields)"
            for path, line, kind in built if kind is not None and kind not in kinds]


def computed(built: list[tuple[str, int, str | None]]) -> list[str]:
    return [f"{path}:{line}: Violation(...) names its kind by an expression; write it as a literal"
            for path, line, kind in built if kind is None]


def never_yielded(built: list[tuple[str, int, str | None]], kinds: Iterable[ViolationKind]) -> list[str]:
    yielded = {kind for _, _, kind in built}
    return [f"{kind.name} ({kind.oracle}) is declared but no Violation({kind.name!r}) exists in fuzz/"
            for kind in kinds if kind.name not in yielded]


def declared_twice(kinds: list[ViolationKind]) -> list[str]:
    names = [kind.name for kind in kinds]
    return sorted({f"{name} is declared {names.count(name)} times" for name in names if names.count(name) > 1})


def undocumented(kinds: Iterable[ViolationKind], doc: str) -> list[str]:
    problems = []
    for kind in kinds:
        if not kind.doc.strip() or not kind.why.strip():
            problems.append(f"{kind.name}: empty doc or why")
        if f"`{kind.name}`" not in doc:
            problems.append(f"{kind.name}: not in docs/fuzz-reference.md (run `python ci/fuzz_docs.py`)")
    return problems


def unreached(points: Iterable[Point], reached: set[str]) -> list[str]:
    return [f"{point.name}: no reach(Point.{point.name}, ...) in engine/ or fuzz/adapters/"
            for point in points if point.name not in reached]


def undelivered(kinds: Iterable[FaultKind], table: Mapping[FaultKind, object], injector: str) -> list[str]:
    """A loop-delivered kind needs a row of `ScenarioRun.DELIVERIES`, and no other kind may have one; a kind
    the injector delivers needs the injector to handle its `Delivery`."""
    problems = []
    for kind in kinds:
        if kind.delivery is Delivery.LOOP and kind not in table:
            problems.append(f"{kind.value}: delivered on the loop but ScenarioRun.DELIVERIES has no row for it")
        if kind.delivery is not Delivery.LOOP and kind in table:
            problems.append(f"{kind.value}: the injector delivers it ({kind.delivery}), yet DELIVERIES has a row")
        if kind.delivery is not Delivery.LOOP and f"Delivery.{kind.delivery.name}" not in injector:
            problems.append(f"{kind.value}: fuzz/faults.py never handles Delivery.{kind.delivery.name}")
    return problems


def undeclared_events(used: list[tuple[str, int, str, str | None]], events: Mapping[str, EventKind]) -> list[str]:
    problems = []
    for path, line, kind, name in used:
        if kind not in events:
            problems.append(f"{path}:{line}: trace event kind {kind!r} is not in fuzz.trace.EVENTS")
        elif name is not None and events[kind].names is not None and name not in events[kind].names:
            problems.append(f"{path}:{line}: trace event {kind}/{name} is not declared under {kind!r}")
    return problems


@pytest.fixture(scope="module")
def built() -> list[tuple[str, int, str | None]]:
    return violations_built(sources(FUZZ))


@pytest.fixture(scope="module")
def doc() -> str:
    return DOC.read_text(encoding="utf-8")


# -- violation kinds -----------------------------------------------------------------------------------

def test_the_scanner_sees_the_violations_fuzz_builds(built: list[tuple[str, int, str | None]]) -> None:
    files = {path for path, _, _ in built}
    assert {"fuzz/oracles.py", "fuzz/ownership.py", "fuzz/compute.py", "fuzz/jobs.py"} <= files, files


def test_every_violation_kind_built_in_fuzz_is_declared(built: list[tuple[str, int, str | None]]) -> None:
    assert not computed(built), computed(built)
    assert not undeclared(built, KINDS), "\n".join(undeclared(built, KINDS))


def test_every_declared_kind_is_built_somewhere(built: list[tuple[str, int, str | None]]) -> None:
    assert not never_yielded(built, declared_kinds()), never_yielded(built, declared_kinds())


def test_every_kind_is_declared_once_and_documented(doc: str) -> None:
    assert not declared_twice(declared_kinds()), declared_twice(declared_kinds())
    assert not undocumented(declared_kinds(), doc), undocumented(declared_kinds(), doc)
    assert all(kind.oracle for kind in declared_kinds()), "every kind names who yields it"


def test_exact_kinds_are_the_decided_ones_and_derived_from_the_declarations() -> None:
    assert EXACT_KINDS == DECIDED_EXACT
    assert {kind.name for kind in declared_kinds() if kind.exact} == EXACT_KINDS
    assert is_exact("mlx-concurrent") and not is_exact("cancel-swallowed") and not is_exact("mlx-off-loader")
    assert not is_exact("mlx-finalized-off-thread") and not is_exact("a-kind-nobody-declared")


@pytest.mark.parametrize("name", sorted(KINDS))
def test_explain_prints_every_kind(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    kind = KINDS[name]
    assert cli.main(["explain", name]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith(f"{name} (fuzz violation kind)")
    assert " ".join(kind.doc.split()) in out and " ".join(kind.why.split()) in out
    assert kind.oracle in out and ("exact: one sighting" in out) == kind.exact


def test_explain_of_a_kind_imports_no_mlx_hypothesis_or_httpx() -> None:
    """The checker-only install has none of them; the declarations must load without them."""
    code = ("import sys; from mlx_invariants import cli; code = cli.main(['explain', 'slot-freed-early']); "
            "print(code, sorted(m for m in ('mlx', 'mlx.core', 'mlx_lm', 'hypothesis', 'httpx', "
            "'mlx_invariants.engine') if m in sys.modules))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip().endswith("0 []"), run.stdout + run.stderr


# -- points ------------------------------------------------------------------------------------------

def test_every_point_is_reached_by_the_engine_or_an_adapter_and_documented(doc: str) -> None:
    reached = points_reached(sources(*REACHERS))
    assert not unreached(Point, reached), unreached(Point, reached)
    assert reached <= {point.name for point in Point}
    table = doc[doc.index("<!-- BEGIN generated: points -->"):doc.index("<!-- END generated: points -->")]
    assert [point.name for point in Point if f"| `{point.name}` |" in table] == [point.name for point in Point]


def test_the_scenario_point_sets_are_the_declarations() -> None:
    assert POINTS == tuple(point.name for point in Point if point.engine_marks)
    assert RAISE_POINTS == {point.name for point in Point if point.may_raise}
    assert INDEXED_POINTS == {point.name for point in Point if point.indexed}


def test_a_scenario_file_still_names_points_and_fault_kinds_as_strings() -> None:
    """Replay files in the wild hold names, not enum values: they load, and are written back the same."""
    written = {"requests": [{"rid": "r0", "prompt_len": 4, "max_tokens": 8, "stream": True, "route": "completions",
                             "arrival": None},
                            {"rid": "r1", "prompt_len": 2, "max_tokens": 4, "stream": False, "route": "chat",
                             "arrival": {"rid": "r0", "point": "BEFORE_DECODE", "index": 1}}],
               "faults": [{"kind": "cancel-twice", "at": {"rid": "r0", "point": "PREFILL_DONE", "index": 0}},
                          {"kind": "raise", "at": {"rid": "r1", "point": "WORKER_STARTED", "index": 0}}],
               "executor": "alternate", "followup": True, "debug": False, "meta": {}}
    scenario = Scenario.from_json(json.loads(json.dumps(written)))
    assert json.loads(scenario.dumps()) == written
    with pytest.raises(ValueError, match="raise fault needs one of"):
        Scenario.from_json({**written, "faults": [{"kind": "raise", "at": {"rid": "r0", "point": "CHUNK_SENT"}}]})


# -- fault kinds ---------------------------------------------------------------------------------------

def test_every_fault_kind_has_a_delivery_and_a_doc(doc: str) -> None:
    injector = (FUZZ / "faults.py").read_text(encoding="utf-8")
    assert not undelivered(FaultKind, ScenarioRun.DELIVERIES, injector), \
        undelivered(FaultKind, ScenarioRun.DELIVERIES, injector)
    table = doc[doc.index("<!-- BEGIN generated: fault-kinds -->"):doc.index("<!-- END generated: fault-kinds -->")]
    for kind in FaultKind:
        assert kind.doc.strip() and f"| `{kind.value}` |" in table, kind


def test_the_scenario_fault_sets_are_the_declarations() -> None:
    assert FAULT_KINDS == tuple(kind.value for kind in FaultKind)
    assert VICTIM_KINDS == {kind.value for kind in FaultKind if kind.victim}


# -- trace events --------------------------------------------------------------------------------------

def test_every_trace_event_fuzz_records_or_looks_for_is_declared() -> None:
    used = events_used(sources(FUZZ))
    assert len(used) > 50, "the scanner sees the driver's, oracles' and observer's events"
    assert not undeclared_events(used, EVENTS), "\n".join(undeclared_events(used, EVENTS))


# -- docs/fuzz-reference.md's generated tables -------------------------------------------------------------

@pytest.fixture(scope="module")
def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fuzz_docs", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_tables_are_up_to_date(generator: ModuleType, doc: str) -> None:
    fresh = generator.render(doc)
    assert fresh == doc, (f"docs/fuzz-reference.md is out of date in {generator.stale_blocks(doc, fresh)}: "
                          "run `.venv/bin/python ci/fuzz_docs.py`")


def test_the_generator_imports_only_the_declarations() -> None:
    tree = ast.parse(GENERATOR.read_text(encoding="utf-8"))
    ours = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            and (node.module or "").startswith("mlx_invariants")]
    assert sorted(ours) == ["mlx_invariants.fuzz.oracles", "mlx_invariants.fuzz.scenario",
                            "mlx_invariants.fuzz.trace", "mlx_invariants.points"]


# -- each check, broken on purpose -------------------------------------------------------------------------

def test_an_undeclared_kind_is_caught(tmp_path: Path, built: list[tuple[str, int, str | None]]) -> None:
    """A copy of fuzz/ with one more oracle module, which builds a kind nobody declared and one by expression."""
    (tmp_path / "fuzz").mkdir()
    for path in sources(FUZZ):
        if path.parent == FUZZ:
            (tmp_path / "fuzz" / path.name).write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "fuzz" / "scratch.py").write_text(
        "def made_up(trace):\n    yield Violation('slot-freed-early', 'declared')\n"
        "    yield Violation('kind-nobody-declared', 'not declared')\n    yield Violation(name, 'computed')\n")
    scanned = violations_built(sources(tmp_path / "fuzz"), root=tmp_path)
    assert undeclared(scanned, KINDS) == [
        "fuzz/scratch.py:3: Violation('kind-nobody-declared') is declared by no oracle (add it to the oracle's "
        "@yields)"]
    assert computed(scanned) == ["fuzz/scratch.py:4: Violation(...) names its kind by an expression; "
                                 "write it as a literal"]
    assert not undeclared(built, KINDS), "the real tree, scanned the same way, has none"


def test_a_kind_declared_but_never_built_is_caught(built: list[tuple[str, int, str | None]]) -> None:
    without = [entry for entry in built if entry[2] != "busy-slow"]
    assert never_yielded(without, declared_kinds()) == [
        "busy-slow (oracles.busy_answers_fast) is declared but no Violation('busy-slow') exists in fuzz/"]


def test_a_kind_declared_twice_or_missing_from_the_doc_is_caught(doc: str) -> None:
    twice = declared_kinds() + [ViolationKind("stalled", "again", exact=False, why="a second declaration")]
    assert declared_twice(twice) == ["stalled is declared 2 times"]
    assert undocumented([KINDS["cut-body-blocks"]], doc.replace("`cut-body-blocks`", "cut-body-blocks")) == [
        "cut-body-blocks: not in docs/fuzz-reference.md (run `python ci/fuzz_docs.py`)"]
    with pytest.raises(ValueError, match="one-line doc and a why"):
        ViolationKind("no-why", "a doc", exact=True, why="")


def test_an_unreached_point_is_caught(tmp_path: Path) -> None:
    (tmp_path / "engine.py").write_text("reach(Point.ADMITTED, rid)\nself.reach(Point.CHUNK_SENT, rid, index=0)\n"
                                        "mark('SLOT_RELEASED', rid)\n")
    reached = points_reached(sources(tmp_path))
    assert reached == {"ADMITTED", "CHUNK_SENT"}
    assert [line.split(":")[0] for line in unreached(Point, reached)] == \
        [point.name for point in Point if point.name not in reached]


def test_a_fault_kind_without_a_delivery_is_caught() -> None:
    injector = (FUZZ / "faults.py").read_text(encoding="utf-8")
    table = {kind: row for kind, row in ScenarioRun.DELIVERIES.items() if kind is not FaultKind.ABORT}
    assert undelivered(FaultKind, table, injector) == [
        "abort: delivered on the loop but ScenarioRun.DELIVERIES has no row for it"]
    assert undelivered([FaultKind.RAISE], ScenarioRun.DELIVERIES, injector.replace("Delivery.WORKER", "...")) == [
        "raise: fuzz/faults.py never handles Delivery.WORKER"]


def test_an_undeclared_trace_event_is_caught(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch.py"
    scratch.write_text("trace.record('check', 'status')\ntrace.record('made-up', 'x')\n"
                       "trace.of('check', 'no-such-check')\ntrace.first('point', 'NOT_A_POINT', 'r0')\n"
                       "trace.of('mlx', 'core.eval')\nFollowupOutcome.of(info, tokens)\n")
    used = events_used([scratch], root=tmp_path)
    assert len(used) == 5
    assert undeclared_events(used, EVENTS) == [
        "scratch.py:2: trace event kind 'made-up' is not in fuzz.trace.EVENTS",
        "scratch.py:3: trace event check/no-such-check is not declared under 'check'",
        "scratch.py:4: trace event point/NOT_A_POINT is not declared under 'point'"]


def test_a_stale_table_fails_the_check(generator: ModuleType, doc: str, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    stale = doc.replace("| `slot-freed-early` | `oracles.slot_kept_until_worker_done` | no |",
                        "| `slot-freed-early` | `oracles.slot_kept_until_worker_done` | yes |")
    assert stale != doc
    copy = tmp_path / "fuzz-reference.md"
    copy.write_text(stale, encoding="utf-8")
    assert generator.main(["--check", "--doc", str(copy)]) == 1
    assert "out of date in: violation-kinds;" in capsys.readouterr().err
    assert copy.read_text(encoding="utf-8") == stale, "--check writes nothing"
    copy.write_text(doc.replace("<!-- END generated: points -->\n", ""), encoding="utf-8")
    assert generator.main(["--check", "--doc", str(copy)]) == 2
    assert "exactly one `<!-- BEGIN generated: points -->`" in capsys.readouterr().err
