from __future__ import annotations

import libcst as cst

from mlx_invariants.checker.facts import CallSite, FunctionFacts
from mlx_invariants.checker.names import dotted, terminal
from mlx_invariants.checker.offload import POOLS, THREAD_POOLS, handed_target, handoff
from mlx_invariants.checker.rule import Invalid, Rule, Valid

# The loop's own objects, by constructor, and the methods that complete a waiter's future (or wake one) when called.
_QUEUES = frozenset({"asyncio.Queue", "asyncio.LifoQueue", "asyncio.PriorityQueue", "asyncio.queues.Queue",
                     "asyncio.queues.LifoQueue", "asyncio.queues.PriorityQueue"})
_EVENTS = frozenset({"asyncio.Event", "asyncio.locks.Event"})
_FUTURES = frozenset({"asyncio.Future", "asyncio.futures.Future"})
_LOOPS = frozenset({"asyncio.get_running_loop", "asyncio.get_event_loop", "asyncio.events.get_running_loop",
                    "asyncio.events.get_event_loop"})
_WAKERS = {"queue": frozenset({"put_nowait", "get_nowait"}), "event": frozenset({"set"}),
           "future": frozenset({"set_result", "set_exception"}),
           "loop": frozenset({"call_soon", "create_task", "call_later", "call_at"})}
_KIND_NAMES = {"queue": "an `asyncio.Queue`, which belongs to the event loop and is not thread-safe",
               "event": "an `asyncio.Event`, which belongs to the event loop and is not thread-safe",
               "future": "an asyncio future, which belongs to the event loop and is not thread-safe",
               "loop": "the event loop, of which only `call_soon_threadsafe` may be called from another thread"}
_PROCESS_POOLS = POOLS - THREAD_POOLS


def _kind_of_constructor(call: cst.BaseExpression, qual: str | None) -> str | None:
    if qual in _QUEUES:
        return "queue"
    if qual in _EVENTS:
        return "event"
    if qual in _FUTURES or (isinstance(call, cst.Call) and terminal(call.func) == "create_future"):
        return "future"
    if qual in _LOOPS:
        return "loop"
    return None


