from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from mlx_invariants.checker import mlx_api
from mlx_invariants.checker.facts import CallSite, FunctionFacts
from mlx_invariants.checker.names import dotted, terminal
from mlx_invariants.checker.offload import (
    HANDOFF_NAMES, Handoff, forwarded_handoff, handoff, only_makes_generator, positional, unwrap_callable,
)
from mlx_invariants.checker.rule import Invalid, Rule, Valid
from mlx_invariants.checker.walker import OWN_BODY_STOP, descendants

# A loop body that reads a name with one of these parts looks at a stop signal.
_STOP_WORDS = ("cancel", "abort", "stop", "interrupt", "disconnect", "is_set", "shutdown", "should_")
# `asyncio.get_running_loop()` raises off the loop's thread: a sync def that calls it runs on the loop.
_RUNNING_LOOP = frozenset({"asyncio.get_running_loop", "asyncio.events.get_running_loop"})
# Thread-safe queues: a thread that takes callables from one and calls them is a worker, and
# `put`/`put_nowait` of a callable on it a hand-off (an asyncio.Queue's consumer is on the loop).
_THREAD_QUEUES = frozenset({"queue.Queue", "queue.SimpleQueue", "queue.LifoQueue", "queue.PriorityQueue"})
_TAKES = frozenset({"get", "get_nowait"})
_PUTS = frozenset({"put", "put_nowait"})
# A call in a worker's loop that hands each item to the event loop: the loop streams to a coroutine.
_POSTS = frozenset({"call_soon_threadsafe", "run_coroutine_threadsafe"})
_THREADS = frozenset({"threading.Thread"})
# MLX work that makes no token: a batch generator admitting, evicting or closing requests, and a
# model's weights written out. A loop of these (or of `mx.eval`) walks a fixed collection and ends.
_NO_TOKEN = frozenset({"insert", "insert_segments", "extract_cache", "remove", "close", "prefill",
                       *mlx_api.MODEL_WEIGHT_SAVES})


@dataclass
class _Loop:
    node: cst.For
    statement: cst.CSTNode | None


