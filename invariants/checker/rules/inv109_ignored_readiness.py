from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from mlx_invariants.checker.facts import number
from mlx_invariants.checker.globs import matches_name
from mlx_invariants.checker.names import dotted, terminal
from mlx_invariants.checker.offload import handoff, keyword, positional
from mlx_invariants.checker.rule import Invalid, Rule, Valid
from mlx_invariants.checker.walker import OWN_BODY_STOP, descendants

_INSPECTIONS = frozenset({"done", "result", "exception", "cancelled", "is_set"})
# Waits that raise when their time runs out instead of answering False.
RAISING_WAITS = frozenset({
    "asyncio.wait_for", "asyncio.tasks.wait_for", "asyncio.timeout", "asyncio.timeouts.timeout",
    "async_timeout.timeout", "anyio.fail_after", "trio.fail_after",
})
_TIMEOUTS = frozenset({
    "TimeoutError", "builtins.TimeoutError", "asyncio.TimeoutError", "asyncio.exceptions.TimeoutError",
    "concurrent.futures.TimeoutError", "concurrent.futures._base.TimeoutError", "Exception", "BaseException",
    "builtins.Exception", "builtins.BaseException", "OSError",
})
EVENTS = frozenset({
    "threading.Event", "multiprocessing.Event", "threading.Condition", "multiprocessing.synchronize.Event",
})


@dataclass
class _Candidate:
    """A dropped wait, with where it was: its function frame, its place in the walk, its innermost `for`."""

    node: cst.Call
    func: cst.BaseExpression
    has_timeout: bool
    statement: cst.CSTNode | None
    frame: int
    order: int
    loop: int | None


