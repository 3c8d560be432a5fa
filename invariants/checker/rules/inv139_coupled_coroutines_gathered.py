from __future__ import annotations

import libcst as cst

from mlx_invariants.checker.names import dotted
from mlx_invariants.checker.offload import keyword
from mlx_invariants.checker.rule import Invalid, Rule, Valid
from mlx_invariants.checker.walker import descendants

_GATHERS = frozenset({"asyncio.gather", "asyncio.tasks.gather"})
_PUTS = frozenset({"put", "put_nowait"})
_GETS = frozenset({"get", "get_nowait"})
_BROAD = frozenset({"Exception", "BaseException", "builtins.Exception", "builtins.BaseException"})


class CoupledCoroutinesGathered(Rule):
    """`asyncio.gather(a(), b())` does not cancel its other coroutines when one raises: it passes the error to its
    awaiter at once and leaves the rest running (the asyncio documentation says so). Coroutines that feed each
    other through a queue (one puts, the other gets) cannot finish alone: when the consumer fails, the producer
    fills the queue and waits on `put` for good, or produces on for ever, still holding what it holds (model
    permits, connections, the request's memory); when the producer fails, the consumer waits on `get` for good.
    Each failed request leaves such a pair behind, and the server runs out of what they hold.
    vectorize-io/hindsight's streaming retain ran `asyncio.gather(_llm_producer(), _db_consumer())` over one chunk
    queue, so a database error in the consumer left the producer and its extraction tasks parked on
    `chunk_queue.put()`, spending LLM tokens for an operation that had failed
    (hindsight-api-slim/hindsight_api/engine/retain/orchestrator.py@9a1ba95:1874, fixed in 8133c5a with tasks
    cancelled and awaited in a `finally`).

    It matches a `gather` of calls of coroutine functions of the same file (found as Python finds them: a def
    nested in the function around the gather, then the module's; a method called on `self`) where one of them, or
    a def nested in it, awaits `put` on a queue (or calls `put_nowait`) that another of them awaits `get` on (or
    calls `get_nowait`): the same name, the same `self.` attribute, or the same argument handed to both. Not
    reported: coroutines none of which can raise, as far as a reader can tell (every `await`, `async for` and
    `async with` of theirs inside a `try` that catches `Exception`, but their queue's own and `asyncio.sleep`:
    mbailey/voicemode's turn player, voice_mode/tools/converse.py@5c1b3e4:918, graded arguable blind);
    `return_exceptions=True` (the gather waits for all of them, which is another matter); tasks made beforehand
    (their maker can cancel them); a thread queue (`queue.Queue`) polled without waiting (the sides of
    flowtailor-de/live-translation's src/pipeline.py@472081f:194 and of kyutai-labs/moshi's
    scripts/test_mlx.py@e6a55d2:153, graded false blind: the poller never waits for good, and `asyncio.run`
    cancels it at exit); a name defined twice in one scope (which one runs is not known here)."""

    id = "INV139"
    catches = "`asyncio.gather` of a producer and a consumer of one queue: when one raises, the other is left running, blocked on the queue"
    message = (
        "`{gather}` runs `{putter}` and `{getter}`, which share `{queue}` ({putter} puts, {getter} gets): when one "
        "raises, gather passes the error on and leaves the other running, blocked for good on a queue nobody "
        "serves any more; run them in an `asyncio.TaskGroup` (Python 3.11+), which cancels the rest, or as tasks "
        "you cancel and await in a `finally`"
    )
    known_problems = (
        "A queue reached under two names (a local alias, an attribute of another object) is not matched, nor one "
        "handed on by keyword. A producer that ends the consumer with a sentinel in a `finally` still counts: the "
        "consumer's failure leaves the producer behind all the same."
    )
    # On by default. Its first version had three findings on the HEADs of the 281 repositories mirrored here (issue
    # 23), graded blind: none true, one arguable, two false; each is left out since, by the exemptions above (each
    # with an example that fails without it), so its precision on code nobody here read is not measured yet. It
    # detects the held-out case it was written from (heldout19's HS-STREAMLEAK, studied) and is silent at its fix.
    triggers = (("gather",), ("put",), ("get",))

    INVALID = [
        Invalid('''
            import asyncio


            async def retain(chunks, extract, store):
                queue = asyncio.Queue(maxsize=8)

                async def produce():
                    for chunk in chunks:
                        await queue.put(await extract(chunk))
                    await queue.put(None)

                async def consume():
                    while (facts := await queue.get()) is not None:
                        await store(facts)

                await asyncio.gather(produce(), consume())  # expect: INV139


            async def replay(log, store):
                async def produce():
                    for facts in log:
                        await store(facts)

                async def consume():
                    return await store(None)

                await asyncio.gather(produce(), consume())
        '''),
        Invalid('''
            import asyncio


            class Bridge:
                def __init__(self, websocket, model):
                    self.websocket, self.model = websocket, model
                    self.frames = asyncio.Queue()

                async def receive(self):
                    while True:
                        self.frames.put_nowait(await self.websocket.receive_bytes())

                async def answer(self):
                    while True:
                        frame = await self.frames.get()
                        await self.websocket.send_bytes(await self.model.step(frame))

                async def serve(self):
                    await asyncio.gather(self.receive(), self.answer())  # expect: INV139
        '''),
        Invalid('''
            import asyncio


            async def capture(source, blocks):
                async for block in source:
                    await blocks.put(block)


            async def transcribe(pending, sink, model):
                while True:
                    await sink(await model.transcribe(await pending.get()))


            async def session(source, sink, model):
                audio = asyncio.Queue(maxsize=4)
                await asyncio.gather(capture(source, audio), transcribe(audio, sink, model))  # expect: INV139
        '''),
    ]
    VALID = [
        Valid('''
            import asyncio


            async def retain(chunks, extract, store):
                queue = asyncio.Queue(maxsize=8)

                async def produce():
                    for chunk in chunks:
                        await queue.put(await extract(chunk))
                    await queue.put(None)

                async def consume():
                    while (facts := await queue.get()) is not None:
                        await store(facts)

                async with asyncio.TaskGroup() as group:
                    group.create_task(produce())
                    group.create_task(consume())
        '''),
        Valid('''
            import asyncio


            class Bridge:
                def __init__(self, websocket, model):
                    self.websocket, self.model = websocket, model
                    self.frames = asyncio.Queue()

                async def receive(self):
                    while True:
                        self.frames.put_nowait(await self.websocket.receive_bytes())

                async def answer(self):
                    while True:
                        frame = await self.frames.get()
                        await self.websocket.send_bytes(await self.model.step(frame))

                async def serve(self):
                    tasks = [asyncio.create_task(self.receive()), asyncio.create_task(self.answer())]
                    try:
                        await asyncio.gather(*tasks)
                    finally:
                        for task in tasks:
                            task.cancel()
                        await asyncio.gather(*tasks, return_exceptions=True)
        '''),
        # Neither side can raise: each catches the errors of its own work and goes on, so neither is left behind.
        Valid('''
            import asyncio
            import logging


            async def play_turns(turns, synthesize, play):
                audio = asyncio.Queue(maxsize=1)

                async def produce():
                    for turn in turns:
                        try:
                            samples = await synthesize(turn)
                        except Exception:
                            logging.exception("synthesis failed")
                            samples = None
                        await audio.put(samples)
                    await audio.put(None)

                async def consume():
                    while (samples := await audio.get()) is not None:
                        try:
                            await play(samples)
                        except Exception:
                            logging.exception("playback failed")
                        await asyncio.sleep(0.2)

                await asyncio.gather(produce(), consume())
        '''),
        # A thread queue polled without waiting: the poller never waits on it for good.
        Valid('''
            import asyncio
            import queue


            async def relay(websocket, model):
                frames = queue.Queue()

                async def receive():
                    while True:
                        frames.put(await websocket.receive_bytes())

                async def answer():
                    while True:
                        try:
                            frame = frames.get(block=False)
                        except queue.Empty:
                            await asyncio.sleep(0.01)
                            continue
                        await websocket.send_bytes(model.step(frame))

                await asyncio.gather(receive(), answer())
        '''),
        # Two coroutines that share nothing: each one's failure leaves the other with work it can finish.
        Valid('''
            import asyncio


            async def capture(source, audio):
                async for block in source:
                    await audio.put(block)


            async def warm(cache, keys):
                for key in keys:
                    cache.get(key)


            async def session(source, cache, keys):
                audio = asyncio.Queue(maxsize=4)
                await asyncio.gather(capture(source, audio), warm(cache, keys))
        '''),
    ]

    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        self.defs: dict[tuple[int | None, str], list[cst.FunctionDef]] = {}  # (the scope around it, its name)
        self.scopes: list[cst.FunctionDef | cst.ClassDef] = []
        # each gather, its statement, the functions around it (innermost first) and the class of its method
        self.gathers: list[tuple[cst.Call, cst.CSTNode | None, list[int], int | None]] = []

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.scopes.append(node)

    def leave_ClassDef(self, node: cst.ClassDef) -> None:
        self.scopes.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        around = id(self.scopes[-1]) if self.scopes else None
        self.defs.setdefault((around, node.name.value), []).append(node)
        self.scopes.append(node)

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.scopes.pop()

    def visit_Call(self, node: cst.Call) -> None:
        if self.ctx.resolve(node.func) in _GATHERS and not _returns_exceptions(node):
            functions = [id(s) for s in reversed(self.scopes) if isinstance(s, cst.FunctionDef)]
            method = next((i for i, s in enumerate(self.scopes) if isinstance(s, cst.FunctionDef)), None)
            cls = self.scopes[method - 1] if method is not None and method > 0 else None
            self.gathers.append((node, self.ctx.statement, functions,
                                 id(cls) if isinstance(cls, cst.ClassDef) else None))

    def end(self) -> None:
        for call, statement, functions, cls in self.gathers:
            found = self._coupled(call, functions, cls)
            if found is not None:
                putter, getter, queue = found
                self.ctx.report_at(self.id, call, statement, self.message.format(
                    gather="asyncio.gather(...)", putter=putter, getter=getter, queue=queue))

    def _called(self, func: cst.BaseExpression, functions: list[int], cls: int | None) -> cst.FunctionDef | None:
        """The one def a call of `func` runs, found as Python finds it: a name in the functions around the
        gather, innermost first, then the module; `self.name` among the methods of the gather's class."""
        if isinstance(func, cst.Name):
            scopes: list[int | None] = [*functions, None]
            name = func.value
        elif isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self":
            scopes, name = [cls], func.attr.value
        else:
            return None
        for scope in scopes:
            defs = self.defs.get((scope, name))
            if defs:
                return defs[0] if len(defs) == 1 and defs[0].asynchronous is not None else None
        return None

    def _coupled(self, gather: cst.Call, functions: list[int], cls: int | None) -> tuple[str, str, str] | None:
        """(the putting call, the getting call, the queue) of two arguments of `gather`, if any."""
        sides: list[tuple[str, set[str], set[str]]] = []
        raising = False
        for arg in gather.args:
            if arg.star or not isinstance(arg.value, cst.Call):
                continue
            fn = self._called(arg.value.func, functions, cls)
            if fn is not None:
                puts, gets = _queue_ops(fn, arg.value)
                sides.append((f"{dotted(arg.value.func)}()", puts, gets))
                raising = raising or _may_raise(fn, self.ctx.resolve)
        if not raising:
            return None
        for putter, puts, _ in sides:
            for getter, _, gets in sides:
                shared = sorted(puts & gets)
                if putter != getter and shared:
                    return putter, getter, shared[0]
        return None


