from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from mlx_invariants.checker.cancellers import DEADLINES, catches_cancellation, catches_timeout, shutdown_only
from mlx_invariants.checker.mlx_api import makes_generator_call
from mlx_invariants.checker.names import dotted, terminal
from mlx_invariants.checker.offload import generator_defs, handoff, positional, unwrap_callable
from mlx_invariants.checker.rule import Invalid, Rule, Valid
from mlx_invariants.checker.walker import descendants

# Hand-offs whose await a cancellation interrupts while the thread runs on: asyncio's. anyio's and trio's
# `run_sync` wait for the thread unless told otherwise (`cancellable=True`, `abandon_on_cancel=True`).
_ABANDONING = frozenset({"asyncio.to_thread", "threads.to_thread", "run_in_executor"})
# Wrappers an awaited step may sit in: a deadline, or a shield (which does not wait for the thread either).
_WRAPPERS = frozenset({"wait_for", "shield"})
_OWN_SCOPE = (cst.FunctionDef, cst.Lambda, cst.ClassDef)
# The examples' generator: an engine's decode, whose `finally` frees the request's batch entry.
_DECODE = '''
            def decode(engine, prompt):
                handle = engine.insert(prompt)
                try:
                    while not handle.finished:
                        yield engine.step(handle)
                finally:
                    engine.remove(handle)
'''

# Calls that return an object with a `close` of its own (a file, a socket), not a generator.
_NOT_GENERATORS = frozenset({"open", "io.open", "os.fdopen", "socket.socket", "urllib.request.urlopen", "urlopen",
                             "popen", "os.popen", "makefile"})


@dataclass(frozen=True)
class _Step:
    """`await <hand-off of next(generator)>`, and whether a deadline can cut it short."""

    generator: cst.BaseExpression
    how: str  # `asyncio.to_thread`, `run_in_executor`
    deadline: bool


