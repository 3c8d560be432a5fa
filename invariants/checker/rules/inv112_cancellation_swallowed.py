from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import libcst as cst

from mlx_invariants.checker.awaiters import AWAITED, TASK, Awaiters
from mlx_invariants.checker.cancellers import caught
from mlx_invariants.checker.continuation import Continuation, Next
from mlx_invariants.checker.globs import matches_name
from mlx_invariants.checker.names import dotted, terminal
from mlx_invariants.checker.offload import positional
from mlx_invariants.checker.rule import Invalid, Rule, Valid
from mlx_invariants.checker.scopes import Kind
from mlx_invariants.checker.walker import OWN_BODY_STOP, descendants

# What an `except` must name to catch the current task's cancellation. concurrent.futures'
# CancelledError is an Exception of its own: it never catches asyncio's.
_CANCELLATION = frozenset({"asyncio.CancelledError", "asyncio.exceptions.CancelledError", "BaseException",
                           "builtins.BaseException"})
# Awaiting these on tasks this function cancelled only collects those tasks' cancellation.
_COLLECTORS = frozenset({"asyncio.gather", "asyncio.wait", "asyncio.wait_for", "asyncio.shield",
                         "asyncio.tasks.gather", "asyncio.tasks.wait", "asyncio.tasks.wait_for"})
_CURRENT_TASK = frozenset({"asyncio.current_task", "asyncio.tasks.current_task"})
_TASK_MAKERS = frozenset({"create_task", "ensure_future"})


@dataclass
class _Swallow:
    handler: cst.ExceptHandler
    exit: cst.CSTNode  # the break/continue/return, or the handler itself when it falls off its end
    how: str
    flags: set[str]  # what the handler assigns: a later `if flag: raise` re-raises it
    statement: cst.CSTNode  # the exit's own line (or the handler), for suppression comments
    function: cst.CSTNode  # the async def whose handler it is
    key: str | None  # that def's key (`_drain`, `Server._drain`), to find its callers
    attempt: cst.CSTNode  # the try statement the handler belongs to
    exits: list[cst.CSTNode]  # every break/continue/return that leaves the handler
    falls_off: bool  # the handler's end is reachable
    reraised: bool = False


