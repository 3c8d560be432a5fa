from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from mlx_invariants.checker.facts import number
from mlx_invariants.checker.globs import matches_name
from mlx_invariants.checker.locks import TIMEOUT_SCOPES, WAIT_FOR, acquired_lock
from mlx_invariants.checker.cancellers import caught
from mlx_invariants.checker.names import dotted, terminal
from mlx_invariants.checker.offload import keyword, positional
from mlx_invariants.checker.rule import Invalid, Rule, Valid
from mlx_invariants.checker.scopes import FUNCTION_KINDS, Kind
from mlx_invariants.checker.walker import OWN_BODY_STOP, descendants


_ROUTE_DECORATORS = frozenset({"get", "post", "put", "patch", "delete", "route", "api_route", "websocket"})
# An `except` naming one of these runs while the task is being cancelled: what it waits for is cleanup.
_CANCELLATION = frozenset({"asyncio.CancelledError", "asyncio.exceptions.CancelledError", "BaseException",
                           "builtins.BaseException"})
_TIMEOUTS = frozenset({"TimeoutError", "builtins.TimeoutError", "asyncio.TimeoutError",
                       "asyncio.exceptions.TimeoutError"})
_CLAUSES = (cst.ExceptHandler, cst.ExceptStarHandler, cst.Finally, cst.Else)


@dataclass
class _Wait:
    node: cst.Call
    statement: cst.CSTNode | None
    what: str
    functions: tuple[int, ...]  # the defs around the wait, outermost first
    request_work: bool  # what it waits for is named like request work (`engine.generate(...)`)


