"""Who runs the coroutines of a file, and who reads how their tasks ended, as far as the file says.

A rule that keeps an `Awaiters` feeds it from its own visit methods (`on_await`, `on_for`,
`on_with`/`on_with_exit`, `on_assign`, `on_call`, in walk order) and asks in `end()`:
`uses(key)` lists each call of a def of the file (by key, `Engine._loop`) with how it is run;
`observed(name)` tells whether a task kept under `name` is ever awaited, gathered or asked for
its outcome (`result()`, `exception()`, `cancelled()`) anywhere in the file. The stop() idiom reads
no outcome: a def that cancels the task and then awaits it where CancelledError is discarded
(`t.cancel(); try: await t except CancelledError: pass`, or under `suppress(CancelledError)`) goes
on alike whether the task ended done or cancelled, so that await does not count as observing it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from mlx_invariants.checker.cancellers import caught
from mlx_invariants.checker.walker import OWN_BODY_STOP, descendants

if TYPE_CHECKING:
    from mlx_invariants.checker.walker import FileContext

AWAITED = "await"  # run in the caller's task: `await f()`, `async for x in f()`, gathered, shielded
TASK = "task"      # started as a task of its own
OTHER = "other"    # handed on or stored: who runs it is not known here

# Await what they are given, in the caller's task or as tasks it waits on.
_COLLECTORS = frozenset({"asyncio.gather", "asyncio.wait", "asyncio.wait_for", "asyncio.shield",
                         "asyncio.tasks.gather", "asyncio.tasks.wait", "asyncio.tasks.wait_for",
                         "asyncio.tasks.shield"})
# Cancel what they wait for on a timeout, and raise TimeoutError only when it ends cancelled.
_TIMEOUTS = frozenset({"asyncio.wait_for", "asyncio.tasks.wait_for"})
_TIMEOUT_BLOCKS = frozenset({"asyncio.timeout", "asyncio.timeout_at", "asyncio.timeouts.timeout",
                             "asyncio.timeouts.timeout_at"})
_SPAWNERS = frozenset({"asyncio.create_task", "asyncio.ensure_future", "asyncio.tasks.create_task",
                       "asyncio.tasks.ensure_future", "asyncio.run_coroutine_threadsafe"})
_TASK_GROUPS = frozenset({"asyncio.TaskGroup", "asyncio.taskgroups.TaskGroup"})
_OUTCOME = frozenset({"result", "exception", "cancelled"})
# What an `except` (or `suppress`) must name to catch a task's cancellation.
_CANCELLATION = frozenset({"asyncio.CancelledError", "asyncio.exceptions.CancelledError", "BaseException",
                           "builtins.BaseException"})
_SUPPRESS = frozenset({"contextlib.suppress"})


@dataclass(frozen=True)
class Use:
    """One call of a def of the file, and how what it returns is run."""

    kind: str  # AWAITED, TASK or OTHER
    frame: cst.CSTNode  # the def (or module) the call is made in
    statement: cst.CSTNode | None  # the statement it is made in
    timed: bool = False  # awaited under wait_for or `async with asyncio.timeout()`
    handle: str | None = None  # a task's name where it is kept (`self._task`); None: dropped or in a container
    grouped: bool = False  # a task started in a TaskGroup, which awaits it


class Awaiters:
    def __init__(self, ctx: FileContext) -> None:
        self.ctx = ctx
        self._awaited: dict[int, bool] = {}  # id of a call run in its caller's task -> under a timeout
        self._spawned: dict[int, tuple[str | None, bool]] = {}  # id of a call started as a task -> (handle, grouped)
        self._handles: dict[int, str] = {}  # id of a task-making call -> the name it is assigned to
        self._timeouts: dict[int, int] = {}  # per frame: depth of `async with asyncio.timeout(...)`
        self._observed: set[str] = set()
        self._cancelled: dict[int, set[str]] = {}  # per frame: keys `.cancel()` was called on so far
        self._discarded: set[int] = set()  # ids of awaits whose CancelledError is caught and dropped
        self._uses: dict[str, list[Use]] = {}

    def uses(self, key: str | None) -> list[Use]:
        return self._uses.get(key or "", [])

    def observed(self, name: str | None) -> bool:
        return name is not None and name in self._observed

    # --- fed by the rule's visit methods ----------------------------------------------------
    def on_await(self, node: cst.Await) -> None:
        if id(node) in self._discarded and self._cancelled_here(node.expression):
            return  # the stop() idiom: done or cancelled, the stopper goes on alike
        self._consumed(node.expression, self._timed())

    def on_try(self, node: cst.Try) -> None:
        """A try whose body is one await and whose handler of CancelledError drops it and falls
        through to the statement after the try, where a normal end of the await also goes."""
        if node.orelse is None and any(self._catches_cancellation(h.type) and _falls_through(h)
                                       for h in node.handlers):
            self._discard(node.body)

    def on_for(self, node: cst.For) -> None:
        if node.asynchronous is not None:
            self._consumed(node.iter, self._timed())

    def on_with(self, node: cst.With) -> None:
        if any(isinstance(i.item, cst.Call) and self.ctx.resolve(i.item.func) in _SUPPRESS
               and any(self._catches_cancellation(a.value) for a in i.item.args) for i in node.items):
            self._discard(node.body)
        if self._is_timeout(node):
            frame = id(self.ctx.scope.top.node)
            self._timeouts[frame] = self._timeouts.get(frame, 0) + 1

    def on_with_exit(self, node: cst.With) -> None:
        if self._is_timeout(node):
            frame = id(self.ctx.scope.top.node)
            self._timeouts[frame] = self._timeouts.get(frame, 1) - 1

    def on_assign(self, target: cst.BaseExpression, value: cst.BaseExpression | None) -> None:
        if isinstance(value, cst.Call) and isinstance(target, cst.Name | cst.Attribute):
            key = self.ctx.key(target)
            if key is not None:
                self._handles[id(value)] = key

    def on_call(self, node: cst.Call) -> None:
        func = node.func
        qual = self.ctx.resolve(func)
        if qual in _COLLECTORS:
            timed = self._awaited.get(id(node), False) or qual in _TIMEOUTS
            for arg in node.args:
                values = arg.value.elements if isinstance(arg.value, cst.List | cst.Tuple | cst.Set) else [arg]
                for value in values:
                    self._consumed(value.value, timed)
        elif qual in _SPAWNERS or (isinstance(func, cst.Attribute) and func.attr.value == "create_task"):
            started = node.args[0].value if node.args and node.args[0].keyword is None else None
            if isinstance(started, cst.Call):
                grouped = isinstance(func, cst.Attribute) and bool(
                    self.ctx.facts.constructed_by(self.ctx.key(func.value)) & _TASK_GROUPS)
                self._spawned[id(started)] = (self._handles.get(id(node)), grouped)
        elif isinstance(func, cst.Attribute) and func.attr.value == "cancel":
            key = self.ctx.key(func.value)
            if key is not None:
                self._cancelled.setdefault(id(self.ctx.scope.top.node), set()).add(key)
        elif isinstance(func, cst.Attribute) and func.attr.value in _OUTCOME and not node.args:
            key = self.ctx.key(func.value)
            if key is not None:
                self._observed.add(key)
        callee = self.ctx.key(func)
        if callee is None:
            return
        frame, statement = self.ctx.scope.top.node, self.ctx.statement
        if id(node) in self._awaited:
            use = Use(AWAITED, frame, statement, timed=self._awaited[id(node)])
        elif id(node) in self._spawned:
            handle, grouped = self._spawned[id(node)]
            use = Use(TASK, frame, statement, handle=handle, grouped=grouped)
        else:
            use = Use(OTHER, frame, statement)
        self._uses.setdefault(callee, []).append(use)

    # --- helpers ------------------------------------------------------------------------------
    def _consumed(self, expr: cst.BaseExpression, timed: bool) -> None:
        """`expr` is awaited (or iterated by `async for`) where it stands: a call runs in this task,
        a name is a task whose outcome is read."""
        if isinstance(expr, cst.Call):
            self._awaited[id(expr)] = timed
        elif isinstance(expr, cst.Name | cst.Attribute):
            key = self.ctx.key(expr)
            if key is not None:
                self._observed.add(key)

    def _cancelled_here(self, expr: cst.BaseExpression) -> bool:
        key = self.ctx.key(expr) if isinstance(expr, cst.Name | cst.Attribute) else None
        return key is not None and key in self._cancelled.get(id(self.ctx.scope.top.node), ())

    def _discard(self, body: cst.BaseSuite) -> None:
        """The body's await, when it is the body's one statement (`await t`)."""
        lines = body.body
        if len(lines) == 1 and isinstance(lines[0], cst.SimpleStatementLine) and len(lines[0].body) == 1:
            only = lines[0].body[0]
            if isinstance(only, cst.Expr) and isinstance(only.value, cst.Await):
                self._discarded.add(id(only.value))

    def _catches_cancellation(self, kind: cst.BaseExpression | None) -> bool:
        if kind is None:
            return True
        return any(qual in _CANCELLATION for qual in caught(kind, self.ctx))

    def _timed(self) -> bool:
        return self._timeouts.get(id(self.ctx.scope.top.node), 0) > 0

    def _is_timeout(self, node: cst.With) -> bool:
        return node.asynchronous is not None and any(
            isinstance(i.item, cst.Call) and self.ctx.resolve(i.item.func) in _TIMEOUT_BLOCKS for i in node.items)


def _falls_through(handler: cst.ExceptHandler) -> bool:
    """The handler neither raises nor leaves by return, break or continue."""
    leaves = (cst.Raise, cst.Return, cst.Break, cst.Continue)
    return not any(isinstance(n, leaves) for n in descendants(handler.body, OWN_BODY_STOP))