class LoopObjectUsedOffLoop(Rule):
    """An `asyncio.Queue`, `asyncio.Event` or future belongs to the event loop that waits on it,
    and none of them is thread-safe: `put_nowait`, `set` and `set_result` complete the waiting
    coroutine's future with `loop.call_soon`, which from another thread neither takes the loop's
    lock nor wakes its selector. A token pushed by a worker thread sits in the queue until some
    other event happens to wake the loop (a stream stalls, then delivers in bursts; with an idle
    loop it waits for the next request), and the waiter lists race with the loop's own
    `get()`. Engines meet this when the step that produces outputs moves to a worker: Rapid-MLX's
    MLLM scheduler ran `step()` on an executor, and `step()` pushed each request's outputs into
    its `asyncio.Queue` (vllm_mlx/mllm_scheduler.py@10a4c3f^:585, 611, 685), fixed in 10a4c3f by
    stepping without the queues on the worker and distributing the outputs on the loop. vllm-mlx's
    own scheduler, which Rapid-MLX forked, had the same lines (mllm_scheduler.py@99a5d5c:691); vmlx,
    moving the same scheduler's step to a thread (d191923), moved the pushes to the loop in the
    same commit for that reason. The loop itself is the same: of its methods only
    `call_soon_threadsafe` may be called from another thread; `call_soon`, `create_task` and
    `call_later` from a worker queue work the loop may never wake for.

    Judged: a call of `put_nowait`/`get_nowait` on an `asyncio.Queue`, `set` on an
    `asyncio.Event`, `set_result`/`set_exception` on an asyncio future (`asyncio.Future()`,
    `loop.create_future()`), or `call_soon`/`create_task`/`call_later`/`call_at` on a loop kept
    from `asyncio.get_running_loop()` (or `get_event_loop()`), made by a callable this file hands to another thread
    (`asyncio.to_thread`, `run_in_executor`, an executor's `submit`, `Thread(target=...)`, a
    helper that forwards its callable to one of those) or by the file's sync defs it calls. The
    object is known by what the file assigns: an attribute or module-level name built by one of
    those constructors, or an item of a dict or list whose items are (`self.queues[rid] =
    asyncio.Queue()`, or an annotation `dict[str, asyncio.Queue]`), read back with `[...]` or
    `.get(...)`. Reported at the call.

    Not judged: a call handed to the loop (`loop.call_soon_threadsafe(q.put_nowait, item)`,
    `asyncio.run_coroutine_threadsafe`), an object the thread-side function builds itself (it
    belongs to that thread's own loop, if any), a process pool's work, coroutines the thread
    calls (calling one only makes a coroutine), and an object passed in as a parameter."""

    id = "INV133"
    catches = ("an asyncio.Queue/Event/future completed, or the loop asked to run a callback, from a worker thread "
               "instead of through call_soon_threadsafe")
    message = (
        "`{call}` runs on a worker thread ({how}), but `{receiver}` is {kind}: the callback is queued with "
        "`loop.call_soon` from the wrong thread, so the loop may not see it until another event wakes it, and its "
        "queues race with the loop's own"
    )
    remedy = ("hand it over with `loop.call_soon_threadsafe({method_ref}, ...)`, or return the result and complete it "
              "on the loop")
    loop_remedy = ("call `{receiver}.call_soon_threadsafe(...)` instead (`asyncio.run_coroutine_threadsafe(coro, "
                   "{receiver})` for a coroutine)")
    known_problems = (
        "Only objects this file builds and keeps (on `self`, at module level, in a dict or list it fills) are "
        "followed: a queue handed to the worker as an argument, or built in another module, is not. A callable "
        "that runs on the loop as well as on a worker (a step run inline when idle, on an executor otherwise) is "
        "reported for its worker runs. A worker thread that runs its own event loop and owns the object is not "
        "told apart from one that does not."
    )
    triggers = (("put_nowait", "get_nowait", ".set(", "set_result", "set_exception", "call_soon(", "create_task",
                 "call_later", "call_at"),
                ("to_thread", "run_in_executor", "submit", "Thread", "run_sync"), ("asyncio",))

    INVALID = [
        # An engine's step, moved to an executor, still pushes each request's output into its asyncio queue.
        Invalid('''
            import asyncio
            from concurrent.futures import ThreadPoolExecutor

            class Scheduler:
                def __init__(self, engine):
                    self.engine = engine
                    self.output_queues: dict[str, asyncio.Queue] = {}
                    self._executor = ThreadPoolExecutor(max_workers=1)

                def add_request(self, request_id):
                    self.output_queues[request_id] = asyncio.Queue()

                def step(self):
                    for request_id, token in self.engine.step():
                        queue = self.output_queues.get(request_id)
                        if queue is not None:
                            queue.put_nowait(token)  # expect: INV133

                async def run(self):
                    loop = asyncio.get_running_loop()
                    while True:
                        await loop.run_in_executor(self._executor, self.step)
        '''),
        # A reader thread that signals the loop's event and completes the loop's future directly.
        Invalid('''
            import asyncio
            import threading

            class Loader:
                def __init__(self):
                    self.ready = asyncio.Event()

                def _load(self, path, done):
                    self.model = load(path)
                    self.ready.set()  # expect: INV133

                async def start(self, path):
                    loop = asyncio.get_running_loop()
                    self.done = loop.create_future()
                    threading.Thread(target=self._load, args=(path, self.done), daemon=True).start()
                    await self.ready.wait()
        '''),
        # A loop kept at start-up, asked to run a callback from a worker thread.
        Invalid('''
            import asyncio

            class Notifier:
                async def start(self):
                    self._loop = asyncio.get_running_loop()

                def _encode(self, text, done):
                    audio = synthesize(text)
                    self._loop.call_soon(done, audio)  # expect: INV133

                async def speak(self, text, done):
                    await asyncio.to_thread(self._encode, text, done)
        '''),
    ]
    VALID = [
        # The outputs go back to the loop through call_soon_threadsafe.
        Valid('''
            import asyncio
            from concurrent.futures import ThreadPoolExecutor

            class Scheduler:
                def __init__(self, engine):
                    self.engine = engine
                    self.output_queues: dict[str, asyncio.Queue] = {}
                    self._executor = ThreadPoolExecutor(max_workers=1)
                    self._loop = None

                def add_request(self, request_id):
                    self.output_queues[request_id] = asyncio.Queue()

                def step(self):
                    for request_id, token in self.engine.step():
                        queue = self.output_queues.get(request_id)
                        if queue is not None:
                            self._loop.call_soon_threadsafe(queue.put_nowait, token)

                async def run(self):
                    self._loop = asyncio.get_running_loop()
                    while True:
                        await self._loop.run_in_executor(self._executor, self.step)
        '''),
        # The step returns its outputs, and the loop distributes them.
        Valid('''
            import asyncio
            from concurrent.futures import ThreadPoolExecutor

            class Scheduler:
                def __init__(self, engine):
                    self.engine = engine
                    self.output_queues: dict[str, asyncio.Queue] = {}
                    self._executor = ThreadPoolExecutor(max_workers=1)

                def step(self):
                    return list(self.engine.step())

                def distribute(self, outputs):
                    for request_id, token in outputs:
                        self.output_queues[request_id].put_nowait(token)

                async def run(self):
                    loop = asyncio.get_running_loop()
                    while True:
                        outputs = await loop.run_in_executor(self._executor, self.step)
                        self.distribute(outputs)
        '''),
        # A thread-safe queue.Queue between the threads.
        Valid('''
            import asyncio
            import queue
            import threading

            class Worker:
                def __init__(self):
                    self.outputs = queue.Queue()

                def _run(self, prompt):
                    for token in generate(prompt):
                        self.outputs.put_nowait(token)

                async def start(self, prompt):
                    threading.Thread(target=self._run, args=(prompt,), daemon=True).start()
        '''),
        # Work sent to another process: it gets a copy, not the loop's queue (and a queue does not pickle).
        Valid('''
            import asyncio
            from concurrent.futures import ProcessPoolExecutor

            class Scheduler:
                def __init__(self):
                    self.done = asyncio.Event()
                    self._pool = ProcessPoolExecutor(max_workers=2)

                def work(self, item):
                    self.done.set()

                async def run(self, item):
                    loop = asyncio.get_running_loop()
                    await loop.run_in_executor(self._pool, self.work, item)
        '''),
        # A thread that runs its own event loop with its own queue.
        Valid('''
            import asyncio
            import threading

            def serve_forever(jobs):
                loop = asyncio.new_event_loop()
                inbox = asyncio.Queue()
                for job in jobs:
                    inbox.put_nowait(job)
                loop.run_until_complete(drain(inbox))

            async def start(jobs):
                await asyncio.to_thread(serve_forever, jobs)
        '''),
    ]

    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        self.containers: dict[str, str] = {}  # key of a dict/list attribute -> the kind of loop object its items are

    def visit_Assign(self, node: cst.Assign) -> None:
        value = node.value
        kind = _kind_of_constructor(value, self.ctx.call_qual(value) if isinstance(value, cst.Call) else None)
        if kind is None:
            return
        for target in node.targets:
            if isinstance(target.target, cst.Subscript):
                key = self.ctx.key(target.target.value)
                if key is not None:
                    self.containers[key] = kind

    def visit_Call(self, node: cst.Call) -> None:
        """Pin, for end(): the container of `C[k].put_nowait(...)` (the walk keys only the receiver, `C[k]`), and
        each `self.method` argument, which a hand-off (or a helper forwarding to one) may run on a thread."""
        if isinstance(node.func, cst.Attribute) and isinstance(node.func.value, cst.Subscript):
            self.ctx.key(node.func.value.value)
        for arg in node.args:
            if isinstance(arg.value, cst.Attribute):
                self.ctx.key(arg.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        """`self.queues: dict[str, asyncio.Queue] = {}`: a container of loop objects, by its annotation."""
        annotation = node.annotation.annotation
        if not isinstance(annotation, cst.Subscript):
            return
        for element in annotation.slice:
            index = element.slice
            if isinstance(index, cst.Index):
                kind = _kind_of_constructor(index.value, self.ctx.resolve(index.value))
                key = self.ctx.key(node.target)
                if kind is not None and key is not None:
                    self.containers[key] = kind

    def end(self) -> None:
        reported: set[int] = set()
        for function in list(self.ctx.facts.functions.values()):
            for site in function.calls:
                target = handed_target(site, self.ctx)
                if target is None or self._to_process(site):
                    continue
                how = f"handed to `{dotted(site.node.func) or 'a thread'}`"
                for start in self._functions(target):
                    for reached, touch, receiver, kind in self._touches(start):
                        if id(touch.node) in reported:
                            continue
                        reported.add(id(touch.node))
                        method = terminal(touch.node.func) or ""
                        call = f"`{dotted(touch.node.func)}(...)`"
                        # One finding per thread-side callable: its other calls are named in it (analysis.py).
                        self.ctx.report_at(self.id, touch.node, None, self.message.format(
                            call=call[1:-1], how=self._how(start, reached, how), receiver=dotted(receiver),
                            kind=_KIND_NAMES[kind]), group=id(start.node), mention=call,
                            remedy=(self.loop_remedy if kind == "loop" else self.remedy).format(
                                method_ref=f"{dotted(receiver)}.{method}", receiver=dotted(receiver)))

    def _to_process(self, site: CallSite) -> bool:
        work = handoff(site.node, self.ctx)
        executor = work.executor if work is not None else None
        return executor is not None and bool(self.ctx.facts.constructed_by(self.ctx.key(executor)) & _PROCESS_POOLS)

    def _functions(self, target: cst.BaseExpression) -> list[FunctionFacts]:
        if isinstance(target, cst.Lambda):
            facts = self.ctx.function_facts(target)
            return [facts] if facts is not None else []
        if isinstance(target, cst.Name | cst.Attribute):
            return [f for f in self.ctx.facts.by_key.get(self.ctx.key(target) or "", ())
                    if not (isinstance(f.node, cst.FunctionDef) and f.node.asynchronous is not None)]
        return []

    def _how(self, start: FunctionFacts, reached: FunctionFacts, how: str) -> str:
        name = lambda f: f.node.name.value if isinstance(f.node, cst.FunctionDef) else "a lambda"  # noqa: E731
        if start is reached:
            return f"`{name(start)}`, {how}"
        return f"in `{name(reached)}`, which `{name(start)}` calls, {how}"

    def _touches(self, start: FunctionFacts) -> list[tuple[FunctionFacts, CallSite, cst.BaseExpression, str]]:
        """Each call `start` makes, or the file's sync defs it calls make, that completes a loop object (a
        coroutine it calls only makes a coroutine)."""
        found = []
        for current, site in self.ctx.facts.reached_calls(start, into_async=False):
            func = site.node.func
            if isinstance(func, cst.Attribute):
                kind = self._loop_object(func.value, current)
                if kind is not None and func.attr.value in _WAKERS[kind]:
                    found.append((current, site, func.value, kind))
        return found

    def _loop_object(self, expr: cst.BaseExpression, function: FunctionFacts) -> str | None:
        """The kind of loop object `expr` is, as this file builds and keeps them; None if not known to be one."""
        container = self._container_item(expr)
        if container is not None:
            return container
        key = self.ctx.key(expr)
        if key is None:
            return None
        if isinstance(expr, cst.Name):
            assigned = self.ctx.facts.assigned_in(key, id(function.node))
            kinds = {self._container_item(a.value) for a in assigned}
            if assigned and all(a.scope != id(function.node) for a in assigned):  # a module-level name
                kinds = {_kind_of_constructor(a.value, a.call_qual) for a in assigned}
            return kinds.pop() if len(kinds) == 1 else None
        kinds = {_kind_of_constructor(a.value, a.call_qual) for a in self.ctx.facts.assigned.get(key, ())}
        return kinds.pop() if len(kinds) == 1 else None

    def _container_item(self, expr: cst.BaseExpression) -> str | None:
        """`C[k]` or `C.get(k)` of a container this file fills with loop objects."""
        if isinstance(expr, cst.Subscript):
            return self.containers.get(self.ctx.key(expr.value) or "")
        if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value == "get":
            return self.containers.get(self.ctx.key(expr.func.value) or "")
        return None
