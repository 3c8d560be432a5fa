"""What the unreferenced-def step (unreferenced.py) reads of a file's CPython tree, in plain values
that depend on the text alone, so each is kept in the cache by content digest and a re-run after
one edit parses only the edited file: on vllm-mlx, the other eight files it reads cost 0.05 s of
CPU to parse, more than the rest of the step.

An outline holds the file's defs (outermost first, each with its span from its first decorator,
the def around it and the class it is a method of), every class statement of the file (its span
and the last name of each base), and the module-level relative imports (level and module).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

from mlx_invariants.checker import source

# Decorators that leave a def called by its name, as any other.
_PLAIN = frozenset({"staticmethod", "classmethod"})
_BODIES = ("body", "orelse", "finalbody")


@dataclass(frozen=True)
class ClassSpan:
    """A class statement: its name, first and last line, and the last name of each base (None
    where a base is not a name, an attribute, a subscript or a call of one)."""

    name: str
    first: int
    last: int
    bases: tuple[str | None, ...]


@dataclass(frozen=True)
class DefSpan:
    """A def: its name, span (from its first decorator), the index of the def around it and of the
    class it is a method of (-1: none), and whether a decorator other than staticmethod or
    classmethod wraps it."""

    name: str
    first: int
    last: int
    parent: int
    cls: int
    decorated: bool


@dataclass(frozen=True)
class Outline:
    defs: tuple[DefSpan, ...]
    classes: tuple[ClassSpan, ...]
    relative_imports: tuple[tuple[int, str], ...]  # module-level `from .x import y`: (level, module)

    def to_json(self) -> list[Any]:
        return [[[d.name, d.first, d.last, d.parent, d.cls, d.decorated] for d in self.defs],
                [[c.name, c.first, c.last, list(c.bases)] for c in self.classes],
                [list(i) for i in self.relative_imports]]

    @classmethod
    def from_json(cls, data: list[Any]) -> Outline:
        defs, classes, imports = data
        return cls(tuple(DefSpan(*d) for d in defs),
                   tuple(ClassSpan(n, f, last, tuple(b)) for n, f, last, b in classes),
                   tuple((level, module) for level, module in imports))


def outline(text: str) -> Outline | None:
    """The text's outline; None where CPython cannot parse it."""
    try:
        tree = source.python_tree(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    defs: list[DefSpan] = []
    classes: list[ClassSpan] = []
    _walk(tree.body, -1, -1, defs, classes)
    imports = tuple((s.level, s.module or "") for s in tree.body if isinstance(s, ast.ImportFrom) and s.level)
    return Outline(tuple(defs), tuple(classes), imports)


def _walk(body: list[ast.stmt], parent: int, cls: int, defs: list[DefSpan], classes: list[ClassSpan]) -> None:
    """Statements only, every list of them: a def or a class is one. A function of the module, not a closure
    of `outline`: a closure that calls itself is a cycle, which kept the spans until the cyclic collector ran."""
    for stmt in body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([stmt.lineno, *(d.lineno for d in stmt.decorator_list)])
            decorated = any(terminal(d) not in _PLAIN for d in stmt.decorator_list)
            defs.append(DefSpan(stmt.name, first, stmt.end_lineno or stmt.lineno, parent, cls, decorated))
            _walk(stmt.body, len(defs) - 1, -1, defs, classes)
            continue
        inner = cls
        if isinstance(stmt, ast.ClassDef):
            inner = len(classes)
            classes.append(ClassSpan(stmt.name, stmt.lineno, stmt.end_lineno or stmt.lineno,
                                     tuple(terminal(b) for b in stmt.bases)))
        for field in _BODIES:
            part = getattr(stmt, field, None)
            if isinstance(part, list) and part and isinstance(part[0], ast.stmt):
                _walk(part, parent, inner, defs, classes)
        for handler in getattr(stmt, "handlers", ()):
            _walk(handler.body, parent, inner, defs, classes)
        for case in getattr(stmt, "cases", ()):
            _walk(case.body, parent, inner, defs, classes)


def terminal(expr: ast.AST) -> str | None:
    """`Base`, `mod.Base`, `Generic[T]`, `decorator(...)`: the last name."""
    while isinstance(expr, ast.Subscript | ast.Call):
        expr = expr.value if isinstance(expr, ast.Subscript) else expr.func
    if isinstance(expr, ast.Attribute):
        return expr.attr
    if isinstance(expr, ast.Name):
        return expr.id
    return None