class LongWaitInRequestPath(Rule):
    """A request that waits for minutes holds its connection, its memory and its
    client's patience, and every request behind it waits longer still: under
    load the queue only grows. A long `wait_for`/`timeout` in a request path is
    an unbounded queue with a deadline nobody reaches; waiting on a lock's
    `acquire()` under a timeout is an admission queue in disguise. Decide
    admission before the work starts: fail fast with a retryable busy error
    (HTTP 503 + Retry-After), or wait briefly. vllm-mlx's completion routes
    waited `wait_for(engine.generate(...), 300)` (server.py@1740909, the corpus's
    V1b); mlx-gui queues each request and awaits its result for 300 s
    (src/mlx_gui/queued_inference.py@92614c3:75), and Rapid-MLX's DFlash server
    waits on `_dflash_lock.acquire()` until the request's deadline
    (vllm_mlx/speculative/dflash/server.py@7222ca7:466).

    A request path is what runs for a serving request: a function named like a
    request handler (`request-names`: `generate`, `chat`, `*complet*`,
    `handle_*`, ...; a gRPC `Generate`), one routed by a decorator whose path is
    named so (`@app.post("/v1/chat/completions")`), any function of the same
    file these call, and any def nested in them; or a wait whose awaited call
    is itself named like request work (`wait_for(engine.generate(...), 120)`).
    A lock's `acquire()` under `wait_for` is judged wherever it is. Tests are
    never request paths: a deadline in a test bounds the test.

    Two waits in a request path are not admission and are not judged: cleanup
    (in a `finally`, or an `except` that catches cancellation), which bounds how
    long a cancelled worker may take to drain; and a tick, a wait in a loop whose
    `except TimeoutError` neither raises nor returns (a keepalive between
    server-sent events), whose timeout fails nothing."""

    id = "INV101"
    # Opt-in (a policy): on the HEADs of ten MLX servers not studied here, reviewers graded all 5 sampled findings
    # arguable: queueing was the servers' stated design, bounded by an admission limit elsewhere (a 503 at a cap).
    default_enabled = False
    catches = ("a wait_for/timeout longer than max-seconds in a request path, "
               "or any wait_for on a lock's acquire() outside tests")
    message = "{what}: fail fast with a retryable busy error (503 + Retry-After) instead of queueing the request"
    known_problems = (
        "Sees constant timeouts only (literals, arithmetic on them, module-level constants, and the default "
        "of `x or DEFAULT`, also through one local assignment `timeout = request.timeout or DEFAULT`); a "
        "timeout read from config or a parameter is not judged. A wait exactly max-seconds long is allowed (the limit is "
        "the longest acceptable wait). Request paths are found by name within one file: a handler routed "
        "without a decorator (a raw ASGI `__call__`, `Route(path, endpoint)`) or named otherwise is not a "
        "request path unless `request-names` names it, and a helper reached only from another file is not "
        "followed; a control RPC named like one (a `request_profile` admin call) is judged as one. Tests are "
        "recognised by name: a `test_*` function, a `Test*` class, and anything nested in them. Waits on "
        "calls named like network I/O (io-names) are exempt. Cleanup is known by where the wait is (a "
        "`finally`, an `except` naming CancelledError or BaseException, a bare `except:`), not by what it "
        "waits for, so a queue placed there is not judged; a tick only by the innermost `try` around it."
    )
    options = {
        "max-seconds": 5.0,
        # Waits on the network, not on a slot: reading a request body under a timeout is fine.
        "io-names": ["*read*", "*recv*", "*receive*", "*connect*", "*body*", "*send*", "*write*", "*fetch*",
                     "*download*", "*upload*", "*communicate*"],
        # Functions (and route paths) that serve a request, and calls that are request work.
        "request-names": ["*generate*", "*generation*", "*chat*", "*complet*", "*stream*", "*embed*", "*rerank*",
                          "*infer*", "*predict*", "*request*", "handle", "handle_*", "_handle_*", "*submit*",
                          "*admit*"],
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
        Invalid('''
            import asyncio

            class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
                async def Generate(self, request, context):
                    await self._wait_for_slot()
                    async for chunk in self._engine.run(request):
                        yield chunk

                async def _wait_for_slot(self):
                    await asyncio.wait_for(self._slot_free.wait(), timeout=300)  # expect: INV101
        '''),
        Invalid('''
            import asyncio

            DEFAULT_TIMEOUT = 300.0

            async def create_completion(engine, request):
                timeout = request.timeout or DEFAULT_TIMEOUT
                return await asyncio.wait_for(engine.generate(request.prompt), timeout=timeout)  # expect: INV101
        '''),
        Invalid('''
            import asyncio

            @app.post("/v1/chat/completions")
            async def openai_compatible(payload):
                return await asyncio.wait_for(pool.run(payload), timeout=300)  # expect: INV101
        '''),
        Invalid('''
            import asyncio

            async def generate(engine, request):
                future = engine.submit(request)
                try:
                    return await asyncio.wait_for(shield_task(future), timeout=10)  # expect: INV101
                except asyncio.CancelledError:
                    engine.stop(request)
                    raise
        '''),
        Invalid('''
            import asyncio

            async def stream_progress(job):
                sent = 0
                while not job.done:
                    try:
                        await asyncio.wait_for(job.changed.wait(), timeout=30)  # expect: INV101
                    except asyncio.TimeoutError:
                        raise Busy(retry_after=30)
                    job.changed.clear()
                    for event in job.events[sent:]:
                        yield f"data: {event}\\n\\n"
                    sent = len(job.events)
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

            class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
                async def Generate(self, request, context):
                    if self._slot_free.is_set():
                        raise Busy(retry_after=1)
                    async for chunk in self._engine.run(request):
                        yield chunk

                async def StartProfile(self, request, context):
                    await asyncio.wait_for(self._engine.start_profile(request.output_dir), timeout=600)
        '''),
        Valid('''
            import asyncio

            async def test_generate_finishes(engine, request):
                await asyncio.wait_for(engine.generate(request), timeout=30)
                await asyncio.wait_for(engine.admission.acquire(), timeout=1)
        '''),
        Valid('''
            import asyncio

            async def handle(engine, request):
                return await asyncio.wait_for(engine.generate(request), timeout=5)
        '''),
        Valid('''
            import asyncio

            async def handle(engine, request, deadline):
                return await asyncio.wait_for(engine.generate(request), timeout=deadline)
        '''),
        Valid('''
            import asyncio

            async def create_completion(engine, request):
                if engine.busy():
                    raise Busy(retry_after=1)
                timeout = request.timeout or 5
                return await asyncio.wait_for(engine.generate(request.prompt), timeout=timeout)
        '''),
        Valid('''
            import asyncio

            async def body(request):
                return await asyncio.wait_for(request.read_body(), timeout=30)
        '''),
        Valid('''
            import asyncio

            async def generate(engine, request):
                future = engine.submit(request)
                try:
                    return await shield_task(future)
                except asyncio.CancelledError:
                    engine.stop(request)
                    while not future.done():  # the stopped worker drains before the slot is reused
                        try:
                            await asyncio.wait_for(shield_task(future), timeout=10)
                        except asyncio.CancelledError:
                            continue
                        except asyncio.TimeoutError:
                            logger.warning("worker still running 10 s after stop")
                    raise
        '''),
        Valid('''
            import asyncio

            async def stream_generate(engine, request):
                future = engine.start(request)
                try:
                    async for chunk in engine.chunks(request):
                        yield chunk
                finally:
                    engine.stop(request)
                    await asyncio.wait_for(asyncio.wrap_future(future), timeout=10)
        '''),
        Valid('''
            import asyncio

            async def stream_progress(job):
                sent = 0
                while not job.done:
                    try:
                        await asyncio.wait_for(job.changed.wait(), timeout=30)
                    except asyncio.TimeoutError:
                        yield ": keepalive\\n\\n"
                        continue
                    job.changed.clear()
                    for event in job.events[sent:]:
                        yield f"data: {event}\\n\\n"
                    sent = len(job.events)
        '''),
    ]

    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        self.waits: list[_Wait] = []
        self.routed: set[int] = set()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        for decorator in node.decorators:
            call = decorator.decorator
            if isinstance(call, cst.Call) and terminal(call.func) in _ROUTE_DECORATORS:
                path = positional(call, 0) or keyword(call, "path")
                if isinstance(path, cst.SimpleString) and self._request_named(path.raw_value):
                    self.routed.add(id(node))

    def visit_Call(self, node: cst.Call) -> None:
        if not self.ctx.in_async or self.ctx.resolve(node.func) not in WAIT_FOR or self._in_test():
            return
        awaited = positional(node, 0) or keyword(node, "fut")
        lock = acquired_lock(awaited) if awaited is not None else None
        if lock is not None:
            self.report(node, what=f"`wait_for({dotted(lock) or 'lock'}.acquire())` is a wait-mode admission queue")
            return
        if not self._is_io(awaited):
            self._judge(node, "wait_for", keyword(node, "timeout") or positional(node, 1), [awaited])

    def visit_With(self, node: cst.With) -> None:
        if node.asynchronous is None or not self.ctx.in_async or self._in_test():
            return
        for item in node.items:
            call = item.item
            if isinstance(call, cst.Call) and self.ctx.resolve(call.func) in TIMEOUT_SCOPES:
                awaits = [n.expression for n in descendants(node.body, OWN_BODY_STOP) if isinstance(n, cst.Await)]
                if awaits and all(self._is_io(a) for a in awaits):
                    continue
                name = self.ctx.resolve(call.func).rsplit(".", 1)[-1]
                self._judge(call, name, positional(call, 0) or keyword(call, "delay"), awaits)

    def end(self) -> None:
        on_path = self._request_functions()
        for wait in self.waits:
            if wait.request_work or any(f in on_path for f in wait.functions):
                self.ctx.report_at(self.id, wait.node, wait.statement, self.message.format(what=wait.what))

    def _request_functions(self) -> set[int]:
        """The defs named or routed as request handlers, and every def of this file they call."""
        facts = self.ctx.facts
        stack = [
            f for f in facts.functions.values()
            if id(f.node) in self.routed or (f.key and self._request_named(f.key.rsplit(".", 1)[-1]))
        ]
        reached: set[int] = set()
        while stack:
            current = stack.pop()
            if id(current.node) not in reached:
                reached.add(id(current.node))
                stack.extend(facts.callees(current))
        return reached

    def _in_test(self) -> bool:
        return any(
            (frame.kind is Kind.CLASS and frame.name.startswith("Test"))
            or (frame.kind in FUNCTION_KINDS and frame.name.startswith("test_"))
            for frame in self.ctx.scope.frames
        )

    def _request_named(self, text: str | None) -> bool:
        return matches_name(text, self.opts["request-names"])

    def _is_io(self, awaited: cst.BaseExpression | None) -> bool:
        return isinstance(awaited, cst.Call) and matches_name(dotted(awaited.func), self.opts["io-names"])

    def _seconds(self, value: cst.BaseExpression) -> float | None:
        """A constant timeout, or the default a local name falls back to.

        `timeout = request.timeout or DEFAULT_TIMEOUT` waits DEFAULT_TIMEOUT for every
        request that does not say otherwise: the default is what the code promises.
        """
        if isinstance(value, cst.Name) and value.value not in self.ctx.facts.constants:
            value = self._local_value(value.value) or value
        while isinstance(value, cst.BooleanOperation) and isinstance(value.operator, cst.Or):
            value = value.right
        return number(value, self.ctx.facts.constants)

    def _local_value(self, name: str) -> cst.BaseExpression | None:
        """The value of the one assignment to `name` in the enclosing def, if it has exactly one."""
        frame = self.ctx.scope.function()
        if frame is None:
            return None
        values = [
            n.value for n in descendants(frame.node, OWN_BODY_STOP)
            if isinstance(n, cst.Assign) and any(isinstance(t.target, cst.Name) and t.target.value == name
                                                 for t in n.targets)
        ]
        return values[0] if len(values) == 1 else None

    def _judge(self, node: cst.Call, name: str, value: cst.BaseExpression | None,
               awaited: list[cst.BaseExpression | None]) -> None:
        limit = float(self.opts["max-seconds"])
        seconds = None if value is None else self._seconds(value)
        if seconds is None or seconds <= limit or self._in_cleanup() or self._is_tick():
            return
        functions = tuple(id(f.node) for f in self.ctx.scope.frames if f.kind in FUNCTION_KINDS)
        work = any(isinstance(a, cst.Call) and self._request_named(dotted(a.func)) for a in awaited)
        what = f"`{name}` waits up to {seconds:g} s (limit {limit:g} s, max-seconds)"
        self.waits.append(_Wait(node, self.ctx.statement, what, functions, work))

    def _in_cleanup(self) -> bool:
        """In a `finally` or an `except` that catches cancellation (CancelledError, BaseException, a
        bare `except:`) of this def: waiting for a cancelled worker to drain, not admitting a request."""
        for statement in reversed(self.ctx.statements):
            if isinstance(statement, cst.FunctionDef):
                return False
            if isinstance(statement, cst.Finally):
                return True
            if isinstance(statement, cst.ExceptHandler) and self._catches(statement.type, _CANCELLATION):
                return True
        return False

    def _is_tick(self) -> bool:
        """In the body of a `try`, inside a loop of this def, whose `except TimeoutError` neither raises
        nor returns: the timeout only paces the loop (a keepalive, a progress log), it fails nothing, and
        the wait as a whole is as long as an untimed one."""
        statements = self.ctx.statements
        start = max((i for i, s in enumerate(statements) if isinstance(s, cst.FunctionDef)), default=-1) + 1
        for index in range(len(statements) - 1, start - 1, -1):
            statement = statements[index]
            if not isinstance(statement, cst.Try):
                continue
            if index + 1 < len(statements) and isinstance(statements[index + 1], _CLAUSES):
                continue  # in one of its clauses, not its body
            looped = any(isinstance(s, cst.While | cst.For) for s in statements[start:index])
            return looped and any(
                self._catches(handler.type, _TIMEOUTS) and not any(
                    isinstance(n, cst.Raise | cst.Return) for n in descendants(handler.body, OWN_BODY_STOP))
                for handler in statement.handlers
            )
        return False

    def _catches(self, kind: cst.BaseExpression | None, names: frozenset[str]) -> bool:
        if kind is None:
            return names is _CANCELLATION
        return any(qual in names for qual in caught(kind, self.ctx))