def _returns_exceptions(call: cst.Call) -> bool:
    value = keyword(call, "return_exceptions")
    return value is not None and not (isinstance(value, cst.Name) and value.value == "False")


def _queue_ops(fn: cst.FunctionDef, call: cst.Call) -> tuple[set[str], set[str]]:
    """The queues `fn` (and the defs nested in it) puts into and gets from, each named as the caller names it:
    a parameter by the argument `call` passes there (a name or a `self.` attribute), anything else as written."""
    params = [p.name.value for p in fn.params.params]
    if params and params[0] == "self":
        params = params[1:]
    passed = {param: dotted(arg.value) for param, arg in zip(params, (a for a in call.args if not a.keyword))
              if dotted(arg.value) is not None}
    puts: set[str] = set()
    gets: set[str] = set()
    nodes = descendants(fn.body)
    awaited = {id(node.expression) for node in nodes if isinstance(node, cst.Await)}
    for node in nodes:
        if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Attribute):
            continue
        method = node.func.attr.value
        if method not in _PUTS and method not in _GETS:
            continue
        if method in ("put", "get") and id(node) not in awaited:
            continue  # a thread queue polled, `dict.get`: nothing waits for good on a peer
        receiver = dotted(node.func.value)
        if receiver is None:
            continue
        head, _, rest = receiver.partition(".")
        named = f"{passed[head]}.{rest}" if head in passed and rest else passed.get(head, receiver)
        (puts if method in _PUTS else gets).add(named)
    return puts, gets


