from __future__ import annotations

import libcst as cst

from mlx_invariants.checker.blocks import Blocks
from mlx_invariants.checker.globs import matches_name
from mlx_invariants.checker.locks import LOCKS, acquired_lock, is_lock, is_timeout_scope
from mlx_invariants.checker.names import dotted
from mlx_invariants.checker.offload import keyword, positional
from mlx_invariants.checker.rule import Invalid, Rule, Valid
from mlx_invariants.checker.walker import descendants


class LockAsAdmissionQueue(Rule):
    """A lock or semaphore that requests wait on is an admission queue with no
    bound, no order and no way to tell a client "busy, retry later": waiters
    pile up behind a long generation until their clients time out, and the
    engine keeps working for requests nobody is waiting for anymore. Admission
    is a decision made up front (a counter or `locked()` check, then 503 +
    Retry-After), not a wait. Flags locks named like an admission queue,
    busy-waiting on `locked()` with sleeps, and locks acquired under a timeout
    in async code."""

    id = "INV102"
    # Opt-in: it detects no corpus case, and reviewers graded all 5 sampled findings on ten MLX servers not studied
    # here false (a lock named for admission that guards a counter, a load, or a shutdown wait).
    default_enabled = False
    catches = "a lock used as an admission queue: named so, busy-waited on, or acquired under a timeout"
    message = "{what}: decide admission up front (`locked()` or a counter) and reject with 503 + Retry-After"
    known_problems = (
        "Finds admission queues by name (admission-names) and by the shape of the wait; a plain "
        "`async with self._lock:` that requests queue on is not flagged here (see INV103)."
    )
    options = {"admission-names": ["*admission*", "*admit*", "*text_direct*", "*request_queue*", "*waiters_lock"]}
    triggers = (("Lock", "Semaphore", "CapacityLimiter", "locked(", "acquire(", "timeout", "fail_after", "move_on_after"),)

    INVALID = [
        Invalid('''
            import asyncio

            class Engine:
                def __init__(self):
                    self._admission_lock = asyncio.Lock()  # expect: INV102
        '''),
        Invalid('''
            import asyncio

            async def admit(lock):
                while lock.locked():  # expect: INV102
                    await asyncio.sleep(0.05)
        '''),
        Invalid('''
            import asyncio

            async def handle(self, request):
                async with asyncio.timeout(1):  # expect: INV102
                    async with self._slot_lock:
                        return await self.run(request)
        '''),
        Invalid('''
            import threading

            LOCK = threading.Lock()

            async def handle(request):
                if not LOCK.acquire(timeout=1):  # expect: INV102
                    raise Busy()
        '''),
    ]
    VALID = [
        Valid('''
            import asyncio

            class Engine:
                def __init__(self):
                    self._busy = False
        '''),
        Valid('''
            import asyncio

            async def admit(lock):
                if lock.locked():
                    raise Busy(retry_after=1)
        '''),
        Valid('''
            import asyncio

            async def handle(self, request):
                if self._slot_lock.locked():
                    raise Busy(retry_after=1)
                async with self._slot_lock:
                    return await self.run(request)
        '''),
        Valid('''
            import threading

            LOCK = threading.Lock()

            async def handle(request):
                if not LOCK.acquire(blocking=False):
                    raise Busy()
        '''),
    ]

    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        self.blocks = Blocks(ctx)

    def visit_With(self, node: cst.With) -> None:
        if node.asynchronous is not None and self.ctx.in_async:
            timed = [w for w in self.blocks.withs if w.is_async and is_timeout_scope(w.expr, self.ctx)]
            if timed and any(is_lock(item.item, self.ctx) for item in node.items):
                self.report(timed[-1].node, what=f"a lock is acquired under a timeout (`{_text(node.items[0].item)}`)")
        self.blocks.enter_with(node)

    def leave_With(self, node: cst.With) -> None:
        self.blocks.leave_with(node)

    def visit_Await(self, node: cst.Await) -> None:
        if self.ctx.in_async and acquired_lock(node.expression) is not None:
            timed = [w for w in self.blocks.withs if w.is_async and is_timeout_scope(w.expr, self.ctx)]
            if timed:
                self.report(timed[-1].node, what="a lock is acquired under a timeout")

    def visit_Call(self, node: cst.Call) -> None:
        lock = acquired_lock(node)
        if lock is None or not self.ctx.in_async:
            return
        blocking = keyword(node, "blocking") or positional(node, 0)
        if isinstance(blocking, cst.Name) and blocking.value == "False":
            return
        if keyword(node, "timeout") is not None or positional(node, 1) is not None:
            self.report(node, what=f"`{_text(lock)}.acquire(timeout=...)` blocks the event loop queueing for a lock")

    def visit_While(self, node: cst.While) -> None:
        if not any(_is_locked_call(n) for n in [node.test, *descendants(node.test)]):
            return
        sleeps = [
            n for n in descendants(node.body, (cst.FunctionDef, cst.Lambda))
            if isinstance(n, cst.Call) and self.ctx.resolve(n.func) in ("asyncio.sleep", "time.sleep", "anyio.sleep")
        ]
        if sleeps:
            self.report(node, what="busy-waiting on `locked()` with sleeps is a lock used as an admission queue")

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._judge_assignment(target.target, node.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._judge_assignment(node.target, node.value)

    def _judge_assignment(self, target: cst.BaseExpression, value: cst.BaseExpression) -> None:
        if not isinstance(value, cst.Call) or self.ctx.resolve(value.func) not in LOCKS:
            return
        name = dotted(target)
        if matches_name(name, self.opts["admission-names"]):
            self.report(target, what=f"`{name}` is a lock named as an admission queue (admission-names)")


def _is_locked_call(node: cst.CSTNode) -> bool:
    return (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value == "locked"
    )


def _text(expr: cst.BaseExpression) -> str:
    return dotted(expr) or "lock"
