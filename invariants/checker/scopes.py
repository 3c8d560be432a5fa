"""Which context the code at a node runs in, as a stack of frames.

An `async def` body runs on the event loop. A nested `def`, a `lambda`, a class
body, and a generator expression handed to a worker thread start a new, sync
frame: code there is not "inside the async def", even though it is nested in
it. Comprehensions and plain generator expressions stay in the enclosing frame.
"""

from __future__ import annotations

from enum import Enum

import libcst as cst

from mlx_invariants.checker.names import ImportTable


class Kind(Enum):
    MODULE = "module"
    CLASS = "class"
    ASYNC = "async def"
    SYNC = "def"
    LAMBDA = "lambda"
    EXECUTOR = "executor callable"


FUNCTION_KINDS = (Kind.ASYNC, Kind.SYNC, Kind.LAMBDA)


class Frame:
    """One scope: its kind, its node, its name, and its own imports."""

    __slots__ = ("kind", "node", "name", "imports", "class_name")

    def __init__(self, kind: Kind, node: cst.CSTNode, name: str, class_name: str | None) -> None:
        self.kind = kind
        self.node = node
        self.name = name
        self.imports = ImportTable()
        # For a method: the class it is defined in.
        self.class_name = class_name


class ScopeStack:
    """The frames from the module down to the node being visited."""

    def __init__(self, module: cst.Module) -> None:
        self.frames: list[Frame] = [Frame(Kind.MODULE, module, "<module>", None)]
        self.tables: list[ImportTable] = [self.frames[0].imports]

    @property
    def top(self) -> Frame:
        return self.frames[-1]

    @property
    def in_async(self) -> bool:
        """True when code here runs directly on the event loop, in an async def body."""
        return self.frames[-1].kind is Kind.ASYNC

    def push(self, kind: Kind, node: cst.CSTNode, name: str) -> None:
        below = self.frames[-1]
        class_name = below.name if below.kind is Kind.CLASS else None
        frame = Frame(kind, node, name, class_name)
        self.frames.append(frame)
        self.tables.append(frame.imports)

    def pop(self) -> None:
        self.frames.pop()
        self.tables.pop()

    def function(self) -> Frame | None:
        """The innermost def, async def or lambda, if any."""
        for frame in reversed(self.frames):
            if frame.kind in FUNCTION_KINDS:
                return frame
        return None

    def method_class(self) -> str | None:
        """The class whose method we are in (through nested defs), for `self.x`."""
        for frame in reversed(self.frames):
            if frame.class_name is not None:
                return frame.class_name
            if frame.kind is Kind.CLASS:
                return frame.name
        return None

    def add_import(self, node: cst.Import | cst.ImportFrom) -> None:
        """Record an import in the innermost function (or module) frame."""
        for frame in reversed(self.frames):
            if frame.kind is not Kind.CLASS:
                frame.imports.add(node)
                return
