"""Every import points down the layers (docs/layers.md), and no two modules import each other."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.ci import imports

REPO = Path(__file__).resolve().parents[2]


def test_no_import_runs_up_a_layer_or_to_a_former_top_level_name_or_the_zoo() -> None:
    bad = imports.upward(REPO)
    assert not bad, "imports against the layering (docs/layers.md):\n" + "\n".join(map(str, bad))


def test_no_module_imports_another_modules_private_names() -> None:
    bad = imports.private_reaches(REPO)
    assert not bad, "\n".join(f"{arrow}: {', '.join(arrow.names)}" for arrow in bad)


def test_no_cycles_between_modules() -> None:
    found = imports.cycles(REPO)
    assert not found, "modules that import each other:\n" + "\n".join(" <-> ".join(group) for group in found)


def test_every_module_belongs_to_a_layer_the_docs_name() -> None:
    layers = {imports.layer_of(name) for name in imports.modules(REPO)}
    assert layers == {"base", "checker", "engine", "engine-public", "fuzz", "mutants", "cli"}
    text = (REPO / "docs" / "layers.md").read_text()
    for folder in ("invariants/checker/", "engine/", "fuzz/", "invariants/mutants/", "invariants/commands/"):
        assert f"`{folder}`" in text, f"docs/layers.md does not say where {folder} sits"


# The walker itself, on a made-up package: each rule must be able to fail.

def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.setuptools.package-dir]\nmlx_invariants = "invariants"\n'
        '"mlx_invariants.engine" = "engine"\n"mlx_invariants.fuzz" = "fuzz"\n')
    for name, text in {"invariants/__init__.py": "", "invariants/checker/__init__.py": "",
                       "engine/__init__.py": "", "fuzz/__init__.py": "", **files}.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


@pytest.mark.parametrize("name, text", [
    ("engine/owner.py", "from mlx_invariants.fuzz import sentinel\n"),            # engine -> fuzz
    ("engine/owner.py", "def f():\n    from mlx_invariants.checker import rule\n"),  # lazy, still an arrow
    ("invariants/checker/rule.py", "import mlx_invariants.engine\n"),             # checker -> engine
    ("fuzz/driver.py", "from mlx_invariants.engine.batched import BatchedEngine\n"),  # past the public surface
    ("fuzz/driver.py", "from mlx_invariants.commands import fuzz\n"),              # fuzz -> cli
    ("fuzz/driver.py", "import importlib\nimportlib.import_module('mlx_invariants.mutants')\n"),
    ("fuzz/driver.py", "from engine import points\n"),                            # a former top-level name
    ("fuzz/runner.py", "def f():\n    from zoo.recipes import RECIPES\n"),      # the zoo uses us, not back
    ("invariants/commands/bench.py", "import benchmarks.corpus\n"),              # nor do the benchmarks
    ("engine/owner.py", "from ..fuzz import sentinel\n"),                          # relative, still up
])
def test_an_upward_import_is_reported(tmp_path: Path, name: str, text: str) -> None:
    repo = _tree(tmp_path, {name: text})
    assert [arrow.path.name for arrow in imports.upward(repo)] == [Path(name).name]


def test_downward_and_type_only_imports_pass(tmp_path: Path) -> None:
    repo = _tree(tmp_path, {
        "fuzz/driver.py": "from mlx_invariants.engine import Point\nfrom mlx_invariants.errors import UsageError\n",
        "invariants/cli.py": "from mlx_invariants.fuzz import driver\nfrom mlx_invariants.engine.owner import x\n",
        "engine/owner.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from mlx_invariants.engine import y\n",
    })
    assert imports.upward(repo) == []


def test_a_cycle_is_reported_even_through_a_lazy_import_but_not_a_type_only_one(tmp_path: Path) -> None:
    repo = _tree(tmp_path, {
        "fuzz/a.py": "from mlx_invariants.fuzz import b\n",
        "fuzz/b.py": "def f():\n    from mlx_invariants.fuzz.a import g\n",
        "fuzz/c.py": "from mlx_invariants.fuzz import d\n",
        "fuzz/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from mlx_invariants.fuzz import c\n",
    })
    assert imports.cycles(repo) == [["mlx_invariants.fuzz.a", "mlx_invariants.fuzz.b"]]


def test_reaching_into_another_modules_private_name_is_reported(tmp_path: Path) -> None:
    repo = _tree(tmp_path, {"fuzz/a.py": "from mlx_invariants.fuzz.b import _Run, public\n", "fuzz/b.py": ""})
    assert [arrow.names for arrow in imports.private_reaches(repo)] == [("_Run", "public")]