def _may_raise(fn: cst.FunctionDef, resolve) -> bool:
    """Some `await`, `async for` or `async with` of `fn` (or of a def nested in it) stands outside every `try`
    that catches `Exception` (or more), other than a queue's `put`/`get` and `asyncio.sleep`: its error would
    leave the coroutine."""
    nodes = descendants(fn.body)
    guarded: set[int] = set()
    for node in nodes:
        if isinstance(node, cst.Try) and any(_broad(handler, resolve) for handler in node.handlers):
            guarded.update(id(inner) for inner in descendants(node.body))
    for node in nodes:
        if id(node) in guarded:
            continue
        if isinstance(node, cst.Await):
            call = node.expression
            if isinstance(call, cst.Call) and (resolve(call.func) == "asyncio.sleep" or (
                    isinstance(call.func, cst.Attribute) and call.func.attr.value in _PUTS | _GETS)):
                continue
            return True
        if isinstance(node, cst.For | cst.With) and node.asynchronous is not None:
            return True
    return False


def _broad(handler: cst.ExceptHandler, resolve) -> bool:
    """`except:`, `except Exception`, `except BaseException` (alone or in a tuple)."""
    kind = handler.type
    kinds = [e.value for e in kind.elements] if isinstance(kind, cst.Tuple) else [kind]
    return kind is None or any(
        isinstance(k, cst.BaseExpression) and (resolve(k) or dotted(k)) in _BROAD for k in kinds)
