from __future__ import annotations

import libcst as cst

from mlx_invariants.checker import mlx_api
from mlx_invariants.checker.branches import Arms
from mlx_invariants.checker.facts import CallSite, FunctionFacts
from mlx_invariants.checker.names import dotted, terminal
from mlx_invariants.checker.offload import HANDOFF_NAMES, THREAD_CLASSES, forwarded_handoff, handed_target, handoff
from mlx_invariants.checker.rule import Invalid, Rule, Valid
from mlx_invariants.checker.walker import descendants

# Loop methods whose callable runs on the event loop thread later.
_LOOP_CALLBACKS = frozenset({"call_soon", "call_soon_threadsafe", "call_later", "call_at", "add_done_callback"})


class MlxOnLoopBesideWorker(Rule):
    """Metal allows one thread at a time to encode into a command queue. A file
    that runs MLX on a worker thread (an executor, `to_thread`, a helper that
    forwards to one, a `Thread` target) and also touches MLX from the event loop
    has two threads inside Metal whenever a request arrives while the worker
    steps, and Metal aborts the process ("encodeSignalEvent:value: with
    uncommitted encoder", "A command encoder is already encoding"). Even building
    an array (`mx.array(tokens)`) makes MLX state on the loop's thread. vllm-mlx
    restored a cached KV prefix (`cache[i].state =`) and built `mx.array` on the
    loop while its worker generated (engine/simple.py@67632e9:1024, fixed in
    d76f9b3 by building them on the worker), and its MLLM scheduler's
    `abort_request`, called from the loop, ran `batch_generator.remove` while
    `step` ran on the executor (mllm_scheduler.py@99a5d5c:429, fixed in 5513615 by
    queueing the removal for the worker). Do the MLX work on the worker: hand it
    over, or queue it for the worker's next step.

    A coroutine's `finally:` is a case of its own: it runs when the coroutine is
    cancelled (the client leaves, the streaming response closes its generator)
    in the middle of awaiting a thread handoff, and cancelling that await does
    not stop the thread. So MLX in the `finally:` of a coroutine that hands work
    to a thread runs beside that work even when the worker's own MLX is out of
    sight (it iterates an engine's generator) and every handoff is awaited.

    A call MLX makes safe on any thread is none of this: `mx.clear_cache()` takes
    the allocator's mutex and frees only buffers no kernel holds, in every release
    that has it (mlx_facts.py), and the memory counters encode nothing. mlx-vlm
    dropped `mx.clear_cache()` from its SSE generators' `finally:` (f3bc6e8, for a
    crash reported at mlx_vlm/server/openai.py@784976c:1103) on a diagnosis MLX's
    allocator source does not bear out, so that call is not reported.

    A name is not MLX work by its package alone. mlx-lm's and mlx-vlm's classes are
    objects (mlx-vlm's `PromptCacheState()` sets two attributes to None), and making,
    asking or trimming a prompt cache is bookkeeping in every cache class mlx-lm
    ships (`trim_prompt_cache` moves each layer's offset): olmlx trims its plain
    KV caches on the loop (engine/inference.py@3eea120:2725) and reports cache
    stats through optional mlx-vlm imports, and neither is MLX. Only the packages'
    calls known to build, read or write arrays count (mlx_api.ARRAY_HELPERS).

    A coroutine that submits each step to the worker and waits for it (`await`,
    or `cf = pool.submit(step)` then `await asyncio.wrap_future(cf)`) runs its
    code after the wait, `except` arms included, with the worker idle: Rapid-MLX's
    scheduler closes a poisoned batch generator there after the step raised
    (mllm_scheduler.py@7222ca7:1350).
    """

    id = "INV120"
    # Opt-in: on MLX servers nobody here had studied, blind reviewers graded none of its ten findings true. Each
    # was safe for a reason outside the file's shape (the worker had finished, a lock the loop side also took, a
    # call that encodes no work or cannot run), and every exception written for one of them left the next
    # server's finding false; it detects only the two training cases it was written from (V7, V9).
    default_enabled = False
    catches = "MLX touched from the event loop in a file whose worker thread runs MLX"
    message = "{what} on the event loop thread while {worker} runs MLX on a worker thread: {fix}"
    known_problems = (
        "Needs the worker in the same file; a worker started from another module is not seen. From an async "
        "def it reports the first MLX call that does not block (an array op, a prompt cache's save or load), "
        "with a count of the others in the same coroutine; blocking ones are INV108's. A lazy op that only "
        "builds a graph is reported like one that encodes work. From a sync def that an async def of the file calls, it reports MLX calls on an object "
        "(`self.batch_generator`) that the worker's code also uses, so the same defect may carry INV108 at "
        "the call and INV120 in the helper. The `finally:` case needs the handoff in the same coroutine (a "
        "nested def or a helper that hands off is not followed), and reports MLX there even when "
        "the thread's work turns out not to use MLX. A def that itself runs on the worker is not judged, nor is "
        "anything guarded by a lock or condition the rule cannot see. When one coroutine makes every handoff "
        "of the file and awaits each, its own MLX and its helpers' are not judged here: it never runs beside "
        "its worker (INV108 still reports blocking MLX there). A call in an arm of a mode `if` (a test on no "
        "parameter, outside loops) whose other arm puts the same call in a def of its own that the coroutine "
        "does not call is taken as the case the server judged safe on the loop, and not reported, right or not. "
        "mlx-lm's and mlx-vlm's names count as MLX only where known to run array work (mlx_api.ARRAY_HELPERS, "
        "generation, loading): a project's own cache class whose `trim` slices arrays, trimmed through "
        "`trim_prompt_cache` on the loop, is missed (olmlx's lazy TurboQuant caches, "
        "engine/inference.py@3f7dea4:2232, fixed in ca34ff8), and so is a package helper not listed there."
    )
    triggers = (("mlx", "model", "generator", "scheduler"), ("async",))

    INVALID = [
        Invalid('''
            import asyncio
            import mlx.core as mx
            from mlx_lm.models.cache import make_prompt_cache

            class SimpleEngine:
                async def stream_generate(self, suffix_tokens, saved_state):
                    cache = make_prompt_cache(self._text_model)
                    cache[0].state = saved_state
                    prompt = mx.array(suffix_tokens)  # expect: INV120
                    return await self._run_serialized(self._decode, cache, prompt)

                async def _run_serialized(self, func, *args):
                    loop = asyncio.get_running_loop()
                    return await loop.run_in_executor(self._mlx_executor, lambda: func(*args))

                def _decode(self, cache, prompt):
                    return self._text_model.generate(prompt, cache=cache)
        '''),
        Invalid('''
            import asyncio
            from concurrent.futures import ThreadPoolExecutor

            class MLLMScheduler:
                def __init__(self, model):
                    self.batch_generator = MLLMBatchGenerator(model)
                    self._executor = ThreadPoolExecutor(max_workers=1)

                def step(self):
                    return self.batch_generator.next()

                def abort_request(self, uid):
                    self.batch_generator.remove([uid])  # expect: INV120

                async def _process_loop(self):
                    loop = asyncio.get_running_loop()
                    while True:
                        self._publish(await loop.run_in_executor(self._executor, self.step))

                async def stream_outputs(self, uid, request_task):
                    request_task.add_done_callback(lambda _: self.abort_request(uid))
                    async for output in self._outputs(uid):
                        yield output
        '''),
        Invalid("""
            import asyncio
            from mlx_lm.models.cache import load_prompt_cache

            async def stream_tokens(generator, prompt):
                token_iter = None
                try:
                    token_iter = await asyncio.to_thread(generator.generate, prompt)
                    while (token := await asyncio.to_thread(next, token_iter, None)) is not None:
                        yield token.text
                finally:
                    if token_iter is not None:
                        token_iter.close()
                    generator.prompt_cache = load_prompt_cache(generator.cache_file)  # expect: INV120
        """),
        Invalid('''
            import threading
            import mlx.core as mx

            class Servicer:
                def start(self):
                    self._worker = threading.Thread(target=self._generation_loop, daemon=True)
                    self._worker.start()

                def _generation_loop(self):
                    while True:
                        self.batch_generator.next()

                async def Generate(self, request, context):
                    if request.seed is not None:
                        mx.random.seed(request.seed)
                    noise = mx.random.normal((4,))  # expect: INV120
                    return await self._submit(request, noise)
        '''),
        # The step is submitted and not waited for: the except arm's array is built beside it.
        Invalid('''
            import asyncio
            from concurrent.futures import ThreadPoolExecutor
            import mlx.core as mx

            class Scheduler:
                def __init__(self, model):
                    self.batch_generator = BatchGenerator(model)
                    self._executor = ThreadPoolExecutor(max_workers=1)

                def _step(self):
                    return self.batch_generator.next()

                async def _process_loop(self):
                    while True:
                        try:
                            self._inflight = self._executor.submit(self._step)
                            await asyncio.sleep(0.01)
                        except Exception:
                            self._padding = mx.zeros((1,), dtype=mx.int32)  # expect: INV120
        '''),
        # The def that would defer the save is called right here: both arms save on the loop.
        Invalid('''
            import asyncio
            from concurrent.futures import ThreadPoolExecutor
            from mlx_lm import generate
            from mlx_lm.models.cache import save_prompt_cache

            _MLX = ThreadPoolExecutor(max_workers=1)

            def _generate(model, tokenizer, tokens, cache, before=None):
                if before is not None:
                    before()
                return generate(model, tokenizer, tokens, prompt_cache=cache)

            async def warm_up(model, tokenizer):
                return await asyncio.get_running_loop().run_in_executor(_MLX, _generate, model, tokenizer, [1], None)

            async def complete(model, tokenizer, tokens, cache, path):
                lazy_cache = any(getattr(layer, "lazy_state", False) for layer in cache)
                if lazy_cache:
                    def save_cache():
                        save_prompt_cache(path, cache)
                    save_cache()
                else:
                    save_prompt_cache(path, cache)  # expect: INV120
                return await asyncio.get_running_loop().run_in_executor(_MLX, _generate, model, tokenizer, tokens, cache)
        '''),
    ]
    VALID = [
        # A name mlx.core does not have runs nothing: the guarded `mx.time()` never runs (embed-rerank, issue 23).
        Valid('''
            import asyncio
            from concurrent.futures import ThreadPoolExecutor
            import mlx.core as mx

            class Reranker:
                def __init__(self):
                    self._executor = ThreadPoolExecutor(max_workers=1)

                async def load_model(self):
                    start = mx.time() if hasattr(mx, "time") else None
                    loop = asyncio.get_running_loop()
                    self._weights = await loop.run_in_executor(self._executor, self._load_sync)

                async def score(self, pairs):
                    loop = asyncio.get_running_loop()
                    return await loop.run_in_executor(self._executor, self._score, pairs)

                def _load_sync(self):
                    weights = mx.load(self._path)
                    mx.eval(weights)
                    return weights

                def _score(self, pairs):
                    return mx.eval(self._model(pairs))
        '''),
        # A cache whose state is lazy is saved on the worker before it prefills; one whose arrays
        # are evaluated is saved inline (the shape of olmlx's ca34ff8).
        Valid('''
            import asyncio
            from concurrent.futures import ThreadPoolExecutor
            from mlx_lm import generate
            from mlx_lm.models.cache import save_prompt_cache

            _MLX = ThreadPoolExecutor(max_workers=1)

            def _generate(model, tokenizer, tokens, cache, before=None):
                if before is not None:
                    before()
                return generate(model, tokenizer, tokens, prompt_cache=cache)

            async def warm_up(model, tokenizer):
                return await asyncio.get_running_loop().run_in_executor(_MLX, _generate, model, tokenizer, [1], None)

            async def complete(model, tokenizer, tokens, cache, path):
                lazy_cache = any(getattr(layer, "lazy_state", False) for layer in cache)
                before = None
                if lazy_cache:
                    def save_cache():
                        save_prompt_cache(path, cache)
                    before = save_cache
                else:
                    save_prompt_cache(path, cache)
                return await asyncio.get_running_loop().run_in_executor(_MLX, _generate, model, tokenizer, tokens, cache, before)
        '''),
        # Comparing token lists and asking whether a cache can be trimmed run no array op; the trim runs on the worker.
        Valid('''
            import asyncio
            from concurrent.futures import ThreadPoolExecutor
            from mlx_lm import generate
            from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache
            from mlx_lm.utils import common_prefix_len

            _MLX = ThreadPoolExecutor(max_workers=1)

            def _generate(model, tokenizer, tokens, cache, trim):
                if trim:
                    trim_prompt_cache(cache, trim)  # on the worker, whose stream evaluates the cache
                return generate(model, tokenizer, tokens, prompt_cache=cache)

            async def complete(model, tokenizer, prompt_tokens, cached):
                prefix = common_prefix_len(prompt_tokens, cached.tokens)
                if not can_trim_prompt_cache(cached.cache):
                    prefix = 0
                trim = len(cached.tokens) - prefix
                return await asyncio.get_running_loop().run_in_executor(_MLX, _generate, model, tokenizer, prompt_tokens[prefix:], cached.cache, trim)

            async def warm_up(model, tokenizer):
                return await asyncio.get_running_loop().run_in_executor(_MLX, _generate, model, tokenizer, [1], None, 0)
        '''),
        # mlx-lm's prompt-cache bookkeeping and an MLX package's plain class run no array op on the loop.
        Valid('''
            import asyncio
            from concurrent.futures import ThreadPoolExecutor
            from mlx_lm import generate
            from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache
            from mlx_lm.utils import common_prefix_len
            from mlx_vlm.generate import PromptCacheState

            _MLX = ThreadPoolExecutor(max_workers=1)

            def _generate(model, tokenizer, tokens, cache):
                return generate(model, tokenizer, tokens, prompt_cache=cache)

            async def complete(model, tokenizer, prompt_tokens, cached):
                if cached is None:
                    cached = PromptCacheState()
                    cached.cache, cached.token_ids = make_prompt_cache(model), []
                prefix = common_prefix_len(prompt_tokens, cached.token_ids)
                trim_prompt_cache(cached.cache, len(cached.token_ids) - prefix)
                return await asyncio.get_running_loop().run_in_executor(_MLX, _generate, model, tokenizer, prompt_tokens[prefix:], cached.cache)

            async def warm_up(model, tokenizer):
                return await asyncio.get_running_loop().run_in_executor(_MLX, _generate, model, tokenizer, [1], None)
        '''),
        # The one loop that submits each step waits for its future: the except arm runs with the worker idle.
        Valid('''
            import asyncio
            from concurrent.futures import ThreadPoolExecutor
            import mlx.core as mx

            class Scheduler:
                def __init__(self, model):
                    self.batch_generator = BatchGenerator(model)
                    self._executor = ThreadPoolExecutor(max_workers=1)

                def _step(self):
                    return self.batch_generator.next()

                async def _process_loop(self):
                    loop = asyncio.get_running_loop()
                    while True:
                        try:
                            cf = self._executor.submit(self._step)
                            self._publish(await asyncio.wrap_future(cf, loop=loop))
                        except Exception:
                            self._padding = mx.zeros((1,), dtype=mx.int32)
        '''),
        Valid("""
            import asyncio
            import mlx.core as mx

            async def stream_tokens(generator, prompt):
                token_iter = None
                try:
                    token_iter = await asyncio.to_thread(generator.generate, prompt)
                    while (token := await asyncio.to_thread(next, token_iter, None)) is not None:
                        yield token.text
                finally:
                    if token_iter is not None:
                        token_iter.close()

            async def reset_after_request(prompt):
                try:
                    return prompt.upper()
                finally:
                    mx.clear_cache()
        """),
        # The allocator's cache clear and memory counters are safe beside a worker mid-step (mlx_facts.py).
        Valid("""
            import asyncio
            import logging
            import mlx.core as mx

            async def stream_tokens(generator, prompt):
                token_iter = None
                try:
                    token_iter = await asyncio.to_thread(generator.generate, prompt)
                    while (token := await asyncio.to_thread(next, token_iter, None)) is not None:
                        yield token.text
                finally:
                    if token_iter is not None:
                        token_iter.close()
                    logging.info("peak %d bytes", mx.get_peak_memory())
                    mx.clear_cache()
        """),
        Valid('''
            import threading
            import mlx.core as mx

            class Servicer:
                def start(self):
                    self._worker = threading.Thread(target=self._generation_loop, daemon=True)
                    self._worker.start()

                def _generation_loop(self):
                    while True:
                        self.batch_generator.next()

                async def Generate(self, request, context):
                    if request.seed is not None:
                        mx.random.seed(request.seed)  # sets the global PRNG key: encodes no GPU work
                    return await self._submit(request)
        '''),
        Valid('''
            import asyncio
            import mlx.core as mx
            from mlx_lm.models.cache import make_prompt_cache

            class SimpleEngine:
                async def stream_generate(self, suffix_tokens, saved_state):
                    def restore():
                        cache = make_prompt_cache(self._text_model)
                        cache[0].state = saved_state
                        return cache, mx.array(suffix_tokens)

                    cache, prompt = await self._run_serialized(restore)
                    return await self._run_serialized(self._decode, cache, prompt)

                async def _run_serialized(self, func, *args):
                    loop = asyncio.get_running_loop()
                    return await loop.run_in_executor(self._mlx_executor, lambda: func(*args))

                def _decode(self, cache, prompt):
                    return self._text_model.generate(prompt, cache=cache)
        '''),
        Valid('''
            import asyncio
            from concurrent.futures import ThreadPoolExecutor

            class MLLMScheduler:
                def __init__(self, model):
                    self.batch_generator = MLLMBatchGenerator(model)
                    self._executor = ThreadPoolExecutor(max_workers=1)

                def step(self):
                    self.batch_generator.remove(self._drain_removals())
                    return self.batch_generator.next()

                def abort_request(self, uid):
                    self.batch_generator.schedule_removal([uid])

                async def _process_loop(self):
                    loop = asyncio.get_running_loop()
                    while True:
                        self._publish(await loop.run_in_executor(self._executor, self.step))

                async def stream_outputs(self, uid, request_task):
                    request_task.add_done_callback(lambda _: self.abort_request(uid))
                    async for output in self._outputs(uid):
                        yield output
        '''),
    ]

    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        self.awaited: set[int] = set()
        self.statements: dict[int, cst.CSTNode | None] = {}
        self.finally_depth = 0
        self.in_finally: set[int] = set()  # calls an async def makes in a `finally:` block
        self._arms: dict[int, Arms] = {}  # per coroutine, by id of its node

    def visit_Await(self, node: cst.Await) -> None:
        self.awaited.add(id(node.expression))

    def visit_Finally(self, node: cst.Finally) -> None:
        self.finally_depth += 1

    def leave_Finally(self, node: cst.Finally) -> None:
        self.finally_depth -= 1

    def visit_Call(self, node: cst.Call) -> None:
        # Remember where each call is and the keys of what it is handed, for `end()`.
        self.statements[id(node)] = self.ctx.statement
        if self.finally_depth and self.ctx.in_async:
            self.in_finally.add(id(node))
        for arg in node.args:
            if isinstance(arg.value, cst.Name | cst.Attribute):
                self.ctx.pin(arg.value)

    def end(self) -> None:
        facts = self.ctx.facts
        functions = list(facts.functions.values())
        reported = self._finally_beside_handoff(functions)
        workers, label, serial = self._worker_functions(functions)
        if not workers:
            return
        shared = {key for f in workers for s in f.calls if self._touches(s) and (key := _receiver(s, self.ctx))}
        if not any(self._touches(s) for f in workers for s in f.calls):
            return
        worker_ids = {id(f.node) for f in workers}
        # A coroutine that is the only one handing MLX to the worker, and awaits each handoff, never
        # runs beside its own worker: its MLX (and its helpers') is judged by INV108 alone.
        loop_side = [
            f for f in functions
            if isinstance(f.node, cst.FunctionDef) and f.node.asynchronous is not None and f is not serial
        ]
        callbacks = self._loop_callbacks(functions)
        for function in loop_side:
            touched = [
                (site, what) for site in function.calls
                if id(site.node) not in self.awaited and not mlx_api.runs_mlx(site, self.ctx, loads=False)
                and (what := self._touches(site))
            ]
            touched = [(site, what) for site, what in touched
                       if id(site.node) not in reported and not self._deferred_in_other_arm(function, site)]
            if touched:  # the first one, with a count: one finding per coroutine
                site, what = touched[0]
                others = len(touched) - 1
                more = f" (and {others} more MLX call{'s' if others > 1 else ''} in `{function.key}`)" if others else ""
                fix = "build it on the worker (hand it over with the work)"
                self._report(site, f"`{what}` runs MLX{more}", label, fix)
        for helper, caller in self._helpers(loop_side, callbacks, worker_ids):
            for site in helper.calls:
                key = _receiver(site, self.ctx)
                if key in shared and self._touches(site):
                    what = f"`{site.text}` runs in `{helper.key}`, which {caller} calls,"
                    self._report(site, what, label, "queue it for the worker's next step instead")

    def _finally_beside_handoff(self, functions: list[FunctionFacts]) -> set[int]:
        """Report MLX in the `finally:` of a coroutine that hands work to a thread; the calls reported.

        The `finally` runs when the coroutine is cancelled (a client leaves, an async generator is
        closed) while it awaits the handoff, and cancelling that await does not stop the thread: the
        worker may still be inside Metal. This holds whether or not the worker's MLX is visible here
        (it often iterates an engine's generator), and even when every handoff is awaited.
        """
        reported: set[int] = set()
        for function in functions:
            node = function.node
            if not (isinstance(node, cst.FunctionDef) and node.asynchronous is not None):
                continue
            handing = next((s for s in function.calls if _hands_off(s, self.ctx)), None)
            if handing is None:
                continue
            for site in function.calls:
                if id(site.node) not in self.in_finally or id(site.node) in self.awaited:
                    continue
                if mlx_api.runs_mlx(site, self.ctx, loads=False) or not (what := self._touches(site)):
                    continue  # blocking MLX is INV108's
                message = (
                    f"`{what}` in a `finally:` runs on the event loop thread when `{function.key}` is cancelled, "
                    f"while the work it handed to `{handing.text or 'a thread'}` may still run MLX (cancelling "
                    "the await does not stop the thread): leave it out, or do it on the worker after the work"
                )
                self.ctx.report_at(self.id, site.node, self.statements.get(id(site.node)), message)
                reported.add(id(site.node))
        return reported

    def _deferred_in_other_arm(self, function: FunctionFacts, site: CallSite) -> bool:
        """`site` stands in an arm of a mode `if` (branches.py) whose other arm makes the same call in a
        def of its own that the coroutine does not call: there the work is put off for another thread,
        and the arm that makes it inline is the mode the server's own state judged safe on the loop (a
        cache kind whose trim builds no array). INV108's inline arm beside a hand-off, for one call."""
        node = function.node
        if not isinstance(node, cst.FunctionDef):
            return False
        called = {s.text for s in function.calls}
        deferred = [
            inner for inner in descendants(node)
            if isinstance(inner, cst.FunctionDef) and inner.name.value not in called
            and (facts := self.ctx.function_facts(inner)) is not None
            and any(s.qual == site.qual and s.text == site.text for s in facts.calls)
        ]
        if not deferred:
            return False
        arms = self._arms.get(id(node))
        if arms is None:
            arms = self._arms[id(node)] = Arms(node)
        return arms.beside(site.node, deferred)

    def _report(self, site: CallSite, what: str, worker: str, fix: str) -> None:
        message = self.message.format(what=what, worker=worker, fix=fix)
        self.ctx.report_at(self.id, site.node, self.statements.get(id(site.node)), message)

    def _touches(self, site: CallSite) -> str | None:
        if mlx_api.is_load(site):
            return None  # start-up: the worker has nothing to run yet
        found = mlx_api.reaches(site, self.ctx)
        if found:
            return found
        if mlx_api.package_array_work(site.qual):
            return site.text or site.qual
        return None

    def _worker_functions(
        self, functions: list[FunctionFacts]
    ) -> tuple[list[FunctionFacts], str, FunctionFacts | None]:
        """The defs that run on a worker thread (handed to one, and what they call), a label for one, and
        the coroutine that makes every handoff and awaits each, if one does."""
        ctx = self.ctx
        facts = ctx.facts
        roots: list[FunctionFacts] = []
        label = ""
        handing: list[tuple[FunctionFacts, bool]] = []  # where each handoff is, and whether it is awaited
        for function in functions:
            for site in function.calls:
                target = handed_target(site, ctx)
                if target is None:
                    continue
                found = self._functions_of(target)
                if found:
                    roots.extend(found)
                    handing.append((function, site.qual not in THREAD_CLASSES and self._awaited(function, site)))
                    label = label or (f"`{dotted(target)}`" if dotted(target) else f"a lambda handed to `{site.text or terminal(site.node.func)}`")
        seen: dict[int, FunctionFacts] = {}
        stack = roots
        while stack:
            current = stack.pop()
            if id(current.node) not in seen:
                seen[id(current.node)] = current
                stack.extend(facts.callees(current))
        owners = {id(f.node) for f, _ in handing}
        serial = handing[0][0] if len(owners) == 1 and all(awaited for _, awaited in handing) else None
        if serial is not None and not (isinstance(serial.node, cst.FunctionDef) and serial.node.asynchronous):
            serial = None
        return list(seen.values()), label, serial

    def _awaited(self, function: FunctionFacts, site: CallSite) -> bool:
        """`function` waits for the handoff `site` before its next statement: it awaits the call, or the
        name the call's future is bound to (`cf = pool.submit(step)`, then `await asyncio.wrap_future(cf)`
        or `await fut`). What follows the await, its `except` arms included, runs with the worker idle."""
        if id(site.node) in self.awaited:
            return True
        inside = descendants(function.node)
        names = {
            target.target.value for node in inside if isinstance(node, cst.Assign) and node.value is site.node
            for target in node.targets if isinstance(target.target, cst.Name)
        }
        for node in inside:
            if not names or not isinstance(node, cst.Await):
                continue
            waited = node.expression
            if isinstance(waited, cst.Call) and terminal(waited.func) == "wrap_future" and waited.args:
                waited = waited.args[0].value
            if isinstance(waited, cst.Name) and waited.value in names:
                return True
        return False

    def _functions_of(self, target: cst.BaseExpression) -> list[FunctionFacts]:
        if isinstance(target, cst.Lambda):
            found = self.ctx.function_facts(target)
            return [found] if found else []
        return list(self.ctx.facts.by_key.get(self.ctx.key(target) or "", ()))

    def _loop_callbacks(self, functions: list[FunctionFacts]) -> list[tuple[FunctionFacts, str]]:
        """Callables handed to the loop (`call_soon`, `add_done_callback`, ...): they run on its thread."""
        found = []
        for function in functions:
            for site in function.calls:
                if terminal(site.node.func) in _LOOP_CALLBACKS and site.node.args:
                    callback = site.node.args[0].value
                    found.extend((f, f"`{site.text}`") for f in self._functions_of(callback))
        return found

    def _helpers(self, loop_side: list[FunctionFacts], callbacks: list[tuple[FunctionFacts, str]],
                 worker_ids: set[int]) -> list[tuple[FunctionFacts, str]]:
        """Sync defs that async defs of the file, or loop callbacks, call (transitively), with one caller each."""
        facts = self.ctx.facts
        found: dict[int, tuple[FunctionFacts, str]] = {}
        stack = [(callee, f"`{f.key}`") for f in loop_side for callee in facts.callees(f)]
        stack += [(callee, via) for f, via in callbacks for callee in facts.callees(f)]
        while stack:
            current, caller = stack.pop()
            node = current.node
            if id(node) in found or id(node) in worker_ids:
                continue
            if not isinstance(node, cst.FunctionDef) or node.asynchronous is not None:
                continue
            found[id(node)] = (current, caller)
            stack.extend((callee, f"`{current.key}`") for callee in facts.callees(current))
        return list(found.values())


def _hands_off(site: CallSite, ctx) -> bool:
    """`site` hands a callable to another thread (`to_thread`, an executor, a helper forwarding to one)."""
    if terminal(site.node.func) in HANDOFF_NAMES:
        return handoff(site.node, ctx) is not None
    return forwarded_handoff(site.node, ctx) is not None


def _receiver(site: CallSite, ctx) -> str | None:
    """The object a method call is made on (`MLLMScheduler.batch_generator`); None for a module's function."""
    func = site.node.func
    if not isinstance(func, cst.Attribute) or site.qual is not None:
        return None
    return ctx.key(func.value)