class WorkerLoopIgnoresCancel(Rule):
    """Cancelling a coroutine does not stop the thread it handed work to. When the
    work is a decode loop (one model step per token, up to max_tokens), a client
    that disconnects, or a request that times out, leaves the worker generating
    every remaining token: the GPU, the generation lock and the memory stay taken
    for a request nobody waits for, and the next request queues behind it. The
    loop has to look at a stop signal each step (an Event the awaiting coroutine
    sets from its CancelledError handler, or a cancel callback), and the handoff
    has to say how to set it. vllm-mlx's SpecPrefill path handed `_run_all` to
    the serialized worker with decode loops that never checked anything
    (engine/simple.py@38999c8:773 and :806), fixed in 122213b with a cancel event
    checked every step and an `on_cancel` hook on the handoff.

    The same holds for any loop a worker runs to stream items to a coroutine, one
    `call_soon_threadsafe` per item, whatever produces them, and for work handed
    over through a thread's work queue (a `queue.Queue` whose thread takes
    callables off it and calls them): mlx-openai-server's inference worker drained
    a whole generator into the loop's queue for a client that had gone
    (app/core/inference_worker.py@27f1bca:124, the corpus's OAI1), fixed in a23b2e1 with an
    Event the stream reader sets in its `finally` and the loop checks per item.

    A coroutine that starts a `threading.Thread` of its own for a def nested in it
    hands that def over as surely: the bridge from a sync generator to an async one
    (a thread that iterates the generation and posts each item to the loop) goes on
    after its reader stops, blocked on a full queue or generating to max_tokens.
    olmlx's `async_mlx_stream` did so (mlx_ollama/utils/streaming.py@76adf2b:64, the
    corpus's OLX-BRIDGE), fixed in 638b82f with a cancel Event the loop checks per
    token; mlx-manager's `stream_from_metal_thread` (mlx_server/utils/metal.py@b1682f9:92)
    starts one such thread per request and checks nothing either.

    A loop that does MLX work is not thereby a decode loop: a loader evaluating the
    parameters of its model and drafter (mlx-omnia runtime/admission.py@b7a60d8:89), or a
    scheduler step removing the requests aborted since the last one from its batch (vmlx
    mllm_scheduler.py@3e256e3:2185), ends with the collection it walks. And a coroutine
    that hands work over from inside a `while` loop is an engine loop driving a scheduler
    tick by tick (Rapid-MLX engine_core.py@7222ca7:627, up to four steps a dispatch): it
    serves many requests, so no client's cancel reaches it; it gets control back after
    each tick, and a request that goes is aborted in the scheduler between ticks."""

    id = "INV121"
    catches = "a decode loop handed to a worker thread from async code that never checks for cancellation"
    message = (
        "this loop generates on a worker thread ({how} in `{coroutine}`) and checks no stop signal: once "
        "`{coroutine}`'s caller is cancelled or stops reading, it goes on generating every remaining token; "
        "test a cancel Event each step and set it when the caller is cancelled or its stream is closed "
        "(or pass a cancel hook)"
    )
    known_problems = (
        "A `for` over a collection handed in (`for doc in documents`, `enumerate(batch)`) whose steps feed "
        "nothing from one to the next is scoring or embedding, and ends with its items: not judged, though a "
        "long list handed to it runs on after a cancel all the same. "
        "A decode loop is a `for` over an MLX generator (stream_generate, a model's stream_chat) or any `for` "
        "whose body runs a generation step (calls the model, a generation, a batch generator's or scheduler's "
        "step; `mx.eval`, a batch generator's insert/remove/close and saving weights make no token) or hands "
        "each item to the event loop (`call_soon_threadsafe`, `run_coroutine_threadsafe`), in the handed-over "
        "callable or a def of this file it calls. A hand-off "
        "is `to_thread`, `run_in_executor`, an executor's `submit`, a helper forwarding to one, or `put` / "
        "`put_nowait` on a `queue.Queue` that some def of this file takes items from and calls (a worker's "
        "queue of callables), made in an async def or in a sync def that calls `asyncio.get_running_loop()` "
        "(so runs on the loop). A "
        "stop check is any name in the loop body containing cancel, abort, stop, interrupt, disconnect, "
        "is_set, shutdown or should_; a handoff passing a keyword named like one (`on_cancel=`) counts as "
        "wired. A `threading.Thread(target=f)` made in an async def is a hand-off when `f` is a lambda or a "
        "def nested in it without a `while` loop and the thread is kept on no attribute (a worker started "
        "once and kept, or one that loops for more work, is not judged). A worker fed from other sync code, "
        "or a `while` loop, is not judged; nor is a hand-off made inside a `while` loop of its def (an engine "
        "loop handing over one tick at a time), so a coroutine that loops taking requests off a queue and "
        "hands each one's whole decode over is missed. Through the package model, a worker that only coroutines "
        "cancelled by the server's shutdown alone hand over (a plain route, which a disconnect does not cancel, "
        "and what only such routes await: model/cancel.py) is not reported: nobody stops waiting for it before it "
        "ends. A task nobody keeps (`asyncio.create_task(run())` as a statement) is no such waiter, though nothing "
        "cancels it: whoever reads what it makes can leave. A worker handed over anywhere by an expression the "
        "model cannot name (a lambda) is still judged."
    )
    triggers = (("async",), ("to_thread", "run_in_executor", "submit", "run_sync", "_serialized", "blocking", ".put",
                             "Thread"))

    INVALID = [
        Invalid('''
            import asyncio
            from concurrent.futures import ThreadPoolExecutor

            class SimpleEngine:
                def __init__(self):
                    self._mlx_executor = ThreadPoolExecutor(max_workers=1)

                async def _run_serialized(self, func, *args):
                    async with self._generation_lock:
                        return await self._owner_executor_run(func, *args)

                async def _owner_executor_run(self, func, *args):
                    loop = asyncio.get_running_loop()
                    return await loop.run_in_executor(self._mlx_executor, lambda: func(*args))

                async def stream_generate(self, prompt, max_tokens):
                    def run_all():
                        results = []
                        for chunk in self._model.stream_generate(prompt, max_tokens=max_tokens):  # expect: INV121
                            results.append(chunk.text)
                        return results

                    for text in await self._run_serialized(run_all):
                        yield text
        '''),
        Invalid('''
            import asyncio
            import queue
            import threading

            class TokenPump:
                def __init__(self):
                    self._jobs = queue.Queue()
                    threading.Thread(target=self._serve, daemon=True).start()

                def _serve(self):
                    while True:
                        job = self._jobs.get()
                        job()

                def stream(self, make_tokens, prompt):
                    loop = asyncio.get_running_loop()
                    inbox = asyncio.Queue()

                    def pump():
                        for token in make_tokens(prompt):  # expect: INV121
                            loop.call_soon_threadsafe(inbox.put_nowait, token)
                        loop.call_soon_threadsafe(inbox.put_nowait, None)

                    self._jobs.put(pump)
                    return self._drain(inbox)

                async def _drain(self, inbox):
                    while (token := await inbox.get()) is not None:
                        yield token
        '''),
        Invalid('''
            import asyncio
            import threading

            import mlx_lm

            async def stream_tokens(model, tokenizer, prompt):
                loop = asyncio.get_running_loop()
                queue = asyncio.Queue(maxsize=32)

                def produce():
                    for response in mlx_lm.stream_generate(model, tokenizer, prompt=prompt):  # expect: INV121
                        asyncio.run_coroutine_threadsafe(queue.put(response.text), loop).result()
                    asyncio.run_coroutine_threadsafe(queue.put(None), loop).result()

                threading.Thread(target=produce, daemon=True).start()
                while (text := await queue.get()) is not None:
                    yield text
        '''),
        Invalid('''
            import asyncio

            from concurrent.futures import ThreadPoolExecutor

            import mlx.core as mx

            class Engine:
                def __init__(self):
                    self._mlx_executor = ThreadPoolExecutor(max_workers=1)

                async def complete(self, y, cache, max_tokens):
                    def decode(y):
                        tokens = []
                        for _ in range(max_tokens):  # expect: INV121
                            logits = self.model(y, cache=cache)
                            y = logits[:, -1, :].argmax(axis=-1)
                            mx.eval(y)
                            tokens.append(y.item())
                        return tokens

                    loop = asyncio.get_running_loop()
                    return await loop.run_in_executor(self._mlx_executor, decode, y)
        '''),
        # A task nobody keeps hands it over: nothing cancels the task, but the stream reading its queue can end (a
        # client that goes away) while it generates on (TDevViper/MLX-Serve scheduler/worker.py@326aae3:108, true).
        Invalid('''
            import asyncio

            from fastapi import FastAPI
            from fastapi.responses import StreamingResponse
            from mlx_lm import stream_generate

            app = FastAPI()


            def produce(model, tokenizer, prompt, queue, loop):
                for response in stream_generate(model, tokenizer, prompt):  # expect: INV121
                    loop.call_soon_threadsafe(queue.put_nowait, response.text)
                loop.call_soon_threadsafe(queue.put_nowait, None)


            async def run(prompt, queue):
                loop = asyncio.get_running_loop()
                await asyncio.to_thread(produce, app.state.model, app.state.tokenizer, prompt, queue, loop)


            @app.post("/v1/completions")
            async def completions(body: dict):
                queue = asyncio.Queue()
                asyncio.create_task(run(body["prompt"], queue))

                async def tokens():
                    while (text := await queue.get()) is not None:
                        yield text
                return StreamingResponse(tokens())
        ''', files={"requirements.txt": "mlx-lm>=0.31.3\n"}, options={"select": ["INV121"]}),
    ]
    VALID = [
        Valid('''
            import asyncio

            from mlx_lm import stream_generate


            class Loader:
                async def stream(self, prompt):
                    loop = asyncio.get_running_loop()

                    def tokens():
                        for response in stream_generate(self.model, self.tokenizer, prompt=prompt):
                            yield response.text

                    # The pool thread only calls a generator function: it makes the generator and runs none
                    # of its body, which runs here, where the generator is iterated.
                    for text in await loop.run_in_executor(None, lambda: iter(tokens())):
                        yield text
        '''),
        # A loop that breaks after its first step (a warm-up's one token) has nothing left to run after a cancel.
        Valid('''
            import asyncio
            from mlx_lm import stream_generate

            def _warm(model, tokenizer):
                for _ in stream_generate(model, tokenizer, "hi", max_tokens=1):
                    break

            async def warmup(model, tokenizer):
                await asyncio.to_thread(_warm, model, tokenizer)
        ''', files={"requirements.txt": "mlx-lm>=0.31.3\n"}),  # any thread may generate there (INV107)
        # Scoring each document it was handed on its own ends with the documents: no token feeds the next
        # step (mlx-serve's rerank, issue 23's set b: graded arguable twice).
        Valid('''
            import asyncio
            from concurrent.futures import ThreadPoolExecutor
            import mlx.core as mx

            MLX_THREAD = ThreadPoolExecutor(max_workers=1)

            async def rerank(model, tokenizer, query, documents):
                def compute():
                    scores = []
                    for doc in documents:
                        tokens = mx.array([tokenizer.encode(query + doc)])
                        logits = model(tokens)
                        scores.append(float(mx.softmax(logits[0, -1])[1]))
                    return scores
                return await asyncio.get_running_loop().run_in_executor(MLX_THREAD, compute)
        '''),
        Valid('''
            import asyncio
            from concurrent.futures import ThreadPoolExecutor
            import threading

            class SimpleEngine:
                def __init__(self):
                    self._mlx_executor = ThreadPoolExecutor(max_workers=1)

                async def _run_serialized(self, func, *args, on_cancel=None):
                    async with self._generation_lock:
                        return await self._owner_executor_run(func, *args)

                async def _owner_executor_run(self, func, *args):
                    loop = asyncio.get_running_loop()
                    return await loop.run_in_executor(self._mlx_executor, lambda: func(*args))

                async def stream_generate(self, prompt, max_tokens):
                    cancel_requested = threading.Event()

                    def run_all():
                        results = []
                        for chunk in self._model.stream_generate(prompt, max_tokens=max_tokens):
                            if cancel_requested.is_set():
                                break
                            results.append(chunk.text)
                        return results

                    for text in await self._run_serialized(run_all, on_cancel=cancel_requested.set):
                        yield text
        '''),
        Valid('''
            import asyncio
            from concurrent.futures import ThreadPoolExecutor

            class SimpleEngine:
                def __init__(self):
                    self._mlx_executor = ThreadPoolExecutor(max_workers=1)

                async def _run_serialized(self, func, *args, on_cancel=None):
                    loop = asyncio.get_running_loop()
                    return await loop.run_in_executor(self._mlx_executor, lambda: func(*args))

                async def stream_generate(self, prompt, max_tokens, progress):
                    def run_all():
                        results = []
                        for chunk in self._model.stream_generate(prompt, max_tokens=max_tokens, progress=progress):
                            results.append(chunk.text)
                        return results

                    for text in await self._run_serialized(run_all, on_cancel=progress.halt):
                        yield text
        '''),
        Valid('''
            import asyncio
            import queue
            import threading

            class TokenPump:
                def __init__(self):
                    self._jobs = queue.Queue()
                    threading.Thread(target=self._serve, daemon=True).start()

                def _serve(self):
                    while True:
                        job = self._jobs.get()
                        job()

                def stream(self, make_tokens, prompt):
                    loop = asyncio.get_running_loop()
                    inbox = asyncio.Queue()
                    reader_gone = threading.Event()

                    def pump():
                        for token in make_tokens(prompt):
                            if reader_gone.is_set():
                                break
                            loop.call_soon_threadsafe(inbox.put_nowait, token)
                        loop.call_soon_threadsafe(inbox.put_nowait, None)

                    self._jobs.put(pump)
                    return self._drain(inbox, reader_gone)

                async def _drain(self, inbox, reader_gone):
                    try:
                        while (token := await inbox.get()) is not None:
                            yield token
                    finally:
                        reader_gone.set()
        '''),
        Valid('''
            import asyncio
            import threading

            import mlx_lm

            async def stream_tokens(model, tokenizer, prompt):
                loop = asyncio.get_running_loop()
                queue = asyncio.Queue(maxsize=32)
                reader_gone = threading.Event()

                def produce():
                    for response in mlx_lm.stream_generate(model, tokenizer, prompt=prompt):
                        if reader_gone.is_set():
                            break
                        asyncio.run_coroutine_threadsafe(queue.put(response.text), loop).result()
                    asyncio.run_coroutine_threadsafe(queue.put(None), loop).result()

                threading.Thread(target=produce, daemon=True).start()
                try:
                    while (text := await queue.get()) is not None:
                        yield text
                finally:
                    reader_gone.set()
        '''),
        Valid('''
            import asyncio
            import queue
            import threading

            import mlx_lm

            class Engine:
                async def start(self):
                    loop = asyncio.get_running_loop()
                    self._requests = queue.Queue()

                    def serve():
                        while True:
                            prompt, inbox = self._requests.get()
                            for response in mlx_lm.stream_generate(self.model, self.tokenizer, prompt=prompt):
                                loop.call_soon_threadsafe(inbox.put_nowait, response.text)

                    self._worker = threading.Thread(target=serve, daemon=True)
                    self._worker.start()
        '''),
        Valid('''
            import asyncio

            import mlx.core as mx

            class Loader:
                async def load(self, model_id):
                    return await asyncio.get_running_loop().run_in_executor(self._load_thread, self._read, model_id)

                def _read(self, model_id):
                    model = self._loader(model_id)
                    for tree in (model, model.drafter):
                        mx.eval(tree.parameters())
                    return model
        '''),
        Valid('''
            import asyncio

            class EngineCore:
                async def _engine_loop(self):
                    loop = asyncio.get_running_loop()
                    while self._running:
                        if not self.scheduler.has_requests():
                            await asyncio.sleep(0.01)
                            continue
                        outputs = await loop.run_in_executor(self._executor, self._step_coalesced, 4)
                        self._dispatch(outputs)

                def _step_coalesced(self, max_steps):
                    for request_id in self._take_aborts():
                        self.batch_generator.remove([self.uids.pop(request_id)])
                    outputs = []
                    for _ in range(max_steps):
                        outputs.append(self.scheduler.step())
                    return outputs
        '''),
        # Only a plain route hands it over, and a client that goes away does not cancel one: the route waits for the
        # whole answer either way (issue 23, sets a and k: a non-streaming path's decode, graded arguable blind).
        Valid('''
            import asyncio

            from fastapi import FastAPI
            from mlx_lm import stream_generate

            app = FastAPI()


            def complete(model, tokenizer, prompt):
                text = ""
                for response in stream_generate(model, tokenizer, prompt):
                    text += response.text
                return text


            @app.post("/v1/completions")
            async def completions(body: dict):
                return {"text": await asyncio.to_thread(complete, app.state.model, app.state.tokenizer, body["prompt"])}
        ''', files={"requirements.txt": "mlx-lm>=0.31.3\n"}),  # any thread may generate there (INV107)
    ]

    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        self.loops: dict[int, list[_Loop]] = {}
        self.awaited: set[int] = set()
        # Calls that may hand work over: coroutine (or loop-side def) name, node id, and whether it is async.
        self.handoffs: list[tuple[cst.Call, str, int, bool]] = []
        self.parents: dict[int, int] = {}  # def or lambda -> the def it is nested in
        self.on_loop: set[int] = set()  # sync defs that call asyncio.get_running_loop()
        self.taken: dict[tuple[int, str], str] = {}  # (def, name) -> the queue key `name = queue.get()` reads
        self.called: set[tuple[int, str]] = set()  # (def, name) of each `name(...)`
        self.kept: set[int] = set()  # `threading.Thread(...)` calls assigned to an attribute or an item
        self.whiles: dict[int, int] = {}  # def -> how many `while` loops of its own the walk is in
        self.ticks: set[int] = set()  # calls made inside a `while` loop of their def

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.parents[id(node)] = id(self.ctx.scope.top.node)

    def visit_Lambda(self, node: cst.Lambda) -> None:
        self.parents[id(node)] = id(self.ctx.scope.top.node)

    def visit_While(self, node: cst.While) -> None:
        frame = id(self.ctx.scope.top.node)
        self.whiles[frame] = self.whiles.get(frame, 0) + 1

    def leave_While(self, node: cst.While) -> None:
        self.whiles[id(self.ctx.scope.top.node)] -= 1

    def visit_Await(self, node: cst.Await) -> None:
        self.awaited.add(id(node.expression))

    def visit_For(self, node: cst.For) -> None:
        if node.asynchronous is None:
            self.ctx.pin(node.iter)
            self.loops.setdefault(id(self.ctx.scope.top.node), []).append(_Loop(node, self.ctx.statement))

    def visit_Assign(self, node: cst.Assign) -> None:
        value = node.value
        if isinstance(value, cst.Call) and not all(isinstance(t.target, cst.Name) for t in node.targets):
            self.kept.add(id(value))
        if (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value in _TAKES
                and len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name)):
            key = self.ctx.key(value.func.value)
            if key:
                self.taken[id(self.ctx.scope.top.node), node.targets[0].target.value] = key

    def visit_Call(self, node: cst.Call) -> None:
        frame = self.ctx.scope.top
        if isinstance(node.func, cst.Name):
            self.called.add((id(frame.node), node.func.value))
        if self.ctx.resolve(node.func) in _RUNNING_LOOP:
            self.on_loop.add(id(frame.node))
        if self.ctx.in_async or isinstance(frame.node, cst.FunctionDef):
            self.handoffs.append((node, frame.name, id(frame.node), self.ctx.in_async))
            if self.whiles.get(id(frame.node)):
                self.ticks.add(id(node))
            for arg in node.args:
                if isinstance(arg.value, cst.Name | cst.Attribute):
                    self.ctx.pin(arg.value)

    def end(self) -> None:
        reported: set[int] = set()
        work_queues = self._work_queues()
        for call, coroutine, where, in_async in self.handoffs:
            if (not in_async and where not in self.on_loop) or id(call) in self.ticks:
                continue  # off the loop, or one tick of an engine loop (the class docstring)
            work = self._handoff(call, work_queues) or (self._per_call_thread(call, where) if in_async else None)
            if work is None or _wired(call):
                continue
            target = unwrap_callable(work.target, self.ctx)
            if target is None or only_makes_generator(target, self.ctx):
                continue  # the thread makes the generator; its loop runs where the generator is iterated
            how = f"handed over by `{dotted(call.func) or work.how}`"
            for loop in self._decode_loops(self._closure(target, where)):
                if id(loop.node) not in reported:
                    reported.add(id(loop.node))
                    message = self.message.format(how=how, coroutine=coroutine)
                    self.ctx.report_at(self.id, loop.node, loop.statement, message)

    def _handoff(self, call: cst.Call, work_queues: set[str]) -> Handoff | None:
        if terminal(call.func) in HANDOFF_NAMES:
            return handoff(call, self.ctx)
        func = call.func
        if isinstance(func, cst.Attribute) and func.attr.value in _PUTS and self.ctx.key(func.value) in work_queues:
            return Handoff(call, "a work queue", positional(call, 0), None)
        return forwarded_handoff(call, self.ctx)

    def _per_call_thread(self, call: cst.Call, where: int) -> Handoff | None:
        """`threading.Thread(target=f)` made in a coroutine for a def nested in it (or a lambda), the
        thread kept on no object: a new thread for each call, as a bridge from a sync generator to an
        async one starts. A nested def with a `while` loop waits for more work: a worker, whoever
        starts it, as is a thread kept on `self` to be joined at shutdown."""
        if self.ctx.resolve(call.func) not in _THREADS or id(call) in self.kept:
            return None
        target = next((arg.value for arg in call.args if arg.keyword is not None and arg.keyword.value == "target"), None)
        target = unwrap_callable(target, self.ctx)
        if isinstance(target, cst.Name):
            nested = [f for f in self._in_scope(self.ctx.key(target), where) if self.parents.get(id(f.node)) == where]
            if not nested or any(isinstance(n, cst.While) for f in nested for n in descendants(f.node.body, OWN_BODY_STOP)):
                return None
        elif not isinstance(target, cst.Lambda):
            return None
        return Handoff(call, "threading.Thread", target, None)

    def _work_queues(self) -> set[str]:
        """Thread-safe queues some def of this file takes an item from and calls: its work queue."""
        return {key for (where, name), key in self.taken.items()
                if (where, name) in self.called and self.ctx.facts.constructed_by(key) & _THREAD_QUEUES}

    def _closure(self, target: cst.BaseExpression, where: int) -> list[FunctionFacts]:
        """The handed-over callable and the defs of this file it calls, nested defs resolved in scope."""
        if isinstance(target, cst.Lambda):
            roots = [f for f in [self.ctx.function_facts(target)] if f is not None]
        else:
            roots = self._in_scope(self.ctx.key(target), where)
        seen: dict[int, FunctionFacts] = {}
        stack = roots
        while stack:
            current = stack.pop()
            if id(current.node) in seen:
                continue
            seen[id(current.node)] = current
            for site in current.calls:
                stack.extend(self._in_scope(site.key, id(current.node)))
        return list(seen.values())

    def _in_scope(self, key: str | None, where: int) -> list[FunctionFacts]:
        """Defs named `key`; for a plain name, the ones nested in `where` or around it, if there are such.

        Nested defs are known by their bare name, so two methods' `_run_all` share a key.
        """
        found = list(self.ctx.facts.by_key.get(key or "", ()))
        if len(found) < 2 or "." in (key or ""):
            return found
        around = {where}
        while where in self.parents:
            where = self.parents[where]
            around.add(where)
        near = [f for f in found if self.parents.get(id(f.node)) in around]
        return near or found

    def _decode_loops(self, functions: list[FunctionFacts]) -> list[_Loop]:
        found = []
        for function in functions:
            for loop in self.loops.get(id(function.node), ()):
                if self._generates(loop.node, function) and not _checks_stop(loop.node) and not _runs_once(loop.node):
                    found.append(loop)
        return found

    def _generates(self, loop: cst.For, function: FunctionFacts) -> bool:
        """A decode loop: over an MLX generator, running a generation step, or handing each item to the
        event loop (a stream a coroutine consumes, whatever produces it)."""
        if mlx_api.is_mlx_generator(loop.iter, self.ctx):
            return True
        inside = descendants(loop.body, OWN_BODY_STOP)
        body = {id(n) for n in inside if isinstance(n, cst.Call)}
        calls = [site for site in function.calls if id(site.node) in body]
        if any(terminal(site.node.func) in _POSTS for site in calls):
            return True
        steps = [site.node for site in calls if self._steps(site)]
        return bool(steps) and (not _walks_items(loop.iter) or _carries(inside, steps))

    def _steps(self, site: CallSite) -> bool:
        """A generation step: blocking MLX that makes a token, or calling the model (`model(y)`,
        `self._model(...)`). Evaluating arrays, admitting or removing a batch's requests and saving
        weights are MLX work of a fixed size: a loop of them is a loader's or a step's, not a decode."""
        if site.qual in mlx_api.BLOCKING_CORE or terminal(site.node.func) in _NO_TOKEN:
            return False
        if mlx_api.runs_mlx(site, self.ctx, loads=False):
            return True
        return isinstance(site.node.func, cst.Name | cst.Attribute) and mlx_api.is_model(site.node.func, self.ctx)


