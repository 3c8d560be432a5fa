from __future__ import annotations

import libcst as cst

from mlx_invariants.checker.facts import number
from mlx_invariants.checker.globs import matches_name
from mlx_invariants.checker.locks import TIMEOUT_SCOPES, WAIT_FOR, acquired_lock
from mlx_invariants.checker.names import dotted
from mlx_invariants.checker.offload import keyword, positional
from mlx_invariants.checker.rule import Invalid, Rule, Valid
from mlx_invariants.checker.walker import OWN_BODY_STOP, descendants


class LongWaitInRequestPath(Rule):
    """A request that waits for minutes holds its connection, its memory and its
    client's patience, and every request behind it waits longer still: under
    load the queue only grows. A long `wait_for`/`timeout` in a request path is
    an unbounded queue with a deadline nobody reaches; waiting on a lock's
    `acquire()` under a timeout is an admission queue in disguise. Decide
    admission before the work starts: fail fast with a retryable busy error
    (HTTP 503 + Retry-After), or wait briefly."""

    id = "INV101"
    catches = "a wait_for/timeout of at least max-seconds, or any wait_for on a lock's acquire()"
    message = "{what}: fail fast with a retryable busy error (503 + Retry-After) instead of queueing the request"
    known_problems = (
        "Sees constant timeouts only (literals, arithmetic on them, module-level constants); a timeout read "
        "from config or a parameter is not judged. Waits on calls named like network I/O (io-names) are "
        "exempt; any other long wait in an async def is flagged, even one that is not in a request path: "
        "raise max-seconds, or scope the rule with `paths` or per-path-ignores."
    )
    options = {
        "max-seconds": 5.0,
        # Waits on the network, not on a slot: reading a request body under a timeout is fine.
        "io-names": ["*read*", "*recv*", "*receive*", "*connect*", "*body*", "*send*", "*write*", "*fetch*",
                     "*download*", "*upload*", "*communicate*"],
    }
    triggers = (("wait_for", "timeout", "fail_after", "move_on_after"),)

    INVALID = [
        Invalid('''
            import asyncio

            async def handle(engine, request):
                return await asyncio.wait_for(engine.generate(request), timeout=120)  # expect: INV101
        '''),
        Invalid('''
            import asyncio as aio

            async def admit(self):
                await aio.wait_for(self._generation_lock.acquire(), timeout=1.0)  # expect: INV101
        '''),
        Invalid('''
            async def handle(engine, request):
                from asyncio import timeout
                async with timeout(60):  # expect: INV101
                    return await engine.generate(request)
        '''),
    ]
    VALID = [
        Valid('''
            import asyncio

            async def handle(engine, request):
                return await asyncio.wait_for(engine.generate(request), timeout=2)
        '''),
        Valid('''
            import asyncio as aio

            async def admit(self):
                if self._generation_lock.locked():
                    raise Busy(retry_after=1)
                await self._generation_lock.acquire()
        '''),
        Valid('''
            async def handle(engine, request):
                from asyncio import timeout
                async with timeout(2):
                    return await engine.generate(request)
        '''),
        Valid('''
            import asyncio

            async def handle(engine, request, deadline):
                return await asyncio.wait_for(engine.generate(request), timeout=deadline)
        '''),
        Valid('''
            import asyncio

            async def body(request):
                return await asyncio.wait_for(request.read_body(), timeout=30)
        '''),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if not self.ctx.in_async or self.ctx.resolve(node.func) not in WAIT_FOR:
            return
        awaited = positional(node, 0) or keyword(node, "fut")
        lock = acquired_lock(awaited) if awaited is not None else None
        if lock is not None:
            self.report(node, what=f"`wait_for({dotted(lock) or 'lock'}.acquire())` is a wait-mode admission queue")
            return
        if not self._is_io(awaited):
            self._judge(node, "wait_for", keyword(node, "timeout") or positional(node, 1))

    def visit_With(self, node: cst.With) -> None:
        if node.asynchronous is None or not self.ctx.in_async:
            return
        for item in node.items:
            call = item.item
            if isinstance(call, cst.Call) and self.ctx.resolve(call.func) in TIMEOUT_SCOPES:
                awaits = [n for n in descendants(node.body, OWN_BODY_STOP) if isinstance(n, cst.Await)]
                if awaits and all(self._is_io(a.expression) for a in awaits):
                    continue
                name = self.ctx.resolve(call.func).rsplit(".", 1)[-1]
                self._judge(call, name, positional(call, 0) or keyword(call, "delay"))

    def _is_io(self, awaited: cst.BaseExpression | None) -> bool:
        return isinstance(awaited, cst.Call) and matches_name(dotted(awaited.func), self.opts["io-names"])

    def _judge(self, node: cst.Call, name: str, value: cst.BaseExpression | None) -> None:
        limit = float(self.opts["max-seconds"])
        seconds = None if value is None else number(value, self.ctx.facts.constants)
        if seconds is not None and seconds >= limit:
            self.report(node, what=f"`{name}` waits up to {seconds:g} s (limit {limit:g} s, max-seconds)")
