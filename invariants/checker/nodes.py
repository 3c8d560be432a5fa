"""A libcst node's children, read from its fields: the walk's own, and what helpers that walk a subtree use.

libcst's `children` property rebuilds every node below the one asked; reading the dataclass fields
does not. Kept apart from walker.py so that modules the walker imports (offload.py) can walk too.
"""

from __future__ import annotations

import dataclasses

import libcst as cst

_SKIP_FIELDS = frozenset({
    "lpar", "rpar", "leading_lines", "lines_after_decorators", "header", "footer", "comma", "semicolon",
    "equal", "colon", "dot", "asynchronous", "star", "trailing_whitespace", "operator", "relative",
})
_NO_CHILDREN = (cst.Import, cst.ImportFrom, cst.Comment, cst.EmptyLine)
_fields: dict[type, tuple[str, ...]] = {}


def child_fields(cls: type) -> tuple[str, ...]:
    """The fields of a node class that hold child nodes (whitespace and punctuation left out), remembered."""
    names = _fields.get(cls)
    if names is None:
        if issubclass(cls, _NO_CHILDREN):
            names = ()
        else:
            names = tuple(
                f.name for f in dataclasses.fields(cls)
                if not f.name.startswith("whitespace") and f.name not in _SKIP_FIELDS
            )
        _fields[cls] = names
    return names


class Classes(dict):
    """Whether a class is a subclass of `bases`, remembered per class: CSTNode is an ABC,
    and `isinstance` against an ABC was about a quarter of the walk's time."""

    def __init__(self, bases: type | tuple[type, ...]) -> None:
        super().__init__()
        self.bases = bases

    def __missing__(self, cls: type) -> bool:
        answer = self[cls] = issubclass(cls, self.bases)
        return answer


IS_NODE = Classes(cst.CSTNode)


def children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """The direct child nodes, without whitespace and punctuation."""
    found: list[cst.CSTNode] = []
    for name in child_fields(type(node)):
        value = getattr(node, name)
        items = value if type(value) is tuple or type(value) is list else (value,)
        found.extend([child for child in items if IS_NODE[type(child)]])
    return found
