"""The `with` items and `try` statements around the node being visited, per frame.

Rules that ask "is this await inside `async with lock` and inside a try whose
handler drains the worker?" keep one of these. Entries live per frame, so a
nested def inside `async with lock:` does not count as holding the lock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import libcst as cst

if TYPE_CHECKING:
    from mlx_invariants.checker.walker import FileContext


@dataclass
class WithItem:
    node: cst.With
    expr: cst.BaseExpression
    is_async: bool
    tries: int  # how many try statements were open when the block was entered


@dataclass
class OpenTry:
    node: cst.Try
    in_body: bool = True  # False once the walk is in one of its handlers, else or finally


@dataclass
class _FrameBlocks:
    withs: list[WithItem] = field(default_factory=list)
    tries: list[OpenTry] = field(default_factory=list)


class Blocks:
    def __init__(self, ctx: FileContext) -> None:
        self.ctx = ctx
        self._frames: dict[int, _FrameBlocks] = {}

    def _here(self) -> _FrameBlocks:
        key = id(self.ctx.scope.top.node)
        found = self._frames.get(key)
        if found is None:
            found = self._frames[key] = _FrameBlocks()
        return found

    @property
    def withs(self) -> list[WithItem]:
        return self._here().withs

    @property
    def tries(self) -> list[OpenTry]:
        return self._here().tries

    def enter_with(self, node: cst.With) -> None:
        here = self._here()
        for item in node.items:
            self.ctx.pin(item.item)
            here.withs.append(WithItem(node, item.item, node.asynchronous is not None, len(here.tries)))

    def leave_with(self, node: cst.With) -> None:
        here = self._here()
        while here.withs and here.withs[-1].node is node:
            here.withs.pop()

    def enter_try(self, node: cst.Try) -> None:
        self._here().tries.append(OpenTry(node))

    def leave_try(self, node: cst.Try) -> None:
        tries = self._here().tries
        if tries and tries[-1].node is node:
            tries.pop()

    def enter_clause(self, node: cst.CSTNode) -> None:
        """An except/else/finally of the innermost open try: code there is not in its body."""
        tries = self._here().tries
        if tries:
            owner = tries[-1].node
            if node is owner.orelse or node is owner.finalbody or any(node is h for h in owner.handlers):
                tries[-1].in_body = False
