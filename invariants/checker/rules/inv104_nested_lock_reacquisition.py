from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from mlx_invariants.checker.locks import SEMAPHORES, acquired_lock, is_lock
from mlx_invariants.checker.names import dotted
from mlx_invariants.checker.rule import Invalid, Rule, Valid
from mlx_invariants.checker.scopes import Kind


@dataclass
class _Held:
    key: str
    expr: cst.BaseExpression
    explicit: bool = False  # taken by `await L.acquire()`: held until `L.release()` in the same function


@dataclass
class _Call:
    callee: str
    text: str
    held: list[_Held]
    node: cst.CSTNode
    statement: cst.CSTNode | None


@dataclass
class _Function:
    enters: dict[str, cst.BaseExpression] = field(default_factory=dict)
    awaits: set[str] = field(default_factory=set)


class NestedLockReacquisition(Rule):
    """asyncio.Lock is not reentrant. A method that awaits, while holding
    `self._lock`, another method of the same class that enters `self._lock`
    (directly or through further methods) waits for itself forever: the request
    hangs and every later request queues behind it. This is what happens when a
    helper that takes the lock is called from a block that already holds it."""

    id = "INV104"
    catches = "awaiting, under `async with L`, a function that enters L again (deadlock)"
    message = (
        "`{call}` enters `{lock}` again while this block holds it (asyncio locks are not reentrant, "
        "so it deadlocks): call a variant that expects the lock held, or take the lock in one place"
    )
    known_problems = (
        "Follows `self.method()` and module functions awaited directly, through any depth, within one "
        "file; not base classes, callbacks, or locks passed as arguments. A lock taken with "
        "`await L.acquire()` counts as held until `L.release()` appears later in the same function, in "
        "source order. Semaphores are not judged."
    )
    triggers = (("async",),)

    INVALID = [
        Invalid('''
            import asyncio

            class SimpleEngine:
                def __init__(self):
                    self._lock = asyncio.Lock()

                async def _post_serialized(self, job):
                    async with self._lock:
                        self._owner.post(job)

                async def submit(self, job):
                    await self._lock.acquire()
                    await self._post_serialized(job)  # expect: INV104
        '''),
        Invalid('''
            import asyncio

            class SimpleEngine:
                def __init__(self):
                    self._lock = asyncio.Lock()

                async def _run_serialized(self, fn):
                    async with self._lock:
                        return await self._drain(fn)

                async def stream_text(self, fn):
                    async with self._lock:
                        return await self._run_serialized(fn)  # expect: INV104
        '''),
        Invalid('''
            import asyncio

            LOCK = asyncio.Lock()

            async def step():
                await LOCK.acquire()
                LOCK.release()

            async def run():
                async with LOCK:
                    await step()  # expect: INV104
        '''),
    ]
    VALID = [
        Valid('''
            import asyncio

            class SimpleEngine:
                def __init__(self):
                    self._lock = asyncio.Lock()

                async def _run_serialized(self, fn):
                    async with self._lock:
                        return await self._drain(fn)

                async def stream_text(self, fn):
                    return await self._run_serialized(fn)
        '''),
        Valid('''
            import asyncio

            LOCK = asyncio.Lock()

            async def step():
                await LOCK.acquire()
                LOCK.release()

            async def run():
                await step()
        '''),
        Valid('''
            import asyncio

            class SimpleEngine:
                def __init__(self):
                    self._lock = asyncio.Lock()

                async def _post_serialized(self, job):
                    async with self._lock:
                        self._owner.post(job)

                async def submit(self, job):
                    await self._lock.acquire()
                    self._lock.release()
                    await self._post_serialized(job)
        '''),
        Valid('''
            import asyncio

            class Pool:
                def __init__(self):
                    self._sem = asyncio.Semaphore(4)

                async def one(self):
                    async with self._sem:
                        return await self.two()

                async def two(self):
                    async with self._sem:
                        return 2
        '''),
    ]

    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        self.functions: dict[str, _Function] = {}
        self.held: dict[int, list[_Held]] = {}
        self.calls: list[_Call] = []

    def _current(self) -> tuple[str, list[_Held]] | None:
        frame = self.ctx.scope.top
        if frame.kind is not Kind.ASYNC:
            return None
        key = f"{frame.class_name}.{frame.name}" if frame.class_name else frame.name
        return key, self.held.setdefault(id(frame.node), [])

    def _enter(self, expr: cst.BaseExpression, node: cst.CSTNode) -> _Held | None:
        current = self._current()
        key = self.ctx.key(expr)
        if current is None or key is None:
            return None
        self.ctx.pin(expr)
        function, held = current
        self.functions.setdefault(function, _Function()).enters.setdefault(key, expr)
        if any(h.key == key for h in held):
            text = f"await {dotted(expr)}.acquire()" if isinstance(node, cst.Await) else f"async with {dotted(expr)}"
            self.calls.append(_Call("", text, list(held), node, self.ctx.statement))
        return _Held(key, expr)

    def _await_call(self, call: cst.BaseExpression, node: cst.CSTNode) -> None:
        current = self._current()
        if current is None or not isinstance(call, cst.Call):
            return
        callee = self.ctx.key(call.func)
        if callee is None:
            return
        function, held = current
        self.functions.setdefault(function, _Function()).awaits.add(callee)
        if held:
            self.calls.append(_Call(callee, f"await {dotted(call.func) or callee}()", list(held), node, self.ctx.statement))

    def visit_With(self, node: cst.With) -> None:
        if node.asynchronous is None:
            return
        current = self._current()
        for item in node.items:
            if isinstance(item.item, cst.Call):
                self._await_call(item.item, node)
                continue
            entered = self._enter(item.item, node)
            if entered is not None and current is not None:
                current[1].append(entered)

    def leave_With(self, node: cst.With) -> None:
        if node.asynchronous is None:
            return
        current = self._current()
        if current is None:
            return
        held = current[1]
        for item in node.items:
            for index in range(len(held) - 1, -1, -1):
                if held[index].expr is item.item:
                    del held[index]
                    break

    def visit_Await(self, node: cst.Await) -> None:
        lock = acquired_lock(node.expression)
        if lock is None:
            self._await_call(node.expression, node)
            return
        entered = self._enter(lock, node)
        current = self._current()
        if entered is not None and current is not None:
            entered.explicit = True
            current[1].append(entered)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "release"):
            return
        current = self._current()
        key = self.ctx.key(func.value)
        if current is None or key is None:
            return
        held = current[1]
        for index in range(len(held) - 1, -1, -1):
            if held[index].explicit and held[index].key == key:
                del held[index]
                break

    def visit_For(self, node: cst.For) -> None:
        if node.asynchronous is not None:
            self._await_call(node.iter, node)

    def end(self) -> None:
        for call in self.calls:
            locks = {h.key: h.expr for h in call.held if self._reentry_deadlocks(h.expr)}
            if not locks:
                continue
            if not call.callee:
                entered = locks
            else:
                entered = self._entered_through(call.callee)
            for key, expr in locks.items():
                if key in entered:
                    message = self.message.format(call=call.text, lock=dotted(expr))
                    self.ctx.report_at(self.id, call.node, call.statement, message)
                    break

    def _reentry_deadlocks(self, expr: cst.BaseExpression) -> bool:
        return is_lock(expr, self.ctx) and not self.ctx.facts.constructed_by(self.ctx.key(expr)) & SEMAPHORES

    def _entered_through(self, start: str) -> set[str]:
        """Lock keys `start` enters, directly or through the functions it awaits."""
        seen: set[str] = set()
        entered: set[str] = set()
        stack = [start]
        while stack:
            key = stack.pop()
            if key in seen:
                continue
            seen.add(key)
            function = self.functions.get(key)
            if function is not None:
                entered.update(function.enters)
                stack.extend(function.awaits)
        return entered

