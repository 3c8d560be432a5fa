"""What one walk learns about a file, for the rules that decide at the end.

Which names and attributes are assigned what (`self._lock = asyncio.Lock()`),
which calls each function makes, and which numbers module constants hold.
Names are resolved when the call is seen, so function-local imports count.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import libcst as cst


class CallSite:
    """One call: its node, its qualified callee (if imported), its dotted text, its key."""

    __slots__ = ("node", "qual", "text", "key")

    def __init__(self, node: cst.Call, qual: str | None, text: str | None, key: str | None) -> None:
        self.node = node
        self.qual = qual
        self.text = text
        self.key = key


class FunctionFacts:
    """A def, async def or lambda: its key (`f`, `Class.method`) and the calls in its own body."""

    __slots__ = ("node", "key", "calls")

    def __init__(self, node: cst.CSTNode, key: str | None) -> None:
        self.node = node
        self.key = key
        self.calls: list[CallSite] = []


class Assignment:
    """`target = value`, with the qualified name of `value`'s callee when it is a call, and the
    def (or module) it stands in, by id of its node."""

    __slots__ = ("value", "call_qual", "scope")

    def __init__(self, value: cst.BaseExpression, call_qual: str | None, scope: int) -> None:
        self.value = value
        self.call_qual = call_qual
        self.scope = scope


class Facts:
    def __init__(self) -> None:
        self.functions: dict[int, FunctionFacts] = {}
        self.by_key: dict[str, list[FunctionFacts]] = {}
        self.assigned: dict[str, list[Assignment]] = {}
        self.constants: dict[str, float] = {}
        self.imports_mlx = False
        self.imports_other_engine = False  # torch, vllm, llama.cpp, ...: mlx_api.OTHER_ENGINES
        self.module_calls: FunctionFacts | None = None  # the module body's own calls
        # Answers computed once from these facts, at the end, by whichever rule asks first.
        self.memo: dict[str, Any] = {}

    def add_function(self, facts: FunctionFacts) -> None:
        self.functions[id(facts.node)] = facts
        if facts.key:
            self.by_key.setdefault(facts.key, []).append(facts)

    def assign(self, key: str, value: cst.BaseExpression, call_qual: str | None, scope: int) -> None:
        self.assigned.setdefault(key, []).append(Assignment(value, call_qual, scope))

    def assigned_in(self, key: str, scope: int) -> list[Assignment]:
        """The assignments to `key` made in the def `scope` (by id of its node) or in the module body: where a
        bare name means the same thing as at a call in that def (the same short name may be another thing
        in another def)."""
        module = self.module_calls
        places = {scope, id(module.node) if module is not None else None}
        return [a for a in self.assigned.get(key, ()) if a.scope in places]

    def scope_of(self, call: cst.Call) -> int | None:
        """The def (or module) whose own body makes `call`, by id of its node, as `Assignment.scope`."""
        scopes = self.memo.get("call-scopes")
        if scopes is None:
            scopes = self.memo["call-scopes"] = {
                id(site.node): id(fn.node) for fn in [self.module_calls, *self.functions.values()]
                if fn is not None for site in fn.calls
            }
        return scopes.get(id(call))

    def constructed_by(self, key: str | None) -> set[str]:
        """Qualified callees whose results were assigned to `key` anywhere in the file."""
        if key is None:
            return set()
        return {a.call_qual for a in self.assigned.get(key, ()) if a.call_qual}

    def callees(self, fn: FunctionFacts) -> Iterator[FunctionFacts]:
        """Functions of this file that `fn` calls by name or as `self.method`."""
        for site in fn.calls:
            if site.key:
                yield from self.by_key.get(site.key, ())

    def first_reaching(self, fn: FunctionFacts, direct: Callable[[CallSite], str | None],
                       into_async: bool = True) -> str | None:
        """What `fn` reaches, directly or through the file's own functions: `direct`'s answer or None.

        `into_async=False` stops at an `async def` that `fn` (or a def it calls) calls: that call only
        makes a coroutine, whose body runs where it is awaited or scheduled, not in the caller."""
        return next((what for _, site in self.reached_calls(fn, into_async) if (what := direct(site))), None)

    def reached_calls(self, fn: FunctionFacts, into_async: bool = True) -> Iterator[tuple[FunctionFacts, CallSite]]:
        """Each call `fn` makes, and the file's own functions it calls make (each function once), with the
        function that makes it; `into_async` as in first_reaching."""
        seen: set[int] = set()
        stack = [fn]
        while stack:
            current = stack.pop()
            if id(current.node) in seen:
                continue
            seen.add(id(current.node))
            if not into_async and current is not fn and _is_async(current.node):
                continue
            for site in current.calls:
                yield current, site
            stack.extend(self.callees(current))


def _is_async(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.FunctionDef) and node.asynchronous is not None


def number(expr: cst.BaseExpression, constants: dict[str, float]) -> float | None:
    """The value of a constant number expression (`120`, `2 * 60`, `TIMEOUT`), else None."""
    if isinstance(expr, cst.Integer | cst.Float):
        try:
            return float(expr.evaluated_value)
        except (ValueError, OverflowError):
            return None
    if isinstance(expr, cst.Name):
        return constants.get(expr.value)
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
        value = number(expr.expression, constants)
        return None if value is None else -value
    if isinstance(expr, cst.BinaryOperation):
        left, right = number(expr.left, constants), number(expr.right, constants)
        if left is None or right is None:
            return None
        op = expr.operator
        if isinstance(op, cst.Multiply):
            return left * right
        if isinstance(op, cst.Add):
            return left + right
        if isinstance(op, cst.Subtract):
            return left - right
        if isinstance(op, cst.Divide) and right:
            return left / right
    return None
