"""What a coroutine does once a statement of its body has finished: it ends, or it suspends again.

A swallowed cancellation matters when the coroutine goes on working under it (another `await`,
`yield`, `async for` or `async with`, or another round of its loop) or when its caller does.
`Continuation` indexes one function's own statements by where each sits (its block and the
statement that owns the block) and follows the normal flow from a statement to the function's
end. `finally` blocks and the exit of an `async with` run whether the exception goes on or not,
so they never count; synchronous statements before the end do not either (they finish in the
same turn). Branches are not told apart: a suspension on any path after the statement counts,
and only a `return`, `raise`, `break` or `continue` on the path itself changes where it goes.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

import libcst as cst

from mlx_invariants.checker.walker import OWN_BODY_STOP, descendants


class Next(Enum):
    ENDS = "ends"        # the function returns (or raises) without suspending again
    RESUMES = "resumes"  # it awaits, yields or goes round its loop again first


_Place = tuple[cst.CSTNode, str, Sequence[cst.CSTNode], int]  # (owner, which block, the block, index)
_LOOPS = (cst.For, cst.While)


class Continuation:
    """The statements of one function's own body (nested defs and classes excluded)."""

    def __init__(self, function: cst.FunctionDef) -> None:
        self.function = function
        self._places: dict[int, _Place] = {}
        self._index(function, "body", _statements(function.body))

    def _index(self, owner: cst.CSTNode, part: str, block: Sequence[cst.CSTNode]) -> None:
        for index, statement in enumerate(block):
            self._places[id(statement)] = (owner, part, block, index)
            if isinstance(statement, cst.FunctionDef | cst.ClassDef):
                continue
            for inner_part, inner in _blocks(statement):
                self._index(statement, inner_part, inner)

    def knows(self, statement: cst.CSTNode) -> bool:
        return id(statement) in self._places

    def after(self, statement: cst.CSTNode) -> Next:
        """Where the flow goes once `statement` has finished normally. A statement this function
        does not hold (a nested def's) counts as resuming: nothing is known of what follows."""
        node = statement
        while id(node) in self._places:
            owner, part, block, index = self._places[id(node)]
            jump = _run(block[index + 1:])
            if jump == "break":
                node = self.loop_around(node)
                if node is None:
                    return Next.RESUMES
                continue
            if isinstance(jump, Next):
                return jump
            if owner is self.function:
                return Next.ENDS
            if isinstance(owner, _LOOPS) and part == "body":
                return Next.RESUMES  # round the loop again
            if isinstance(owner, cst.Try | cst.TryStar) and part == "body" and owner.orelse is not None:
                jump = _run(_statements(owner.orelse.body))
                if jump == "break":
                    node = self.loop_around(owner)
                    if node is None:
                        return Next.RESUMES
                    continue
                if isinstance(jump, Next):
                    return jump
            node = owner
        return Next.RESUMES

    def loop_around(self, statement: cst.CSTNode) -> cst.CSTNode | None:
        """The innermost loop whose body holds `statement` (what a `break` there leaves)."""
        node = statement
        while id(node) in self._places:
            owner, part, _, _ = self._places[id(node)]
            if isinstance(owner, _LOOPS) and part == "body":
                return owner
            if owner is self.function:
                return None
            node = owner
        return None


def _statements(suite: cst.BaseSuite) -> Sequence[cst.CSTNode]:
    return suite.body  # an indented block's statements, or a one-line suite's small statements


def _blocks(statement: cst.CSTNode) -> list[tuple[str, Sequence[cst.CSTNode]]]:
    if isinstance(statement, cst.If):
        found = [("body", _statements(statement.body))]
        if isinstance(statement.orelse, cst.If):
            found.append(("orelse", [statement.orelse]))
        elif statement.orelse is not None:
            found.append(("orelse", _statements(statement.orelse.body)))
        return found
    if isinstance(statement, _LOOPS):
        found = [("body", _statements(statement.body))]
        if statement.orelse is not None:
            found.append(("orelse", _statements(statement.orelse.body)))
        return found
    if isinstance(statement, cst.Try | cst.TryStar):
        found = [("body", _statements(statement.body))]
        found += [("handler", _statements(h.body)) for h in statement.handlers]
        if statement.orelse is not None:
            found.append(("orelse", _statements(statement.orelse.body)))
        if statement.finalbody is not None:
            found.append(("finally", _statements(statement.finalbody.body)))
        return found
    if isinstance(statement, cst.With):
        return [("body", _statements(statement.body))]
    if isinstance(statement, cst.Match):
        return [("case", _statements(case.body)) for case in statement.cases]
    return []


def _run(statements: Sequence[cst.CSTNode]) -> Next | str | None:
    """Run `statements` in order: RESUMES at the first that suspends, ENDS at a `return`/`raise`,
    "break" at a `break`, RESUMES at a `continue`; None when the flow falls off their end."""
    for statement in statements:
        if isinstance(statement, cst.FunctionDef | cst.ClassDef):
            continue  # defining runs nothing
        if suspends(statement):
            return Next.RESUMES
        smalls = statement.body if isinstance(statement, cst.SimpleStatementLine) else [statement]
        for small in smalls:
            if isinstance(small, cst.Return | cst.Raise):
                return Next.ENDS
            if isinstance(small, cst.Break):
                return "break"
            if isinstance(small, cst.Continue):
                return Next.RESUMES
    return None


def suspends(node: cst.CSTNode) -> bool:
    """`node` awaits, yields, or enters `async for` / `async with` (nested defs aside)."""
    for inner in [node, *descendants(node, OWN_BODY_STOP)]:
        if isinstance(inner, cst.Await | cst.Yield):
            return True
        if isinstance(inner, cst.For | cst.With) and inner.asynchronous is not None:
            return True
    return False