class GeneratorClosedWhileStepped(Rule):
    """A sync generator stepped on a worker thread (`await asyncio.to_thread(next, gen)`,
    `loop.run_in_executor(pool, next, gen)`, a lambda or nested def that calls `next(gen)`) and
    closed by the coroutine in the `finally:` (or the cancellation handler) around that await
    meets itself: cancelling an asyncio hand-off stops the wait, not the thread, so the coroutine
    reaches `gen.close()` while the worker is still inside `next(gen)`. Closing a generator that
    is executing raises `ValueError: generator already executing` and closes nothing: the
    generator's own `finally:` (where a server cancels its batch entry, frees a slot or drops a
    KV cache) never runs, its work goes on for a client that is gone, and the ValueError replaces
    the cancellation unless something swallows it. A client disconnect cancels a streaming
    response's generator exactly there, at the await where a token is being decoded. mlx-vlm's
    OpenAI server stepped the request's token iterator through `asyncio.to_thread` and closed it
    in the stream's `finally:`; its `finally` sent the cancel to the batch, which never happened
    (mlx_vlm/server/openai.py@cbd93a8:486, 682; fixed in d932742 by an iterator whose `close()` may
    be called while another thread is in `__next__`). Unsloth Studio's tool stream did the same with
    `asyncio.to_thread(next, gen, sentinel)` and `gen.close()` in its `finally:`
    (studio/backend/routes/inference.py@9de8488:8743, 8840), fixed in 73af334 by draining the pending
    step through `asyncio.shield` before the close. A deadline does the same:
    `wait_for(to_thread(next, gen), t)` times out with the step still running, and a handler that
    closes `gen` on `TimeoutError` races it.

    Judged: in an `async def`, an `await` of an asyncio hand-off (`asyncio.to_thread`,
    `run_in_executor`, also inside `wait_for` or `shield`) that steps an iterator the function
    binds (in it or on `self`) only to what calls return (a generator def of the file, an mlx-lm
    stream, any function: stepped with `next` and closed, that is a generator), to generator
    expressions, or to `iter()` of one of these, inside a `try`
    whose `finally:` or cancellation handler (`except CancelledError`/`BaseException`/bare; a
    `TimeoutError` handler when the step has a deadline) calls `gen.close()` or `gen.throw(...)`,
    or hands `gen.close` to the default pool. Reported at the close.

    Not judged: a coroutine only the server's shutdown cancels (a plain route handler, start-up
    code: checker/cancellers.py, and the package model's chains of awaiters), unless the step has a
    deadline; anyio's and trio's `run_sync` (they wait for the thread unless told not to); a step
    kept as a future or task (the cleanup may wait for it); a close handed to a named executor (one
    worker runs it after the step); and an iterator the function cannot tell is a generator: a
    parameter, an object a class builds (capitalised, or a class of the file: its own `close` may be
    safe across threads, as mlx-vlm's fix made it), a file or a socket."""

    id = "INV132"
    catches = "a generator stepped on a worker thread and closed in the `finally`/cancel handler around that await"
    message = (
        "`{close}` can run while a worker thread is still inside `next({generator})`, which this `try` awaits through "
        "`{how}`: "
        "{cut} stops the wait, not the thread, and closing a generator that is executing raises ValueError "
        "('generator already executing') and closes nothing, so its `finally` never runs and its work goes on; keep "
        "the step's future and wait for it before closing (on cancel: drain it through `asyncio.shield`, then close), or close it on the "
        "thread that steps it"
    )
    known_problems = (
        "What a plain function call returned (`gen = backend.generate_chat_response(...)`) is taken for a "
        "generator, as stepping it with `next` and closing it suggests: a function that returns an object whose "
        "class makes `close()` safe while another thread is in `__next__` is reported. An iterator handed in as "
        "a parameter or unpacked from a tuple is not followed (mlx-vlm's own case, where the iterator came back "
        "from `asyncio.to_thread(generator.generate, ...)` beside a context, is not found). A close guarded by a "
        "flag the worker sets once its step returned is reported all the same."
    )
    triggers = (("next",), ("close", "throw"), ("to_thread", "run_in_executor"))

    INVALID = [
        # A streaming response's generator: a disconnect cancels it at the await, mid-step.
        Invalid('''
            import asyncio

''' + _DECODE + '''
            async def tokens(engine, prompt):
                gen = decode(engine, prompt)
                try:
                    while True:
                        token = await asyncio.to_thread(next, gen, None)
                        if token is None:
                            break
                        yield token
                finally:
                    gen.close()  # expect: INV132
        '''),
        # A nested def that steps a generator method's generator, and a close handed to the pool.
        Invalid('''
            import asyncio

            class Engine:
                def _decode(self, prompt):
                    handle = self.batch.insert(prompt)
                    try:
                        while not handle.done:
                            yield self.batch.step(handle)
                    finally:
                        self.batch.remove(handle)

                async def stream(self, prompt):
                    self._gen = self._decode(prompt)

                    def step():
                        return next(self._gen, None)

                    try:
                        while (token := await asyncio.to_thread(step)) is not None:
                            yield token
                    except asyncio.CancelledError:
                        await asyncio.to_thread(self._gen.close)  # expect: INV132
                        raise
        '''),
        # A deadline on the step, and a close on timeout.
        Invalid('''
            import asyncio

            def pieces(text):
                for part in text.split("."):
                    yield synthesize(part)

            async def speak(text):
                it = iter(pieces(text))
                out = []
                while True:
                    try:
                        piece = await asyncio.wait_for(asyncio.to_thread(next, it, None), timeout=30)
                    except asyncio.TimeoutError:
                        it.close()  # expect: INV132
                        raise
                    if piece is None:
                        return out
                    out.append(piece)
        '''),
    ]
    VALID = [
        # The step's future is kept and waited for before the close.
        Valid('''
            import asyncio

''' + _DECODE + '''
            async def tokens(engine, prompt):
                loop = asyncio.get_running_loop()
                gen = decode(engine, prompt)
                try:
                    while True:
                        step = loop.run_in_executor(None, next, gen, None)
                        try:
                            token = await asyncio.shield(step)
                        except asyncio.CancelledError:
                            while not step.done():
                                try:
                                    await asyncio.shield(step)
                                except asyncio.CancelledError:
                                    continue
                                except Exception:
                                    break
                            raise
                        if token is None:
                            break
                        yield token
                finally:
                    gen.close()
        '''),
        # The close goes to the one worker that steps the generator: it runs after the step.
        Valid('''
            import asyncio
            from concurrent.futures import ThreadPoolExecutor

            WORKER = ThreadPoolExecutor(max_workers=1)

''' + _DECODE + '''
            async def tokens(engine, prompt):
                loop = asyncio.get_running_loop()
                gen = decode(engine, prompt)
                try:
                    while (token := await loop.run_in_executor(WORKER, next, gen, None)) is not None:
                        yield token
                finally:
                    await loop.run_in_executor(WORKER, gen.close)
        '''),
        # anyio's run_sync waits for the thread when cancelled: the close finds the generator suspended.
        Valid('''
            import anyio

''' + _DECODE + '''
            async def tokens(engine, prompt):
                gen = decode(engine, prompt)
                try:
                    while (token := await anyio.to_thread.run_sync(next, gen, None)) is not None:
                        yield token
                finally:
                    gen.close()
        '''),
        # An iterator handed in: whether its close is safe across threads is its class's business.
        Valid('''
            import asyncio

            async def relay(iterator, send):
                try:
                    while (item := await asyncio.to_thread(next, iterator, None)) is not None:
                        await send(item)
                finally:
                    iterator.close()
        '''),
        # A plain route handler is not cancelled on disconnect; only the shutdown cancels it.
        Valid('''
            import asyncio

            from fastapi import FastAPI

            app = FastAPI()

''' + _DECODE + '''
            @app.post("/v1/completions")
            async def complete(body: dict):
                gen = decode(ENGINE, body["prompt"])
                parts = []
                try:
                    while (token := await asyncio.to_thread(next, gen, None)) is not None:
                        parts.append(token)
                finally:
                    gen.close()
                return {"tokens": parts}
        '''),
        # A helper only plain route handlers await is cancelled only by the shutdown, like them (the package
        # model follows the awaits: model/cancel.py).
        Valid('''
            import asyncio

            from fastapi import FastAPI

            from .engine import ENGINE, decode

            app = FastAPI()

            async def collect(prompt):
                gen = decode(ENGINE, prompt)
                parts = []
                try:
                    while (token := await asyncio.to_thread(next, gen, None)) is not None:
                        parts.append(token)
                finally:
                    gen.close()
                return parts

            @app.post("/v1/completions")
            async def complete(body: dict):
                return {"tokens": await collect(body["prompt"])}
        ''', files={"app/engine.py": '''
            ENGINE = object()

            def decode(engine, prompt):
                yield from engine.run(prompt)
        '''}),
        # Closed after the loop, where no step can be in flight.
        Valid('''
            import asyncio

''' + _DECODE + '''
            async def tokens(engine, prompt, limit):
                gen = decode(engine, prompt)
                for _ in range(limit):
                    token = await asyncio.to_thread(next, gen, None)
                    if token is None:
                        break
                    yield token
                gen.close()
        '''),
    ]

    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        # (the async def, a step in a `try`, the close that can meet it, the statement around the close)
        self.found: list[tuple[cst.FunctionDef, _Step, cst.Call, cst.CSTNode]] = []
        self.classes: set[str] = set()  # the file's class names: their objects may close safely across threads

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.classes.add(node.name.value)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if node.asynchronous is None:
            return
        cancellable = not shutdown_only(node)
        for attempt in descendants(node.body, _OWN_SCOPE):
            if type(attempt) is not cst.Try:  # exact class: isinstance against libcst's ABC is slow
                continue
            steps = [s for a in descendants(attempt.body, _OWN_SCOPE) if type(a) is cst.Await
                     if (s := self._step(a, node)) is not None]
            if not steps:
                continue
            places: list[tuple[cst.CSTNode, bool]] = []  # (block, reached only by a deadline)
            if attempt.finalbody is not None:
                places.append((attempt.finalbody, not cancellable))
            for handler in attempt.handlers:
                if catches_cancellation(handler, self.ctx):
                    places.append((handler.body, not cancellable))
                elif catches_timeout(handler, self.ctx):
                    places.append((handler.body, True))
            for block, deadline_only in places:
                for statement, close, target in _closes(block):
                    if target is None:
                        continue
                    step = next((s for s in steps if dotted(s.generator) == target
                                 and (s.deadline or not deadline_only)), None)
                    if step is not None:
                        self.found.append((node, step, close, statement))

    def end(self) -> None:
        seen: set[int] = set()
        for function, step, close, statement in self.found:
            if id(close) in seen or not self._known_generator(step.generator, function):
                continue
            seen.add(id(close))
            cut = "a deadline at that await" if step.deadline else "a cancellation at that await"
            self.ctx.report_at(self.id, close, statement, self.message.format(
                close=f"{dotted(step.generator)}.close()", generator=dotted(step.generator), how=step.how, cut=cut))

    def _step(self, awaited: cst.Await, function: cst.FunctionDef) -> _Step | None:
        """The step of a generator this await hands to a thread that a cancellation abandons."""
        call, deadline = awaited.expression, False
        while isinstance(call, cst.Call) and terminal(call.func) in _WRAPPERS and call.args:
            deadline = deadline or terminal(call.func) == "wait_for"
            call = call.args[0].value
        if not isinstance(call, cst.Call):
            return None
        work = handoff(call, self.ctx)
        if work is None or work.how not in _ABANDONING:
            return None
        generator = _stepped(work.call, work.target, function, self.ctx)
        if generator is None:
            return None
        return _Step(generator, work.how, deadline or self._under_deadline(awaited, function))

    def _under_deadline(self, awaited: cst.Await, function: cst.FunctionDef) -> bool:
        """`awaited` stands inside `async with asyncio.timeout(...)` (or anyio's) in `function`."""
        for block in descendants(function.body, _OWN_SCOPE):
            if isinstance(block, cst.With) and block.asynchronous is not None and any(
                    isinstance(i.item, cst.Call) and terminal(i.item.func) in DEADLINES for i in block.items):
                if any(n is awaited for n in descendants(block.body, _OWN_SCOPE)):
                    return True
        return False

    def _known_generator(self, expr: cst.BaseExpression, function: cst.FunctionDef) -> bool:
        """`expr` is bound, in `function` or on `self`, only to what a call returned (and `None`, the placeholder
        a `finally:` tests), none of them an object a class builds: stepped with `next` and closed, that is a
        generator (a file's or a class's own `close` may be made safe across threads; a generator's is not)."""
        key = self.ctx.key(expr)
        if key is None:
            return False
        assigned = (self.ctx.facts.assigned.get(key, ()) if isinstance(expr, cst.Attribute)
                    else self.ctx.facts.assigned_in(key, id(function)))
        made = [a.value for a in assigned if not (isinstance(a.value, cst.Name) and a.value.value == "None")]
        return bool(made) and all(self._makes_generator(value) for value in made)

    def _makes_generator(self, value: cst.BaseExpression) -> bool:
        if isinstance(value, cst.GeneratorExp):
            return True
        if not isinstance(value, cst.Call):
            return False
        name = terminal(value.func) or ""
        if name == "iter" and len(value.args) == 1:
            return self._makes_generator(value.args[0].value)
        if generator_defs(value.func, self.ctx) or makes_generator_call(value, self.ctx):
            return True
        qual = self.ctx.call_qual(value) or ""
        return not (name[:1].isupper() or name in _NOT_GENERATORS or qual in _NOT_GENERATORS
                    or name in self.classes)