# Calls that walk a collection given in advance (`for i, doc in enumerate(documents)`).
_OVER_ITEMS = frozenset({"enumerate", "zip", "reversed", "sorted", "list", "tuple"})


def _walks_items(iterable: cst.BaseExpression) -> bool:
    """The loop walks a collection the work was handed (`for doc in documents`), not a count of steps
    (`range(max_tokens)`) or a generator: it ends when the items do, whatever the model returns."""
    if isinstance(iterable, cst.Name | cst.Attribute | cst.Subscript):
        return True
    return (isinstance(iterable, cst.Call) and isinstance(iterable.func, cst.Name)
            and iterable.func.value in _OVER_ITEMS and all(_walks_items(a.value) for a in iterable.args))


def _carries(inside: list[cst.CSTNode], steps: list[cst.Call]) -> bool:
    """A step's output feeds a later step (`logits = model(y)`, `y = sampler(logits)`): the loop decodes,
    each token made from the last. A loop that scores each item on its own (`model(mx.array(ids))` per
    document) carries nothing from one step to the next."""
    made = {id(step) for step in steps}
    fed: set[str] = set()
    assigns = [n for n in inside if isinstance(n, cst.Assign | cst.AugAssign | cst.AnnAssign)]
    changed = True
    while changed:
        changed = False
        for assign in assigns:
            value = assign.value
            if value is None:
                continue
            reads = [value, *descendants(value)]
            if not any(id(n) in made or (isinstance(n, cst.Name) and n.value in fed) for n in reads):
                continue
            targets = [t.target for t in assign.targets] if isinstance(assign, cst.Assign) else [assign.target]
            names = [n for t in targets for n in ([t] if isinstance(t, cst.Name) else
                     [e.value for e in t.elements] if isinstance(t, cst.Tuple | cst.List) else [])]
            for name in names:
                if isinstance(name, cst.Name) and name.value not in fed:
                    fed.add(name.value)
                    changed = True
    return any(isinstance(n, cst.Name) and n.value in fed for step in steps for arg in step.args
               for n in [arg.value, *descendants(arg.value)])


def _wired(call: cst.Call) -> bool:
    """The handoff passes something named like a cancel hook (`on_cancel=...`)."""
    return any(arg.keyword is not None and _stop_word(arg.keyword.value) for arg in call.args)


def _stop_word(text: str) -> bool:
    low = text.lower()
    return any(word in low for word in _STOP_WORDS)


def _runs_once(loop: cst.For) -> bool:
    """A body that ends every pass with `break` or `return` at its top level steps the generation once: a
    warm-up's first token, nothing left to run on after a cancel (issue 23, set j: Poppy's warm-ups, graded
    false)."""
    body = loop.body.body if isinstance(loop.body, cst.IndentedBlock) else ()
    return any(isinstance(line, cst.SimpleStatementLine) and any(isinstance(s, cst.Break | cst.Return) for s in line.body)
               for line in body)


def _checks_stop(loop: cst.For) -> bool:
    for node in descendants(loop.body, OWN_BODY_STOP):
        if isinstance(node, cst.Name) and _stop_word(node.value):
            return True
        if isinstance(node, cst.Attribute) and _stop_word(node.attr.value):
            return True
    return False