class IgnoredReadiness(Rule):
    """`Event.wait(timeout)` and `wait_ready(...)` return False when the time
    runs out, and `asyncio.wait(..., timeout=...)` returns what is still pending. Dropping that bool turns "the owner thread never started" or "the
    worker never reached the point" into silence: startup reports healthy with
    no thread behind it, and a test goes on to check a scenario that never
    happened, and passes. Check the result and fail loudly."""

    id = "INV109"
    # Opt-in: it detects no corpus case, and its one finding on ten MLX servers not studied here was false (the
    # wait is a poll delay; the next line re-checks the queue under its lock).
    default_enabled = False
    catches = "the result of Event.wait(timeout), wait_ready() or asyncio.wait(..., timeout=) dropped"
    message = "the result of `{call}` is dropped, so a timeout passes silently: check it (`if not ...: raise`)"
    known_problems = (
        "Knows an event by its constructor in this file or by its name (event-names), and readiness "
        "functions by name (readiness-waits), unless every function of that name in the file returns "
        "nothing, or raises on timeout (it waits through `asyncio.wait_for`, an `asyncio.timeout` scope, "
        "`future.result(timeout)` or `if not event.wait(t): raise`, catches no timeout and returns no "
        "yes/no); a readiness function defined in another file is judged by its name alone, so one that "
        "raises on timeout is still flagged there. A dropped `asyncio.wait(..., timeout=)` counts as checked "
        "when the function later calls done()/result()/exception() on one of the awaitables it names. A wait "
        "inside a `while` loop, or with a constant timeout under poll-seconds, is a polling tick and is not "
        "flagged; an `event.wait(timeout)` followed in the same function by `event.is_set()` is an "
        "interruptible sleep whose answer is re-read, and is not flagged either, nor is one in a `for` "
        "loop that checks `event.is_set()` anywhere in its body (an `is_set()` that only comes before the "
        "wait, outside any loop around it, does not count). `Thread.join(timeout)` returns nothing and is "
        "not judged."
    )
    options = {"poll-seconds": 0.5}
    triggers = (("wait",),)

    INVALID = [
        Invalid('''
            import asyncio
            import threading

            async def test_cancel_keeps_slot(engine):
                first_started = threading.Event()
                task = asyncio.create_task(engine.generate("first"))
                await asyncio.to_thread(first_started.wait, 1.0)  # expect: INV109
                task.cancel()
        '''),
        Invalid('''
            import asyncio

            async def serve(servicer, health):
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(None, servicer.wait_ready)  # expect: INV109
                health.set_serving()
        '''),
        Invalid('''
            def start(owner):
                owner.start()
                owner.ready.wait(timeout=30)  # expect: INV109
        '''),
        Invalid('''
            import asyncio

            async def start(owner, timeout_s):
                await asyncio.wait({owner.ready}, timeout=timeout_s)  # expect: INV109
                return owner.loaded
        '''),
        Invalid('''
            import threading

            class Heartbeat(threading.Thread):
                def run(self):
                    if self.stopped.is_set():
                        return
                    self.stopped.wait(30)  # expect: INV109
                    self.beat()
        '''),
        Invalid('''
            import threading

            class Generator:
                def __init__(self):
                    self._ready = threading.Event()

                def wait_until_ready(self, timeout=None):
                    return self._ready.wait(timeout)

                def generate(self, prompt):
                    self.wait_until_ready(30)  # expect: INV109
                    return self._submit(prompt)
        '''),
    ]
    VALID = [
        Valid('''
            import asyncio
            import threading

            async def test_cancel_keeps_slot(engine):
                first_started = threading.Event()
                task = asyncio.create_task(engine.generate("first"))
                assert await asyncio.to_thread(first_started.wait, 1.0), "first worker never started"
                task.cancel()
        '''),
        Valid('''
            import asyncio

            async def serve(servicer, health):
                loop = asyncio.get_running_loop()
                if not await loop.run_in_executor(None, servicer.wait_ready):
                    raise RuntimeError("the generation thread failed to start; see its log")
                health.set_serving()
        '''),
        Valid('''
            def start(owner):
                owner.start()
                if not owner.ready.wait(timeout=30):
                    raise RuntimeError("owner thread not ready after 30 s")
        '''),
        Valid('''
            import asyncio

            async def start(owner, timeout_s):
                await asyncio.wait({owner.ready}, timeout=timeout_s)
                if not owner.ready.done():
                    raise TimeoutError(f"the owner thread was not ready after {timeout_s} s")
                return owner.loaded
        '''),
        Valid('''
            import threading

            class Heartbeat(threading.Thread):
                def run(self):
                    self.stopped.wait(30)
                    if not self.stopped.is_set():
                        self.beat()
        '''),
        Valid('''
            import threading

            def retry(connect, stop_event: threading.Event):
                for attempt in range(5):
                    if stop_event.is_set() or connect():
                        return
                    stop_event.wait(2.0 * attempt)
        '''),
        Valid('''
            import asyncio

            async def wait_shutdown(stop: asyncio.Event):
                await stop.wait()
        '''),
        Valid('''
            class Server:
                async def wait_ready(self, client):
                    if not await client.ping():
                        raise RuntimeError("not ready")

            async def main(server, client):
                await server.wait_ready(client)
        '''),
        Valid('''
            import threading

            class Generator:
                def __init__(self):
                    self._ready = threading.Event()

                def wait_until_ready(self, timeout=None):
                    if not self._ready.wait(timeout):
                        raise TimeoutError("the generation thread has not loaded the model yet")
                    return self.model, self.processor

                def generate(self, prompt):
                    self.wait_until_ready(30)
                    return self._submit(prompt)
        '''),
        Valid('''
            import asyncio

            class Worker:
                async def wait_ready(self, timeout=30.0):
                    await asyncio.wait_for(self._loaded.wait(), timeout)  # TimeoutError goes to the caller
                    return self._model

                def wait_started(self, timeout=30.0):
                    return self._started.result(timeout=timeout)  # so does concurrent.futures' TimeoutError

            async def serve(worker):
                await worker.wait_ready()
                await asyncio.to_thread(worker.wait_started)
        '''),
    ]

    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        self.candidates: list[_Candidate] = []
        self.loops: dict[int, int] = {}
        # asyncio.wait calls whose result is dropped, and what each function inspects afterwards.
        self.waits: list[tuple[cst.Call, set[str], int, cst.CSTNode | None]] = []
        self.inspected: dict[int, set[str]] = {}
        # Per function: each `event.is_set()` as (event, order in the walk, the `for` loops around it).
        self.rechecked: dict[int, list[tuple[str, int, tuple[int, ...]]]] = {}
        self.order = 0
        self.for_loops: dict[int, list[int]] = {}

    def visit_Call(self, node: cst.Call) -> None:
        self.order += 1
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value in _INSPECTIONS:
            receiver = dotted(func.value)
            if receiver:
                frame = id(self.ctx.scope.top.node)
                self.inspected.setdefault(frame, set()).add(receiver)
                if func.attr.value == "is_set":
                    loops = tuple(self.for_loops.get(frame, ()))
                    self.rechecked.setdefault(frame, []).append((receiver, self.order, loops))

    def visit_For(self, node: cst.For) -> None:
        self.for_loops.setdefault(id(self.ctx.scope.top.node), []).append(id(node))

    def leave_For(self, node: cst.For) -> None:
        self.for_loops[id(self.ctx.scope.top.node)].pop()

    def visit_While(self, node: cst.While) -> None:
        frame = id(self.ctx.scope.top.node)
        self.loops[frame] = self.loops.get(frame, 0) + 1

    def leave_While(self, node: cst.While) -> None:
        self.loops[id(self.ctx.scope.top.node)] -= 1

    def _polling(self, call: cst.Call) -> bool:
        """In a while loop, or with a constant timeout too short to be a readiness deadline."""
        if self.loops.get(id(self.ctx.scope.top.node)):
            return True
        plain = [a.value for a in call.args if a.keyword is None and not a.star]
        timeout = keyword(call, "timeout") or (plain[-1] if plain else None)
        seconds = number(timeout, self.ctx.facts.constants) if timeout is not None else None
        return seconds is not None and seconds < float(self.opts["poll-seconds"])

    def visit_Expr(self, node: cst.Expr) -> None:
        value = node.value
        if isinstance(value, cst.Await):
            value = value.expression
        if not isinstance(value, cst.Call) or self._polling(value):
            return
        work = handoff(value, self.ctx)
        if work is not None:
            if work.target is None:
                return
            # The handoff's extra arguments are the callable's arguments.
            skip = 2 if work.how == "run_in_executor" else 1
            has_timeout = len([a for a in value.args if a.keyword is None]) > skip or keyword(value, "timeout") is not None
            self._candidate(value, work.target, has_timeout)
            return
        has_timeout = positional(value, 0) is not None or keyword(value, "timeout") is not None
        if self.ctx.resolve(value.func) in ("asyncio.wait", "asyncio.tasks.wait"):
            timeout = keyword(value, "timeout")
            if timeout is not None and not (isinstance(timeout, cst.Name) and timeout.value == "None"):
                awaited = positional(value, 0)
                elements = awaited.elements if isinstance(awaited, cst.Set | cst.List | cst.Tuple) else ()
                names = {dotted(e.value) for e in elements} - {None}
                self.waits.append((value, names, id(self.ctx.scope.top.node), self.ctx.statement))
            return
        self._candidate(value, value.func, has_timeout)

    def _candidate(self, node: cst.Call, func: cst.BaseExpression, has_timeout: bool) -> None:
        if terminal(func) == "wait" or matches_name(dotted(func), self.opts["readiness-waits"]):
            self.ctx.pin(func)
            frame = id(self.ctx.scope.top.node)
            loops = self.for_loops.get(frame)
            self.candidates.append(_Candidate(node, func, has_timeout, self.ctx.statement, frame, self.order,
                                              loops[-1] if loops else None))

    def end(self) -> None:
        for call, names, frame, statement in self.waits:
            if not names & self.inspected.get(frame, set()):
                self.ctx.report_at(self.id, call, statement, self.message.format(call="asyncio.wait"))
        for wait in self.candidates:
            func = wait.func
            text = dotted(func) or "wait"
            if matches_name(text, self.opts["readiness-waits"]):
                if self._no_readiness_answer(terminal(func)):
                    continue
            elif isinstance(func, cst.Attribute) and wait.has_timeout and self._is_event(func.value):
                if self._rechecked(dotted(func.value), wait):
                    continue
            else:
                continue
            self.ctx.report_at(self.id, wait.node, wait.statement, self.message.format(call=text))

    def _rechecked(self, event: str | None, wait: _Candidate) -> bool:
        """`event.is_set()` after the wait, or anywhere in the `for` loop around it (the next round re-reads
        it): the wait is an interruptible sleep whose answer the code reads again."""
        return any(
            name == event and (seen > wait.order or (wait.loop is not None and wait.loop in loops))
            for name, seen, loops in self.rechecked.get(wait.frame, ())
        )

    def _no_readiness_answer(self, name: str | None) -> bool:
        """Every function of this file with that name returns no value, or raises when its wait times
        out and never returns a yes/no: dropping what it returns cannot hide a timeout."""
        defined = [
            f.node for f in self.ctx.facts.functions.values()
            if isinstance(f.node, cst.FunctionDef) and f.node.name.value == name
        ]
        return bool(defined) and all(_returns_nothing(node) or self._raises_on_timeout(node) for node in defined)

    def _raises_on_timeout(self, node: cst.FunctionDef) -> bool:
        """It waits in a way that raises on timeout (`asyncio.wait_for`, an `asyncio.timeout` scope,
        `future.result(timeout)`, `if not ready.wait(t): raise`), catches no timeout, and returns
        nothing that reads as a yes/no (`False`, `ready.wait(t)`, `not ...`, a comparison)."""
        inner = descendants(node.body, OWN_BODY_STOP)
        if any(isinstance(n, cst.ExceptHandler) and _catches_timeout(n, self.ctx) for n in inner):
            return False
        if any(isinstance(n, cst.Return) and n.value is not None and _yes_or_no(n.value) for n in inner):
            return False
        return any(self._raising_wait(n) for n in inner)

    def _raising_wait(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.Call):
            qual = self.ctx.resolve(node.func)
            if qual in RAISING_WAITS:
                return True
            return terminal(node.func) == "result" and (positional(node, 0) is not None or keyword(node, "timeout") is not None)
        if isinstance(node, cst.If) and isinstance(node.test, cst.UnaryOperation) and isinstance(node.test.operator, cst.Not):
            asked = node.test.expression
            answered = isinstance(asked, cst.Call) and terminal(asked.func) in ("wait", "is_set", "wait_for")
            return answered and any(isinstance(n, cst.Raise) for n in descendants(node.body, OWN_BODY_STOP))
        return False

    def _is_event(self, expr: cst.BaseExpression) -> bool:
        built = self.ctx.facts.constructed_by(self.ctx.key(expr))
        if built:
            return bool(built & EVENTS)
        return matches_name(dotted(expr), self.opts["event-names"])


