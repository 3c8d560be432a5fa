"""A file is judged in the grammar of the Python its project requires, whatever Python runs the checker.

Under 3.11, CPython's own parser (ast.parse, which the checker asks about files no rule needs
parsed and before libcst on large or deep ones) called valid 3.12/3.13 code a syntax error: 7 of
exo's files that use PEP 695 generics (`requires-python = "==3.13.*"`) were INV000.
"""

from __future__ import annotations

import pytest

from mlx_invariants.checker import source, versions
from mlx_invariants.checker.errors import SourceError
from tests.invariants.conftest import BAD_LOCK, Project

# Each valid in 3.13 (the first four from 3.12 on), none in 3.11.
NEWER = {
    "type_alias.py": "type Pair[T] = tuple[T, T]\ntype Names = list[str]\n",
    "generic_def.py": "def first[T](items: list[T]) -> T:\n    return items[0]\n",
    "generic_class.py": "class Box[T: (int, str)]:\n    def get(self) -> T: ...\n",
    "fstring.py": "names = {'a': 1}\nprint(f\"{names[\"a\"]} and {f\"{names[\"a\"]}\"}\")\n",
    "defaults.py": "class Slot[T = int]:\n    pass\n",
}
REQUIRES_313 = "[project]\nname = 'demo'\nrequires-python = \"==3.13.*\"\n"


@pytest.mark.parametrize("specifier, floor", [
    (">=3.13", (3, 13)), ("==3.13.*", (3, 13)), ("~=3.12", (3, 12)), ("~=3.12.1", (3, 12)), (">3.11", (3, 11)),
    (">=3.10, <4", (3, 10)), ("<4, >= 3.9, != 3.9.1", (3, 9)), (">=3.9,>=3.11", (3, 11)), (">=3", (3, 0)),
    ("<3.14", None), ("", None), ("any", None),
])
def test_the_floor_of_requires_python(specifier: str, floor: tuple[int, int] | None) -> None:
    assert versions.lower_bound(specifier) == floor


def test_the_nearest_pyproject_that_declares_requires_python_decides(project: Project) -> None:
    (project.root / "pyproject.toml").write_text("[project]\nname = 'top'\nrequires-python = '>=3.12'\n")
    project.write("sub/pyproject.toml", "[tool.other]\nx = 1\n")  # declares none: the one above holds
    project.write("svc/pyproject.toml", "[project]\nname = 'svc'\nrequires-python = '>=3.13'\n")
    project.write("bad/pyproject.toml", "not toml [")
    targets = versions.Targets()
    assert targets.of(str(project.write("a.py", ""))) == (3, 12)
    assert targets.of(str(project.write("sub/deep/b.py", ""))) == (3, 12)
    assert targets.of(str(project.write("svc/c.py", ""))) == (3, 13)
    assert targets.of(str(project.write("bad/d.py", ""))) == (3, 12)


def test_newer_syntax_is_checked_in_a_project_that_requires_it(project: Project) -> None:
    """Each file also holds a bug, so it must be parsed and walked, not only accepted."""
    (project.root / "pyproject.toml").write_text(REQUIRES_313)
    for name, code in NEWER.items():
        project.write(name, code + BAD_LOCK)
    project.write("try_star.py", "try:\n    pass\nexcept* ValueError:\n    pass\n" + BAD_LOCK)
    # A line over 10 000 characters: CPython's parser vets the file before libcst's (in a child process).
    project.write("wide.py", "type Wide = tuple[" + "int, " * 2_500 + "]\n" + BAD_LOCK)
    run = project.run("check", "--no-cache")
    assert run.code == 1 and "INV000" not in run.out, run.out
    assert sorted(line.split(":")[0] for line in run.lines()) == sorted([*NEWER, "try_star.py", "wide.py"])
    assert set(run.rules()) == {"INV105"}


def test_newer_syntax_where_no_rule_fires_is_not_a_syntax_error(project: Project) -> None:
    """The files no rule needs parsed get only a syntax check: the one that was wrong."""
    (project.root / "pyproject.toml").write_text(REQUIRES_313)
    for name, code in NEWER.items():
        project.write(name, code)
    project.write("broken.py", "class Box[T]:\n    pass\n\ndef f(:\n    pass\n")
    run = project.run("check", "--no-cache")
    assert [line.split(":")[0] for line in run.lines()] == ["broken.py"]
    # Where both parsers object, CPython's message is kept (users know it), though under an older
    # Python it may point at the newer syntax rather than at the error.
    assert " INV000 cannot check this file: syntax error" in run.out


def test_without_requires_python_the_newest_grammar_applies(project: Project) -> None:
    for name, code in NEWER.items():
        project.write(name, code)
    project.write("engine.py", NEWER["generic_def.py"] + BAD_LOCK)
    assert project.run("check", "--no-cache").rules() == ["INV105"]


def test_syntax_newer_than_the_project_allows_is_reported_as_such(project: Project) -> None:
    (project.root / "pyproject.toml").write_text("[project]\nname = 'demo'\nrequires-python = '>=3.10'\n")
    project.write("alias.py", NEWER["type_alias.py"])
    run = project.run("check", "--no-cache")
    assert run.lines()[0].startswith("alias.py:1:")
    assert run.lines()[0].endswith("(it needs a Python newer than 3.10, the oldest the project's requires-python allows)")


def test_a_changed_requires_python_is_judged_again_despite_the_cache(project: Project) -> None:
    (project.root / "pyproject.toml").write_text("[project]\nname = 'demo'\nrequires-python = '>=3.10'\n")
    project.write("alias.py", NEWER["type_alias.py"])
    assert project.run("check").rules() == ["INV000"]
    (project.root / "pyproject.toml").write_text(REQUIRES_313)
    assert project.run("check").code == 0


def test_check_syntax_asks_libcst_only_for_a_python_newer_than_the_running_one() -> None:
    code = NEWER["generic_class.py"]
    source.check_syntax(code, (3, 13))
    source.check_syntax(code, None)
    with pytest.raises(SourceError, match="syntax error"):
        source.check_syntax(code, (3, 10))
    with pytest.raises(SourceError, match="syntax error"):
        source.check_syntax("class Box[T]:\n    x = = 1\n", (3, 13))
    with pytest.raises(SourceError, match="too many nested parentheses|nested too deeply"):
        source.check_syntax("x = " + "(" * 300 + ")" * 300 + "\n", (3, 13))