def _stepped(call: cst.Call, handed: cst.BaseExpression | None, function: cst.FunctionDef,
             ctx) -> cst.BaseExpression | None:
    """The generator one hand-off steps: `next` with it (directly or through `functools.partial`), its
    `__next__`, or a lambda or nested def of `function` whose body calls `next` on it."""
    target = unwrap_callable(handed, ctx)
    if isinstance(target, cst.Name) and target.value == "next" and ctx.resolve(target) in (None, "next"):
        holder = call if target is handed else handed  # `functools.partial(next, gen)` holds its arguments
        values = [a.value for a in holder.args if a.keyword is None and not a.star] \
            if isinstance(holder, cst.Call) else []
        after = [i for i, v in enumerate(values) if v is target]
        return values[after[0] + 1] if after and after[0] + 1 < len(values) else None
    if isinstance(target, cst.Attribute) and target.attr.value == "__next__":
        return target.value
    if isinstance(target, cst.Lambda):
        return _next_in(target.body)
    if isinstance(target, cst.Name):
        nested = [d for d in descendants(function.body, (cst.Lambda, cst.ClassDef))
                  if isinstance(d, cst.FunctionDef) and d.name.value == target.value]
        if len(nested) == 1 and nested[0].asynchronous is None:
            return _next_in(nested[0].body)
    return None


