"""docs/checker.md states only what the checker does: its generated blocks are fresh, and the
rule ids, `[tool.invariants]` keys, output formats and options its prose names are real."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from mlx_invariants.checker import config, output
from mlx_invariants.checker.rule import Finding
from mlx_invariants.checker.rules import RULES
from mlx_invariants.commands import check, mutants

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "checker.md"
GENERATOR = ROOT / "ci" / "checker_docs.py"
STALE_EXAMPLE = """```console
$ invariants check engine/
engine/simple.py:88:20: INV105 cancelling this await leaves `async with self._mlx_lock` while the worker thread still runs
invariants: 1 finding in 12 files
```
"""


@pytest.fixture(scope="module")
def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("checker_docs", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def doc() -> str:
    return DOC.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def fresh(generator: ModuleType, doc: str) -> str:
    return generator.render(doc)


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def test_generated_blocks_are_up_to_date(generator: ModuleType, doc: str, fresh: str) -> None:
    stale = generator.stale_blocks(doc, fresh)
    assert fresh == doc, f"docs/checker.md is out of date in {stale}: run `.venv/bin/python ci/checker_docs.py`"


def test_a_stale_block_fails_the_check(generator: ModuleType, doc: str, fresh: str, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """The old hand-written example (a file that does not exist, an old message) is caught and named."""
    start = doc.index("<!-- BEGIN generated: example -->\n") + len("<!-- BEGIN generated: example -->\n")
    stale = doc[:start] + STALE_EXAMPLE + doc[doc.index("<!-- END generated: example -->"):]
    copy = tmp_path / "checker.md"
    copy.write_text(stale, encoding="utf-8")
    assert generator.stale_blocks(stale, fresh) == ["example"]
    assert generator.main(["--check", "--doc", str(copy)]) == 1
    assert "out of date in: example;" in capsys.readouterr().err
    assert copy.read_text(encoding="utf-8") == stale, "--check writes nothing"


def test_a_missing_block_is_a_clear_error(generator: ModuleType, doc: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    copy = tmp_path / "checker.md"
    copy.write_text(doc.replace("<!-- END generated: rules -->", ""), encoding="utf-8")
    assert generator.main(["--check", "--doc", str(copy)]) == 2
    err = capsys.readouterr().err
    assert "exactly one `<!-- BEGIN generated: rules -->`" in err and "Traceback" not in err


def test_the_generator_imports_only_the_checker() -> None:
    tree = ast.parse(GENERATOR.read_text(encoding="utf-8"))
    names = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    names += [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module]
    ours = [name for name in names if name.split(".")[0] == "mlx_invariants"]
    assert ours and all(name.startswith("mlx_invariants.checker") for name in ours), ours


def test_every_rule_id_named_in_the_docs_exists(doc: str) -> None:
    known = {*output.BUILTIN, *(rule.id for rule in RULES)}
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    unknown = set(re.findall(r"\bINV\d{3}\b", doc + readme)) - known
    assert not unknown, f"docs/checker.md or README.md names rules that do not exist: {sorted(unknown)}"


def test_configuration_example_is_valid_and_names_every_key_with_its_default(doc: str) -> None:
    """Every key is shown; a key with a default shows that default, one without shows an example."""
    block = re.search(r"```toml\n(.*?)```", _section(doc, "Configuration"), re.DOTALL)
    table = tomllib.loads(block.group(1))["tool"]["invariants"]
    config.from_table(table, Path("."), "docs/checker.md", RULES)  # a misspelt key or bad value raises
    assert set(config.TOP_LEVEL_DEFAULTS) <= set(table), "document the new keys in docs/checker.md"
    for key, default in config.TOP_LEVEL_DEFAULTS.items():
        if default:
            assert table[key] == default, f"docs/checker.md shows {key} = {table[key]!r}, the default is {default!r}"


def test_output_formats_and_json_fields_are_the_real_ones(doc: str) -> None:
    section = _section(doc, "Output")
    assert tuple(re.findall(r"^\| `(\w+)`", section, re.MULTILINE)) == output.FORMATS
    listed = re.search(r"a list of `\{(.*?)\}`", section).group(1)
    assert re.findall(r'"(\w+)"', listed) == [f.name for f in dataclasses.fields(Finding)]
    shown = re.search(r"\| `github` \| `(.*?)`", section).group(1)  # `...` stands for a value
    annotation = output.render([Finding("a.py", 3, 7, "INV105", "msg")], "github", []).strip()
    assert re.fullmatch(".*?".join(map(re.escape, shown.split("..."))), annotation), (shown, annotation)


def _declared(command: ModuleType) -> list[list[str]]:
    """The option strings a command's `add_arguments` declares, groups included."""
    parser = argparse.ArgumentParser(add_help=False)
    command.add_arguments(parser)
    return [list(action.option_strings) for action in parser._actions if action.option_strings]


# Other tools' flags the doc quotes: `pip download --no-deps`, in the review notes, and the held-out record's
# `benchmarks/precision_unstudied.py --held-out-by-rule`.
OTHER_TOOLS = {"--no-deps", "--held-out-by-rule"}


def test_options_the_doc_names_exist_and_every_check_option_is_documented(doc: str) -> None:
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", doc))
    real = {flag for command in (check, mutants) for names in _declared(command) for flag in names}
    assert named - real - OTHER_TOOLS == set(), "docs/checker.md names options no command has"
    undocumented = [names for names in _declared(check)
                    if not any(f"`{flag}" in doc or f" {flag}" in doc for flag in names)]
    assert not undocumented, "document these `invariants check` options in docs/checker.md"