def _returns_nothing(node: cst.FunctionDef) -> bool:
    return not any(
        isinstance(n, cst.Return) and n.value is not None and not (isinstance(n.value, cst.Name) and n.value.value == "None")
        for n in descendants(node.body, OWN_BODY_STOP)
    )


def _catches_timeout(handler: cst.ExceptHandler, ctx) -> bool:
    """A bare except, or one naming a timeout (or an exception class above it)."""
    if handler.type is None:
        return True
    kinds = [e.value for e in handler.type.elements] if isinstance(handler.type, cst.Tuple) else [handler.type]
    return any((ctx.resolve(k) or dotted(k) or "") in _TIMEOUTS or (dotted(k) or "").endswith("Timeout")
               for k in kinds)


def _yes_or_no(value: cst.BaseExpression) -> bool:
    """A returned value that reads as a readiness answer: a bool literal, `not ...`, a comparison, an
    `and`/`or`, or what `wait()`/`is_set()` said."""
    if isinstance(value, cst.Await):
        value = value.expression
    if isinstance(value, cst.Name):
        return value.value in ("True", "False")
    if isinstance(value, cst.UnaryOperation | cst.Comparison | cst.BooleanOperation):
        return True
    return isinstance(value, cst.Call) and terminal(value.func) in ("wait", "is_set", "done", "is_alive")