def _next_in(body: cst.CSTNode) -> cst.BaseExpression | None:
    """The one generator `body` calls `next()` on (not inside its own nested defs), or None."""
    stepped = {dotted(n.args[0].value): n.args[0].value for n in [body, *descendants(body, _OWN_SCOPE)]
               if isinstance(n, cst.Call) and isinstance(n.func, cst.Name) and n.func.value == "next" and n.args}
    return next(iter(stepped.values())) if len(stepped) == 1 and None not in stepped else None


def _closes(block: cst.CSTNode) -> list[tuple[cst.CSTNode, cst.Call, str | None]]:
    """The closes in `block` (not in nested defs), each with its statement and the generator it closes:
    `g.close()`, `g.throw(...)`, or `g.close` handed to the default pool (`asyncio.to_thread(g.close)`,
    `run_in_executor(None, g.close)`)."""
    found = []
    for statement in descendants(block, _OWN_SCOPE):
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for node in descendants(statement, _OWN_SCOPE):
            if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Attribute):
                continue
            name = node.func.attr.value
            if name in ("close", "throw"):
                found.append((statement, node, dotted(node.func.value)))
            elif name == "to_thread" or (name == "run_in_executor" and dotted(positional(node, 0)) == "None"):
                handed = positional(node, 1 if name == "run_in_executor" else 0)
                if isinstance(handed, cst.Attribute) and handed.attr.value == "close":
                    found.append((statement, node, dotted(handed.value)))
    return found
