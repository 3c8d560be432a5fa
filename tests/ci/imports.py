"""The import graph of the installed package, read from its sources, and the layer rules it must keep.

Every import counts: module level, inside functions (a lazy import is still an
arrow) and `importlib.import_module("literal")`. Imports under
`if TYPE_CHECKING:` count for direction but not for cycles, since they never
run. The package-dir mapping comes from pyproject.toml, so the graph names
modules as users import them.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PACKAGE = "mlx_invariants"

# Bottom to top. A module may import its own layer and the layers its entry names.
LAYERS: dict[str, frozenset[str]] = {
    "base": frozenset({"base"}),
    "checker": frozenset({"base", "checker"}),
    "engine": frozenset({"base", "engine"}),
    "fuzz": frozenset({"base", "fuzz", "engine-public"}),
    "mutants": frozenset({"base", "checker", "engine", "engine-public", "fuzz", "mutants"}),
    "cli": frozenset({"base", "checker", "engine", "engine-public", "fuzz", "mutants", "cli"}),
}
# The top-level names the package used before it had one; nothing may import them any more.
FORMER_NAMES = ("engine", "fuzz", "invariants")
# Folders of the checkout that use the package from outside it (not in the wheel); nothing in it may import them.
USERS = ("zoo", "benchmarks")


def layer_of(module: str) -> str:
    """The layer of a module of the package (see docs/layers.md)."""
    parts = module.split(".")
    if parts[:2] == [PACKAGE, "checker"]:
        return "checker"
    if parts[:2] == [PACKAGE, "engine"]:
        return "engine-public" if len(parts) == 2 else "engine"
    if parts[:2] == [PACKAGE, "fuzz"]:
        return "fuzz"
    if parts[:2] == [PACKAGE, "mutants"]:
        return "mutants"
    if module in (PACKAGE, f"{PACKAGE}.errors", f"{PACKAGE}.points"):
        return "base"
    return "cli"  # cli, commands, extras, __main__


def allowed(importer: str, imported: str) -> bool:
    source = layer_of(importer)
    if source == "engine-public":  # the engine's own __init__ is part of the engine
        source = "engine"
    target = layer_of(imported)
    if source == "engine" and target == "engine-public":
        return True
    return target in LAYERS[source]


@dataclass(frozen=True)
class Arrow:
    importer: str
    imported: str
    path: Path
    line: int
    type_only: bool
    names: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.importer} -> {self.imported}"


def package_dirs(repo: Path) -> dict[str, Path]:
    """`[tool.setuptools.package-dir]`: package name -> folder."""
    table = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return {name: repo / folder for name, folder in table.items()}


def modules(repo: Path) -> dict[str, Path]:
    """Every module of the package by its import name; a folder mapped deeper wins over its parent's walk."""
    found: dict[str, Path] = {}
    for package, folder in sorted(package_dirs(repo).items(), key=lambda item: len(item[0])):
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder).with_suffix("").parts
            if any(part == "__pycache__" for part in rel):
                continue
            name = ".".join((package, *rel[:-1])) if rel[-1] == "__init__" else ".".join((package, *rel))
            found[name] = path
    return found


def arrows(repo: Path) -> Iterator[Arrow]:
    known = modules(repo)
    for module, path in known.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), str(path))
        for node, type_only in _imports(tree):
            for target, names in _targets(node, module, is_package, known):
                yield Arrow(module, target, path, node.lineno, type_only, names)


def _imports(tree: ast.AST) -> Iterator[tuple[ast.AST, bool]]:
    type_only_nodes: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            type_only_nodes.update(id(inner) for child in node.body for inner in ast.walk(child))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) or _literal_import_module(node):
            yield node, id(node) in type_only_nodes


def _literal_import_module(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and ast.unparse(node.func) in ("importlib.import_module", "import_module")
            and len(node.args) == 1 and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str))


def _targets(node: ast.AST, module: str, is_package: bool, known: dict[str, Path]) -> Iterator[tuple[str, tuple]]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name, ()
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            anchor = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
            base = ".".join([*anchor, base] if base else anchor)
        plain = []
        for alias in node.names:
            if f"{base}.{alias.name}" in known:  # `from pkg import submodule`
                yield f"{base}.{alias.name}", ()
            else:
                plain.append(alias.name)
        if plain:
            yield base, tuple(plain)
    else:
        yield node.args[0].value, ()


def upward(repo: Path) -> list[Arrow]:
    """Arrows that leave the package's layering: up a layer, to a former name, or out to a user of the
    package that lives beside it in the checkout (the zoo, the benchmarks)."""
    bad = []
    for arrow in arrows(repo):
        top = arrow.imported.split(".")[0]
        if top in FORMER_NAMES or top in USERS:
            bad.append(arrow)
        elif top == PACKAGE and not allowed(arrow.importer, arrow.imported):
            bad.append(arrow)
    return bad


def private_reaches(repo: Path) -> list[Arrow]:
    """`from other_module import _private`: one module reaching into another's internals."""
    return [arrow for arrow in arrows(repo)
            if arrow.imported.startswith(PACKAGE) and arrow.importer != arrow.imported
            and any(name.startswith("_") and not name.startswith("__") for name in arrow.names)]


def cycles(repo: Path) -> list[list[str]]:
    """Strongly connected groups of modules (more than one) in the graph of imports that run."""
    graph: dict[str, set[str]] = {name: set() for name in modules(repo)}
    for arrow in arrows(repo):
        if not arrow.type_only and arrow.imported in graph and arrow.imported != arrow.importer:
            graph[arrow.importer].add(arrow.imported)
    return [sorted(group) for group in _strongly_connected(graph) if len(group) > 1]


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative so a deep package cannot hit the recursion limit."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            advanced = False
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                groups.append(group)
    return groups
