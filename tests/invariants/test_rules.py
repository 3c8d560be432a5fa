"""Every rule's INVALID examples produce exactly their `# expect:` findings; every VALID none."""

from __future__ import annotations

import re
import tempfile
import textwrap
from pathlib import Path

import pytest

from mlx_invariants.checker import config
from mlx_invariants.checker.rule import PACKAGE_ONLY, Example, Rule
from mlx_invariants.checker.rules import RULES
from mlx_invariants.checker.runner import check_paths, check_source

CASES = [
    pytest.param(rule, example, id=f"{rule.id}-{kind}{index}")
    for rule in RULES
    for kind, examples in (("invalid", rule.invalid()), ("valid", rule.valid()))
    for index, example in enumerate(examples)
]


def _findings(example: Example, rule: type[Rule] | None = None) -> list[tuple[int, str]]:
    """The example's findings, with `rule` selected by id (an opt-in rule runs only so)."""
    options = {"select": ["INV", rule.id], **example.options} if rule is not None else example.options
    if example.files or (rule is not None and rule.triggers == PACKAGE_ONLY):
        return _package_findings(example, options)
    settings = config.from_table(options, Path("."), "example", RULES)
    return sorted((f.line, f.rule) for f in check_source(example.source, settings))


def _package_findings(example: Example, options: dict) -> list[tuple[int, str]]:
    """A multi-file example, checked as one run over its package; a finding outside the snippet
    is returned with its path, so it can never match a marker."""
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        files = {"app/__init__.py": "", **example.files, Example.MAIN: example.source}
        for name, code in files.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(textwrap.dedent(code).strip("\n") + "\n", encoding="utf-8")
        settings = config.from_table(options, root, "example", RULES)
        found = check_paths([str(root)], settings, use_cache=False).findings
        main = (root / Example.MAIN).resolve()
        return sorted((f.line, f.rule) if Path(f.path).resolve() == main else (f.line, f"{f.rule} in {f.path}")
                      for f in found)


@pytest.mark.parametrize(("rule", "example"), CASES)
def test_example_reports_exactly_its_expect_markers(rule: type[Rule], example: Example) -> None:
    assert _findings(example, rule) == sorted(example.expected()), example.source


@pytest.mark.parametrize("rule", RULES, ids=[r.id for r in RULES])
def test_rule_is_documented_and_its_invalid_examples_each_have_a_fix(rule: type[Rule]) -> None:
    assert re.fullmatch(r"INV1\d\d", rule.id)
    assert rule.__doc__ and rule.message and rule.known_problems and rule.catches
    invalid, valid = rule.invalid(), rule.valid()
    assert invalid, "a rule needs at least one INVALID example"
    assert len(valid) >= len(invalid), "each INVALID is paired with the VALID that fixes it"
    for example in invalid:
        assert {r for _, r in example.expected()} == {rule.id}, "an INVALID marks only its own rule"
    for example in valid:
        assert not example.expected()


def test_rules_are_in_id_order_one_module_each() -> None:
    ids = [r.id for r in RULES]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    for rule in RULES:
        module = rule.__module__.rsplit(".", 1)[-1]
        assert module.startswith(rule.id.lower() + "_"), module


def test_an_opt_in_rule_runs_only_when_selected_by_id() -> None:
    """INV113 is off under the default `select = ["INV"]` and on when `select` names it."""
    rule = next(r for r in RULES if r.id == "INV113")
    assert not rule.default_enabled
    bad = rule.invalid()[0]
    assert _findings(bad) == []
    assert _findings(bad, rule) == sorted(bad.expected())
    assert "INV113" not in config.from_table({"select": ["INV1"]}, Path("."), "example", RULES).enabled_ids
    assert "INV113" not in config.from_table({"select": ["INV", "INV113"], "ignore": ["INV113"]}, Path("."),
                                             "example", RULES).enabled_ids


def test_breaking_a_valid_example_makes_its_rule_fire() -> None:
    """The generated tests can fail: the INV105 fix without its drain is flagged again."""
    rule = next(r for r in RULES if r.id == "INV105")
    fixed = rule.valid()[0].source
    broken = fixed.replace("return await shield_task(task)", "return await task")
    assert broken != fixed
    assert ("INV105" in {r for _, r in _findings(Example(broken))})


def test_a_pattern_trigger_parses_a_file_only_where_the_pattern_matches() -> None:
    """INV127's trigger is a pattern: a file that imports MLX but binds no mapping at module level
    and has no `global` (a model file) is not parsed for it; one with a module-level cache is."""
    from mlx_invariants.checker.analysis import active
    from mlx_invariants.checker.rules.inv127_lazy_mlx_result_memoised import LazyMlxResultMemoised

    rules = [(LazyMlxResultMemoised, {})]
    model = "import mlx.core as mx\n__all__ = {'Model'}\n\ndef f(x):\n    cache = {}\n    return mx.exp(x)\n"
    assert active(rules, model) == []
    assert active(rules, model + "_codebooks: dict = {}\n") == rules
    assert active(rules, model + "def g():\n    global _ROPE\n") == rules


@pytest.mark.parametrize("rule", [r for r in RULES if r.possible], ids=[r.id for r in RULES if r.possible])
def test_a_rules_ast_test_lets_every_invalid_example_through(rule: type[Rule]) -> None:
    """`possible` says False only where the rule cannot fire: each INVALID example's tree passes it."""
    import ast

    for example in rule.invalid():
        assert rule.possible(ast.parse(example.source)), example.source


def test_a_file_only_rules_ast_tests_rule_out_is_not_parsed_by_libcst(monkeypatch: pytest.MonkeyPatch) -> None:
    """A `while` loop that calls something on the way round cannot spin (INV126), and `mlx` only in a
    string imports nothing (INV127): such a file is left to CPython's parser. A syntax error is still
    reported, by libcst's route; a loop that only reads is parsed and judged."""
    from mlx_invariants.checker import analysis, source
    from mlx_invariants.checker.rules.inv126_busy_wait import BusyWait
    from mlx_invariants.checker.rules.inv127_lazy_mlx_result_memoised import LazyMlxResultMemoised

    parsed: list[str] = []
    real_parse = source.parse
    monkeypatch.setattr(source, "parse", lambda text, target=None: parsed.append(text) or real_parse(text, target))
    rules = [(BusyWait, {}), (LazyMlxResultMemoised, {})]
    quiet = 'MODEL = "mlx-community/x"\n_cache = {}\n\ndef pump(q):\n    while q.alive:\n        q.step()\n'
    assert analysis.analyze_text(quiet, rules, {})["findings"] == []
    assert parsed == []
    broken = quiet + "def (:\n"
    assert analysis.analyze_text(broken, rules, {})["findings"][0][0] == "INV000"
    spin = "def wait(job):\n    while not job.done:\n        pass\n\ndef finish(job):\n    job.done = True\n"
    assert [f[0] for f in analysis.analyze_text(spin, rules, {})["findings"]] == ["INV126"]
    assert parsed == [broken, spin]