class CancellationSwallowed(Rule):
    """A coroutine that catches its own cancellation (`except asyncio.CancelledError`,
    `except BaseException`, a bare `except`) and then leaves the handler by `break`,
    `continue`, `return` or by falling off its end finishes as *done*, not *cancelled*.
    That matters where someone goes on as if it had not been cancelled: the coroutine
    itself (it awaits, yields or goes round its loop again after the handler), the
    caller that awaited it (it carries on past the `await` or the `async for`), a
    timeout around it (`wait_for` returns its value instead of raising TimeoutError),
    or whoever reads how its task ended (`task.cancelled()`, `result()`, a gather, an
    await that goes on differently either way). vllm-mlx's engine and MLLM scheduler loops
    both did `except asyncio.CancelledError: break` (changed to `raise` in a76295c, the
    corpus's a76295c-a and a76295c-b), but their only awaiter was the stop() idiom
    `task.cancel(); try: await task except CancelledError: pass`, which goes on alike
    whether the task ended done or cancelled: nothing read the difference, so such a
    loop is not reported (issue 23: the three omlx loops of that shape were the rule's
    HEAD findings, graded arguable blind; the two training detections went with them). A
    background task whose cancellers never await it, ending where it swallows, and a
    stream that just ends are not reported either: nothing reads how they ended.

    Opt-in (`select = ["INV", "INV112"]`): on the HEADs of ten MLX servers (docs/corpus.md) none
    of its findings has been a true bug: 21 at first, 15 of them false (a background task or a
    stream whose end nobody reads, now left alone), then the three stop()-idiom loops above, and
    the one left, omlx's `except (CancelledError, Exception): pass` around a shielded wait on
    another task, is arguable: whose cancellation that handler catches, the caller's or the
    awaited task's own, the code does not say. No corpus case is detected by it alone."""

    id = "INV112"
    # Opt-in: no HEAD finding of ten MLX servers was a true bug (the docstring says which were what).
    default_enabled = False
    catches = ("an `except CancelledError` (or BaseException) in an async def that leaves without re-raising, "
               "where the coroutine, its caller, a timeout or its task's awaiter goes on")
    message = (
        "`{handler}` {how} without re-raising: the task ends as done, not cancelled, so whoever cancelled it "
        "never learns; re-raise it (`raise`), or call `asyncio.current_task().uncancel()` where swallowing "
        "the cancellation is deliberate"
    )
    known_problems = (
        "Judges handlers in an async def whose try body awaits. Not flagged: awaiting only tasks this "
        "function called `.cancel()` on before the try (the stop() idiom: `t.cancel(); try: await t "
        "except CancelledError: pass`), a handler that calls `.uncancel()`, a handler that sets a name "
        "a later `if` tests before raising (a drain loop's `cancelled = True ... if cancelled: raise`), "
        "and handlers nested in another cancellation handler (the outer one is judged as a whole). "
        "Also not flagged: a def that arranges its own cancellation (it cancels `asyncio.current_task()` "
        "through a callback, or hands it to a task it starts whose coroutine cancels that parameter or "
        "is defined in another file), so an outside cancellation caught by the same handler is missed; and a "
        "helper whose every call in this file is cleanup under a cancellation that goes on (in a handler "
        "that re-raises on every path, or in a finally): a helper called from nowhere in the file, or "
        "from any other place, is judged alone. "
        "Who runs the coroutine is read from its own file only, by the def's name (`self._loop`, `_loop`): "
        "a swallow that ends the coroutine (only synchronous statements or `finally` blocks run after it) "
        "is reported when a call in the file awaits it and goes on to suspend again (or its caller's "
        "callers do), under a timeout, or when its task is kept under a name that is awaited, gathered or "
        "asked `result()`/`exception()`/`cancelled()` anywhere in the file, or is a TaskGroup's; an await "
        "that is the stop() idiom (the def cancelled the task before it, the await is its try's one "
        "statement, and the CancelledError handler falls through, or `suppress(CancelledError)`) reads no "
        "outcome, so a stopper that tells the two ends apart some other way (a flag the loop sets) is missed. A task "
        "dropped or kept in a container (`self._tasks[id] = create_task(...)`) counts as never awaited. A "
        "def nothing in the file calls, or only hands on (`StreamingResponse(gen())`, a callback), is judged "
        "by its kind: a coroutine function is reported (an awaiting caller elsewhere would take it as "
        "completed) unless its handler records the cancellation as the job's state (`run.status = "
        "\"cancelled\"`); an async generator is not (its stream just ends), so a consumer in another module "
        "that goes on after its `async for` is missed. A handler that records the cancellation as the job's "
        "state is not reported for a caller in the file that awaits it and goes on either (a job runner moving "
        "to the next job: the state says how each job ended), only under a timeout or for a task whose end is "
        "observed; a runner that goes on as if the cancelled job had succeeded is missed. Branches are not told apart: a suspension on any "
        "path after the handler counts. "
        "Any `raise` counts as re-raising, even of another exception; `except*` is not judged."
    )
    triggers = (("async",), ("except",))

    INVALID = [
        Invalid('''
            import asyncio

            class EngineCore:
                async def start(self):
                    self._task = asyncio.create_task(self._engine_loop())

                async def stop(self):
                    self._running = False
                    self._task.cancel()
                    try:
                        await self._task
                    except asyncio.CancelledError:
                        pass
                    if not self._task.cancelled():
                        logger.error("engine loop had died before stop(); its requests were failed")

                async def _engine_loop(self):
                    while self._running:
                        try:
                            await self._step_once()
                            await asyncio.sleep(0.001)
                        except asyncio.CancelledError:
                            break  # expect: INV112
                        except Exception:
                            logger.exception("engine loop error")
                            await asyncio.sleep(0.1)
        '''),
        Invalid('''
            import asyncio

            async def stream_outputs(queue):
                try:
                    while True:
                        yield await queue.get()
                except (GeneratorExit, asyncio.CancelledError):  # expect: INV112
                    logger.info("stream closed")

            async def relay(queue, client):
                async for item in stream_outputs(queue):
                    await client.send(item)
                await client.send_done()  # a cancelled relay still tells the client the answer is complete
        '''),
        Invalid('''
            from asyncio import CancelledError as Cancelled

            async def next_chunk(stream):
                try:
                    return await stream.read()
                except Cancelled:
                    return None  # expect: INV112
        '''),
        Invalid('''
            import asyncio

            async def drain(done):
                cancelled = False
                while not done.done():
                    try:
                        await asyncio.shield(done)
                    except asyncio.CancelledError:  # expect: INV112
                        cancelled = True
                return cancelled
        '''),
        Invalid('''
            async def send(ws, message, fatal):
                try:
                    await ws.send(message)
                except BaseException:  # expect: INV112
                    if fatal:
                        raise
        '''),
        Invalid('''
            import asyncio

            async def serve_connection(reader, writer, respond):
                try:
                    await respond(writer)
                except asyncio.CancelledError:  # expect: INV112
                    pass  # a server shutdown's cancellation ends here as well
                finally:
                    writer.close()
        '''),
        Invalid('''
            import asyncio

            async def serve_connection(reader, writer, respond):
                hangup = asyncio.ensure_future(note_hangup(reader, asyncio.current_task()))
                try:
                    await respond(writer)
                except asyncio.CancelledError:  # expect: INV112
                    pass  # the watcher only names the handler in a log: this cancellation came from outside
                finally:
                    hangup.cancel()
                    writer.close()

            async def note_hangup(reader, handler):
                while await reader.read(4096):
                    pass
                logger.info("client of %s hung up", handler.get_name())
        '''),
        Invalid('''
            import asyncio

            async def finish(job, stop):
                stop.set()
                await wait_out(job)
                return job.result()

            async def wait_out(job):
                while not job.done():
                    try:
                        await asyncio.wait({job})
                    except asyncio.CancelledError:  # expect: INV112
                        pass
        '''),
        Invalid('''
            import asyncio

            async def read_reply(conn):
                try:
                    return await conn.readline()
                except asyncio.CancelledError:
                    return b""  # expect: INV112

            async def ask(conn, question, seconds):
                await conn.write(question)
                return await asyncio.wait_for(read_reply(conn), seconds)  # a timeout returns b"", no TimeoutError
        '''),
        Invalid('''
            import asyncio

            class Poller:
                def start(self):
                    self._task = asyncio.create_task(self._poll())

                def stop(self):
                    self._task.cancel()

                async def _poll(self):
                    while True:
                        try:
                            await self._refresh()
                        except asyncio.CancelledError:  # expect: INV112
                            logger.info("refresh cancelled")
                        await asyncio.sleep(1.0)
        '''),
        Invalid('''
            import asyncio

            async def run_job(job):
                try:
                    await job.execute()
                    job.state = "done"
                except asyncio.CancelledError:
                    job.state = "cancelled"
                    return  # expect: INV112

            async def run_with_deadline(job):
                await asyncio.wait_for(run_job(job), timeout=30)  # a timeout now returns instead of raising
                await job.report()
        '''),
    ]
    VALID = [
        Valid('''
            import asyncio
            import contextlib

            class MetricsPusher:
                def open(self):
                    self._pusher = asyncio.get_running_loop().create_task(self._push_forever())

                async def close(self):
                    self._pusher.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await self._pusher  # done or cancelled, close() goes on alike

                async def _push_forever(self):
                    while True:
                        try:
                            await self._sink.send(self._snapshot())
                            await asyncio.sleep(15)
                        except asyncio.CancelledError:
                            return
        '''),
        Valid('''
            import asyncio

            class EngineCore:
                async def start(self):
                    self._task = asyncio.create_task(self._engine_loop())

                async def stop(self):
                    self._running = False
                    self._task.cancel()
                    try:
                        await self._task
                    except asyncio.CancelledError:
                        pass
                    if not self._task.cancelled():
                        logger.error("engine loop had died before stop(); its requests were failed")

                async def _engine_loop(self):
                    while self._running:
                        try:
                            await self._step_once()
                            await asyncio.sleep(0.001)
                        except asyncio.CancelledError:
                            raise
                        except Exception:
                            logger.exception("engine loop error")
                            await asyncio.sleep(0.1)
        '''),
        Valid('''
            import asyncio

            async def stream_outputs(queue):
                try:
                    while True:
                        yield await queue.get()
                except (GeneratorExit, asyncio.CancelledError):
                    logger.info("stream closed")
                    raise

            async def relay(queue, client):
                async for item in stream_outputs(queue):
                    await client.send(item)
                await client.send_done()
        '''),
        Valid('''
            from asyncio import CancelledError as Cancelled

            async def next_chunk(stream):
                try:
                    return await stream.read()
                except Cancelled:
                    raise
        '''),
        Valid('''
            import asyncio

            async def drain(done):
                cancelled = False
                while not done.done():
                    try:
                        await asyncio.shield(done)
                    except asyncio.CancelledError:
                        cancelled = True
                if cancelled:
                    raise asyncio.CancelledError()
        '''),
        Valid('''
            async def send(ws, message, fatal):
                try:
                    await ws.send(message)
                except BaseException:
                    if fatal:
                        raise
                    logger.warning("send failed", exc_info=True)
                    raise
        '''),
        Valid('''
            import asyncio

            async def run_blocking(task):
                try:
                    await asyncio.shield(task)
                except asyncio.CancelledError:
                    while not task.done():
                        try:
                            await asyncio.shield(task)
                        except asyncio.CancelledError:
                            continue
                        except Exception:
                            logger.warning("worker failed while draining", exc_info=True)
                            break
                    raise
        '''),
        Valid('''
            import asyncio

            class Scheduler:
                async def stop(self):
                    self._task.cancel()
                    try:
                        await self._task
                    except asyncio.CancelledError:
                        pass
        '''),
        Valid('''
            import asyncio

            async def serve(client):
                try:
                    await client.run()
                except asyncio.CancelledError:
                    if not client.disconnected:
                        raise
                    asyncio.current_task().uncancel()
        '''),
        Valid('''
            import asyncio

            async def produce(run, emit_error):
                try:
                    await run()
                except asyncio.CancelledError:
                    raise
                except BaseException as exc:
                    emit_error(exc)
        '''),
        Valid('''
            async def cleanup_after_cancel(cleanup):
                with suspend_cancellation():
                    try:
                        await cleanup()
                    except BaseException:
                        logger.error("cleanup failed while preserving cancellation", exc_info=True)
        '''),
        Valid('''
            import asyncio

            async def wait_for_load(self, task):
                try:
                    return await asyncio.shield(task)
                except asyncio.CancelledError:
                    current = asyncio.current_task()
                    if task.cancelled() and current.cancelling() == 0:
                        return None  # the load was cancelled, not this waiter
                    raise
        '''),
        Valid('''
            async def stream(producer_task, abort):
                try:
                    yield await producer_task
                finally:
                    abort.set()
                    try:
                        await producer_task
                    except BaseException:
                        pass
        '''),
        Valid('''
            import asyncio

            async def result_of(task):
                try:
                    return task.result()
                except (asyncio.CancelledError, Exception):
                    return None
        '''),
        Valid('''
            import asyncio

            async def serve_connection(reader, writer, respond):
                hangup = asyncio.ensure_future(cancel_on_hangup(reader, asyncio.current_task()))
                try:
                    await respond(writer)
                except asyncio.CancelledError:
                    pass  # our own watcher: the client hung up, and nobody awaits this handler
                finally:
                    hangup.cancel()
                    writer.close()

            async def cancel_on_hangup(reader, handler):
                while await reader.read(4096):
                    pass
                handler.cancel()
        '''),
        Valid('''
            import asyncio

            async def finish(job, stop):
                try:
                    return await asyncio.shield(job)
                except BaseException:
                    stop.set()
                    await wait_out(job)
                    raise

            async def wait_out(job):
                """Hold on until the worker has returned, through any number of cancels; the caller re-raises."""
                while not job.done():
                    try:
                        await asyncio.wait({job})
                    except asyncio.CancelledError:
                        pass
        '''),
        Valid('''
            import asyncio

            async def read_reply(conn):
                try:
                    return await conn.readline()
                except asyncio.CancelledError:
                    raise

            async def ask(conn, question, seconds):
                await conn.write(question)
                return await asyncio.wait_for(read_reply(conn), seconds)
        '''),
        Valid('''
            import asyncio

            class Poller:
                def start(self):
                    self._task = asyncio.create_task(self._poll())

                def stop(self):
                    self._task.cancel()  # nobody awaits the poller: how it ended is read by no one

                async def _poll(self):
                    try:
                        while True:
                            await self._refresh()
                            await asyncio.sleep(1.0)
                    except asyncio.CancelledError:
                        logger.info("poller stopped")  # ends here: nothing after the loop runs
        '''),
        Valid('''
            import asyncio

            class EngineCore:
                async def start(self):
                    self._task = asyncio.create_task(self._engine_loop())

                def stop(self):
                    self._running = False
                    self._task.cancel()

                async def _engine_loop(self):
                    while self._running:
                        try:
                            await self._step_once()
                            await asyncio.sleep(0.001)
                        except asyncio.CancelledError:
                            break  # the loop is the coroutine's end, and stop() never awaits the task
                        except Exception:
                            logger.exception("engine loop error")
                            await asyncio.sleep(0.1)
        '''),
        Valid('''
            import asyncio

            from starlette.responses import StreamingResponse

            async def events(request):
                async def event_stream():
                    try:
                        while True:
                            yield await request.app.state.events.get()
                    except asyncio.CancelledError:
                        logger.info("client went away")  # the stream ends; its response is being torn down

                return StreamingResponse(event_stream())
        '''),
        Valid('''
            import asyncio

            async def run_benchmark(run, engine):
                try:
                    for case in run.cases:
                        await engine.generate(case)
                    run.status = "completed"
                except asyncio.CancelledError:
                    run.status = "cancelled"  # the job's outcome, where whoever started it looks
                    await run.events.put({"type": "cancelled"})
        '''),
        Valid('''
            import asyncio

            async def run_job(job):
                try:
                    await job.execute()
                    job.state = "done"
                except asyncio.CancelledError:
                    job.state = "cancelled"  # the job's outcome, where its observers look
                    return

            async def drain_queue(queue):
                while queue:
                    job = queue.pop(0)
                    await run_job(job)  # the runner moves on; each job's state says how it ended
        '''),
        Valid('''
            import asyncio

            async def chunks(stream, stop_requested):
                try:
                    async for chunk in stream:
                        yield chunk
                except asyncio.CancelledError:
                    if not stop_requested():
                        raise

            async def forward(stream, stop_requested, outbox):
                async for chunk in chunks(stream, stop_requested):
                    outbox.put(chunk)
                outbox.put(None)

            def accept(request, outbox, pending):
                task = asyncio.get_running_loop().create_task(forward(request.stream, request.stop_requested, outbox))
                pending.add(task)
                task.add_done_callback(pending.discard)
        '''),
    ]

    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        self.cancelled: dict[int, set[str]] = {}  # per function: keys `.cancel()` was called on so far
        self.loop_targets: dict[int, dict[str, str]] = {}  # per function: loop variable -> what it iterates
        self.inner: set[int] = set()  # handlers inside a cancellation handler already judged
        self.pending: dict[int, list[_Swallow]] = {}
        self.found: list[_Swallow] = []
        self.shielded: dict[int, int] = {}  # per function: depth of `with <shield helper>:` blocks
        self.finally_depth: dict[int, int] = {}
        # Per function: for each except clause the walk is inside, whether it catches a cancellation and
        # re-raises on every path (a call made there runs while the cancellation is still on its way out).
        self.handlers: dict[int, list[bool]] = {}
        # Calls by callee key: for each, whether it was made where the caller re-raises the cancellation.
        self.calls: dict[str, list[bool]] = {}
        self.current_task: set[int] = set()  # functions that call asyncio.current_task()
        self.awaiters = Awaiters(ctx)  # who awaits the file's coroutines, and who reads their tasks' outcome
        self.continuations: dict[int, Continuation] = {}

    def _count(self, counts: dict[int, int], step: int) -> None:
        function = self._function()
        if function is not None:
            counts[function] = counts.get(function, 0) + step

    def visit_Finally(self, node: cst.Finally) -> None:
        self._count(self.finally_depth, 1)

    def leave_Finally(self, node: cst.Finally) -> None:
        self._count(self.finally_depth, -1)

    def visit_With(self, node: cst.With) -> None:
        self.awaiters.on_with(node)
        if self._shields(node):
            self._count(self.shielded, 1)

    def leave_With(self, node: cst.With) -> None:
        self.awaiters.on_with_exit(node)
        if self._shields(node):
            self._count(self.shielded, -1)

    def visit_Await(self, node: cst.Await) -> None:
        self.awaiters.on_await(node)

    def visit_Assign(self, node: cst.Assign) -> None:
        if len(node.targets) == 1:
            self.awaiters.on_assign(node.targets[0].target, node.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self.awaiters.on_assign(node.target, node.value)

    def _shields(self, node: cst.With) -> bool:
        helpers = self.ctx.shared["shield-helpers"]
        return any(matches_name(dotted(i.item.func if isinstance(i.item, cst.Call) else i.item), helpers)
                   for i in node.items)

    def _function(self) -> int | None:
        frame = self.ctx.scope.top
        return id(frame.node) if frame.kind is Kind.ASYNC else None

    def visit_For(self, node: cst.For) -> None:
        self.awaiters.on_for(node)
        function = self._function()
        iterated = self.ctx.key(node.iter)
        if function is not None and isinstance(node.target, cst.Name) and iterated:
            self.loop_targets.setdefault(function, {})[node.target.value] = iterated

    def visit_ExceptHandler(self, node: cst.ExceptHandler) -> None:
        function = self._function()
        if function is not None:
            reraises = self._catches_cancellation(node.type) and _always_raises(node)
            self.handlers.setdefault(function, []).append(reraises)

    def leave_ExceptHandler(self, node: cst.ExceptHandler) -> None:
        function = self._function()
        if function is not None and self.handlers.get(function):
            self.handlers[function].pop()

    def visit_Call(self, node: cst.Call) -> None:
        self.awaiters.on_call(node)
        func = node.func
        function = self._function()
        if function is None:
            return
        callee = self.ctx.key(func)
        if callee is not None:
            # In a finally the exception in flight goes on after it; in a handler that re-raises, too.
            cleanup = bool(self.finally_depth.get(function, 0)) or any(self.handlers.get(function, ()))
            self.calls.setdefault(callee, []).append(cleanup)
        if self.ctx.resolve(func) in _CURRENT_TASK:
            self.current_task.add(function)
        if not (isinstance(func, cst.Attribute) and func.attr.value == "cancel"):
            return
        key = self.ctx.key(func.value)
        if key is not None:
            cancelled = self.cancelled.setdefault(function, set())
            cancelled.add(key)
            iterated = self.loop_targets.get(function, {}).get(key)
            if iterated:
                cancelled.add(iterated)

    def visit_Try(self, node: cst.Try) -> None:
        self.awaiters.on_try(node)
        function = self._function()
        if function is None or self.shielded.get(function, 0) or self.finally_depth.get(function, 0):
            return  # cancellation is held off here, or the exception in flight goes on after the finally
        # Only the first handler that catches a cancellation ever sees one.
        handler = next((h for h in node.handlers if self._catches_cancellation(h.type)), None)
        if handler is None or id(handler) in self.inner or not self._awaits(node.body, function):
            return
        self.inner.update(id(n) for n in descendants(handler.body, OWN_BODY_STOP) if isinstance(n, cst.ExceptHandler))
        if _consults_cancellation_state(handler):
            return
        exits, falls_off = _flow(_statements(handler.body), 0)
        if exits:
            (exit_node, line), how = exits[0], _HOW[type(exits[0][0])]
        elif falls_off:
            exit_node, line, how = handler, handler, "falls off its end"
        else:
            return
        flags = {k for k in map(self.ctx.key, _assigned(handler)) if k}
        owner = self.ctx.scope.top.node
        facts = self.ctx.function_facts(owner)
        swallow = _Swallow(handler, exit_node, how, flags, line or handler, owner, facts.key if facts else None,
                           node, [e for e, _ in exits], falls_off)
        self.found.append(swallow)
        if flags:
            self.pending.setdefault(function, []).append(swallow)

    def visit_If(self, node: cst.If) -> None:
        function = self._function()
        waiting = self.pending.get(function or 0)
        if not waiting:
            return
        names = [n for n in [node.test, *descendants(node.test)] if isinstance(n, cst.Name | cst.Attribute)]
        tested = {self.ctx.key(n) for n in names}
        if not any(isinstance(n, cst.Raise) for n in descendants(node.body, OWN_BODY_STOP)):
            return
        for swallow in waiting:
            if swallow.flags & tested:
                swallow.reraised = True

    def end(self) -> None:
        for swallow in self.found:
            if swallow.reraised or self._cancels_itself(swallow.function) or self._callers_reraise(swallow.key):
                continue
            if not self._goes_on(swallow) and not self._lost_upward(swallow.function, swallow.key, swallow.handler):
                continue
            handler = "except:" if swallow.handler.type is None else f"except {_text(swallow.handler.type)}"
            message = self.message.format(handler=handler, how=swallow.how)
            self.ctx.report_at(self.id, swallow.exit, swallow.statement, message)

    def _continuation(self, function: cst.FunctionDef) -> Continuation:
        found = self.continuations.get(id(function))
        if found is None:
            found = self.continuations[id(function)] = Continuation(function)
        return found

    def _goes_on(self, swallow: _Swallow) -> bool:
        """After the handler the coroutine suspends again (awaits, yields, goes round its loop): the
        cancellation did not stop it, whoever started it."""
        flow = self._continuation(swallow.function)  # type: ignore[arg-type]
        for exit in swallow.exits:
            if isinstance(exit, cst.Continue):
                return True
            if isinstance(exit, cst.Break):
                loop = flow.loop_around(swallow.attempt)
                if loop is None or flow.after(loop) is Next.RESUMES:
                    return True
        return swallow.falls_off and flow.after(swallow.attempt) is Next.RESUMES

    def _lost_upward(self, function: cst.CSTNode, key: str | None, handler: cst.ExceptHandler | None,
                     seen: set[str] | None = None) -> bool:
        """Someone reads the outcome the swallow changed: a caller in this file that awaits the def and
        then goes on (or whose own callers do), a timeout around it that now returns instead of raising,
        or a task of it that is awaited or asked how it ended (the stop() idiom: cancel, then await).
        A def nothing in this file runs is judged by its kind: a coroutine function returns to a caller
        as if it completed (unless its handler records the cancellation as the job's state); an async
        generator just ends its stream, which its consumer (a framework's response) sees as the end."""
        seen = set() if seen is None else seen
        if key is not None and key in seen:
            return False
        seen.add(key or "")
        uses = self.awaiters.uses(key)
        unknown = not uses
        for use in uses:
            if use.kind == AWAITED:
                if use.timed:
                    return True
                if handler is not None and _records_cancellation(handler):
                    continue  # a job that reports how it ended in its state: its runner going on loses nothing
                caller = use.frame
                if not isinstance(caller, cst.FunctionDef) or use.statement is None:
                    unknown = True
                    continue
                if not _returns_at(use.statement) and self._continuation(caller).after(use.statement) is Next.RESUMES:
                    return True
                facts = self.ctx.function_facts(caller)
                if self._lost_upward(caller, facts.key if facts else None, None, seen):
                    return True
            elif use.kind == TASK:
                if use.grouped or self.awaiters.observed(use.handle):
                    return True
            else:
                unknown = True
        if not unknown:
            return False
        if _is_generator(function):
            return False
        return handler is None or not _records_cancellation(handler)

    def _catches_cancellation(self, kind: cst.BaseExpression | None) -> bool:
        if kind is None:
            return True
        return any(qual in _CANCELLATION for qual in caught(kind, self.ctx))

    def _callers_reraise(self, key: str | None) -> bool:
        """Every call of this def in the file is cleanup under a cancellation that goes on afterwards
        (in a handler that re-raises it, or in a finally): what the def swallows is a second
        cancellation during that cleanup, and the caller's task still ends cancelled."""
        calls = self.calls.get(key or "")
        return bool(calls) and all(calls)

    def _cancels_itself(self, function: cst.CSTNode) -> bool:
        """The def arranges its own cancellation: it cancels `asyncio.current_task()` through a callback, or
        hands it to a task it starts that cancels it (a watcher that cancels the handler when its client
        hangs up). Catching that cancellation is the plan, not a swallowed request from outside."""
        if id(function) not in self.current_task:
            return False
        nodes = descendants(function, (cst.FunctionDef, cst.ClassDef))
        mine = {t.target.value for n in nodes if isinstance(n, cst.Assign) and self._is_current(n.value, set())
                for t in n.targets if isinstance(t.target, cst.Name)}
        for node in nodes:
            if isinstance(node, cst.Attribute) and node.attr.value == "cancel" and self._is_current(node.value, mine):
                return True
            if isinstance(node, cst.Call) and terminal(node.func) in _TASK_MAKERS:
                started = positional(node, 0)
                if isinstance(started, cst.Call) and any(self._is_current(a.value, mine) for a in started.args):
                    if self._cancels_a_parameter(started.func):
                        return True
        return False

    def _is_current(self, expr: cst.BaseExpression, names: set[str]) -> bool:
        if isinstance(expr, cst.Name):
            return expr.value in names
        return isinstance(expr, cst.Call) and self.ctx.resolve(expr.func) in _CURRENT_TASK

    def _cancels_a_parameter(self, func: cst.BaseExpression) -> bool:
        """The coroutine function a task runs cancels one of its parameters, or is not in this file
        (then it was handed the current task for no other reason a server has)."""
        defs = [f.node for f in self.ctx.facts.by_key.get(self.ctx.key(func) or "", ())
                if isinstance(f.node, cst.FunctionDef)]
        if not defs:
            return True
        for node in defs:
            params = {p.name.value for p in (*node.params.posonly_params, *node.params.params,
                                              *node.params.kwonly_params)}
            for inner in descendants(node.body, OWN_BODY_STOP):
                if (isinstance(inner, cst.Attribute) and inner.attr.value == "cancel"
                        and isinstance(inner.value, cst.Name) and inner.value.value in params):
                    return True
        return False

    def _awaits(self, body: cst.BaseSuite, function: int) -> bool:
        """The try body can be cancelled: it awaits something other than tasks this function cancelled."""
        cancelled = self.cancelled.get(function, set())
        for node in descendants(body, OWN_BODY_STOP):
            if isinstance(node, cst.For | cst.With) and node.asynchronous is not None:
                return True
            if isinstance(node, cst.Await) and not (self._awaited(node.expression) & cancelled):
                return True
        return False

    def _awaited(self, expr: cst.BaseExpression) -> set[str]:
        """The tasks an await waits on, when it waits on task objects rather than a fresh coroutine."""
        if isinstance(expr, cst.Call) and self.ctx.resolve(expr.func) in _COLLECTORS:
            parts = [a.value for a in expr.args]
            parts += [e.value for p in parts if isinstance(p, cst.List | cst.Tuple | cst.Set) for e in p.elements]
        else:
            parts = [expr]
        return {k for p in parts if isinstance(p, cst.Name | cst.Attribute) and (k := self.ctx.key(p))}


_HOW = {cst.Break: "breaks out of its loop", cst.Continue: "continues its loop", cst.Return: "returns"}


def _statements(suite: cst.BaseSuite) -> Sequence[cst.CSTNode]:
    return suite.body  # an indented block's statements, or a one-line suite's small statements


_Exit = tuple[cst.CSTNode, cst.CSTNode | None]  # a break/continue/return and the line it stands on


def _flow(block: Sequence[cst.CSTNode], loops: int) -> tuple[list[_Exit], bool]:
    """(the statements in `block` that leave the handler without raising, whether its end is reachable).

    `loops` counts the loops entered inside the handler: a break or continue there stays inside it.
    """
    exits: list[_Exit] = []
    for statement in block:
        found, reachable = _step(statement, loops)
        exits.extend(found)
        if not reachable:
            return exits, False
    return exits, True


def _step(node: cst.CSTNode, loops: int) -> tuple[list[_Exit], bool]:
    if isinstance(node, cst.SimpleStatementLine):
        exits, reachable = _flow(node.body, loops)
        return [(exit, node) for exit, _ in exits], reachable
    if isinstance(node, cst.Raise):
        return [], False
    if isinstance(node, cst.Return):
        return [(node, None)], False
    if isinstance(node, cst.Break | cst.Continue):
        return ([(node, None)] if loops == 0 else []), False
    if isinstance(node, cst.If):
        exits, reachable = _flow(_statements(node.body), loops)
        if node.orelse is None:
            return exits, True
        if isinstance(node.orelse, cst.If):
            more, other = _step(node.orelse, loops)
        else:
            more, other = _flow(_statements(node.orelse.body), loops)
        return exits + more, reachable or other
    if isinstance(node, cst.For | cst.While):
        exits, _ = _flow(_statements(node.body), loops + 1)
        if node.orelse is not None:
            exits += _flow(_statements(node.orelse.body), loops)[0]
        endless = isinstance(node, cst.While) and _always_true(node.test) and not _breaks(node.body)
        return exits, not endless
    if isinstance(node, cst.With):
        return _flow(_statements(node.body), loops)
    if isinstance(node, cst.Try | cst.TryStar):
        exits, reachable = _flow(_statements(node.body), loops)
        if node.orelse is not None and reachable:
            more, reachable = _flow(_statements(node.orelse.body), loops)
            exits += more
        for handler in node.handlers:
            more, caught = _flow(_statements(handler.body), loops)
            exits += more
            reachable = reachable or caught
        if node.finalbody is not None:
            more, finishes = _flow(_statements(node.finalbody.body), loops)
            exits += more
            reachable = reachable and finishes
        return exits, reachable
    if isinstance(node, cst.Match):
        exits = [e for case in node.cases for e in _flow(_statements(case.body), loops)[0]]
        return exits, True
    return [], True


def _always_true(test: cst.BaseExpression) -> bool:
    if isinstance(test, cst.Integer):
        return test.value != "0"
    return isinstance(test, cst.Name) and test.value == "True"


def _breaks(body: cst.BaseSuite) -> bool:
    """A `break` of this loop (not of a loop nested in it)."""
    return any(isinstance(n, cst.Break) for n in descendants(body, (cst.For, cst.While, *OWN_BODY_STOP)))


def _always_raises(handler: cst.ExceptHandler) -> bool:
    """Every way out of the handler is a `raise`."""
    exits, falls_off = _flow(_statements(handler.body), 0)
    return not exits and not falls_off


def _returns_at(statement: cst.CSTNode) -> bool:
    """`return await f()`: the caller ends where it awaits."""
    return isinstance(statement, cst.SimpleStatementLine) and any(
        isinstance(s, cst.Return | cst.Raise) for s in statement.body)


def _is_generator(function: cst.CSTNode) -> bool:
    return any(isinstance(n, cst.Yield) for n in descendants(function, OWN_BODY_STOP))


def _records_cancellation(handler: cst.ExceptHandler) -> bool:
    """The handler stores the cancellation as the job's outcome: `run.status = "cancelled"`,
    `task.status = Status.CANCELLED` (an attribute or item set to a value that names it)."""
    for node in descendants(handler.body, OWN_BODY_STOP):
        if isinstance(node, cst.Assign):
            targets = [t.target for t in node.targets]
        elif isinstance(node, cst.AnnAssign):
            targets = [node.target]
        else:
            continue
        if node.value is None or not any(isinstance(t, cst.Attribute | cst.Subscript) for t in targets):
            continue
        value = node.value
        text = value.evaluated_value if isinstance(value, cst.SimpleString) else dotted(value)
        if isinstance(text, str) and "cancel" in text.lower():
            return True
    return False


def _consults_cancellation_state(handler: cst.ExceptHandler) -> bool:
    """The handler asks whether the cancellation is its own (`cancelling()`) or consumes it (`uncancel()`)."""
    for node in descendants(handler.body, OWN_BODY_STOP):
        name = (node.attr.value if isinstance(node, cst.Attribute) else node.value if isinstance(node, cst.Name)
                else node.evaluated_value if isinstance(node, cst.SimpleString) else None)
        if name in ("cancelling", "uncancel"):
            return True
    return False


def _assigned(handler: cst.ExceptHandler) -> list[cst.BaseExpression]:
    targets: list[cst.BaseExpression] = []
    for node in descendants(handler.body, OWN_BODY_STOP):
        if isinstance(node, cst.Assign):
            targets.extend(t.target for t in node.targets)
        elif isinstance(node, cst.AugAssign | cst.AnnAssign):
            targets.append(node.target)
    return [t for t in targets if isinstance(t, cst.Name | cst.Attribute)]


def _text(kind: cst.BaseExpression) -> str:
    if isinstance(kind, cst.Tuple):
        return "(" + ", ".join(dotted(e.value) or "..." for e in kind.elements) + ")"
    return dotted(kind) or "..."
