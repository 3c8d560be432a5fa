from __future__ import annotations

from mlx_invariants.checker.model.queries import WAIT_ON_LOOP_MESSAGE
from mlx_invariants.checker.rule import PACKAGE_ONLY, Invalid, Rule, Valid

# A turn tracker in another module whose check waits, under a condition, for a pending reopen.
_TRACKER = {"app/turns.py": '''
    import threading


    class TurnTracker:
        def __init__(self):
            self._cond = threading.Condition()
            self._pending = False

        def is_latest(self, turn):
            with self._cond:
                self._cond.wait_for(lambda: not self._pending, timeout=2.0)
                return turn == self.latest
'''}
# A model manager whose eviction closes a prefetcher that waits for its thread to finish the loads queued.
_MANAGER = {"app/prefetch.py": '''
    import queue
    import threading


    class Prefetcher:
        def __init__(self):
            self._pending = queue.Queue()
            threading.Thread(target=self._run, daemon=True).start()

        def _run(self):
            while True:
                load = self._pending.get()
                load()
                self._pending.task_done()

        def close(self):
            self._pending.join()
'''}

class BlockingWaitOnEventLoop(Rule):
    """An `async def` runs on the event loop's one thread: while it sits in a sync call, no other
    request, stream or timer of that loop moves. A sync call that waits for another thread (an
    event it sets, a condition it notifies, a queue it fills, a future it completes) holds the loop for
    as long as that thread's work takes, and when that thread needs the loop to get there, never
    returns. Called in the `async def` itself some linters see a few of these; this rule follows the
    package's sync calls into other modules, where the wait is three helpers down and nothing at
    the call site says so. huggingface/speech-to-speech's websocket send loop called
    `service.dispatch_pipeline_event(...)`, which reached a turn tracker that waited up to 2 s on a
    `threading.Condition` while a speculative turn reopened
    (src/speech_to_speech/api/openai_realtime/websocket_router.py@1383494:270, the wait in
    pipeline/speculative_turns.py:202), stalling every websocket. menaje/mlx-serve's streaming
    completions run `stream_generate` on a thread and poll its queue with `q.get(timeout=0.1)` from
    the async generator StreamingResponse iterates, so the loop stands still for the whole prompt
    and between tokens (src/mlx_serve/routers/chat.py@a773868:816, 1295, graded true blind).

    The waits it knows (model/waits.py): `Event.wait`, `Condition.wait` and `wait_for`,
    `Barrier.wait`, a `queue.Queue`'s `get` and `join`, `.result()` of an executor's `submit` or
    of `asyncio.run_coroutine_threadsafe` (from the loop's own thread that one never returns), and
    `concurrent.futures.wait`. A constant timeout under 50 ms and `get(block=False)` return at
    once and are left alone, and so is a `get` from a queue the same def puts back into (a pool of
    slots, whose `get` waits for other holders, not for a producing thread); a longer timeout
    still holds the loop that long, each time round (a stream polling `queue.get(timeout=0.1)`
    for its tokens holds it for the whole generation). A receiver counts when the model can type
    it: an attribute its class assigns (`self._cond = threading.Condition()`), a local, a
    module-level name, an annotated parameter. A thread's `join`, an executor's `shutdown`, a
    sleep, a subprocess or a network call is not counted (model/waits.py says why).

    Not judged: a coroutine on an event loop of its own (a worker its decorator runs on a thread,
    `@work(thread=True)`, and what only such workers await), which serves nothing else;
    start-up and teardown coroutines (a lifespan, a start-up hook, an `async def` named for
    starting, loading or shutting down: `start`, `load`, `shutdown`, `stop`, `close`,
    `__aexit__`, ...), where nothing is being served; the arm of a mode `if` whose other arm
    hands the same work to a thread; tests, benchmarks, scripts and command lines; a wait reached
    through a constructor or a model load, which INV108 counts as start-up work too; a callable
    handed to a thread, which waits there."""

    id = "INV130"
    catches = "a wait on another thread (event, condition, queue, pool) in an async def, itself or through the package's sync calls"
    message = WAIT_ON_LOOP_MESSAGE
    known_problems = (
        "A wait the model cannot type is not seen: a condition or queue passed around untyped, or held in a "
        "container. A wait the code knows is short (an event set a moment before, a queue known to hold an "
        "item) is reported unless its timeout is a constant under 50 ms. Start-up and teardown are recognised "
        "by name only: a lazily started worker whose start waits for it to be ready is left out with them. "
        "Like every rule of the package model, it reads a module only if it mentions MLX or imports from its "
        "package (model/phase.py): a standalone file of handlers is not followed."
    )
    # Opt-in: on the two sets of servers kept aside from it (issue 23, sets g and h) both its findings were false,
    # each a coroutine on an event loop of its own that the model did not see as one (a GPU-pool worker's
    # `asyncio.run` behind a runtime check, VoiceStudio model_manager.py@98c9e68:2664; a Textual `@work(thread=True)`
    # worker, mlx-chat screens/stt.py@8b5fca1:90, recognised since the tenth session: its caller, a handler on the
    # app's loop, no longer hands the worker that loop's role). Asked again in the tenth session, on the HEADs of the
    # 281 repositories mirrored here (21 findings outside tests, two blind reviewers): 5 and 7 true, 9 false for
    # both. The false ones wait on what the code has just seen finish (`while not fut.done(): await ...` then
    # `fut.result()`), or sit behind an argument or an event type that skips the wait (`play(blocking=False)`), which
    # the summary does not follow; it stays opt-in.
    default_enabled = False
    triggers = PACKAGE_ONLY

    INVALID = [
        Invalid('''
            import queue
            import threading

            from mlx_lm import stream_generate


            class Engine:
                def __init__(self, model, tokenizer):
                    self.model, self.tokenizer = model, tokenizer
                    self.tokens = queue.Queue()

                def _run(self, prompt):
                    for response in stream_generate(self.model, self.tokenizer, prompt):
                        self.tokens.put(response.text)
                    self.tokens.put(None)

                async def stream(self, prompt):
                    threading.Thread(target=self._run, args=(prompt,), daemon=True).start()
                    while (text := self.tokens.get(timeout=0.1)) is not None:  # expect: INV130
                        yield text
        '''),
        Invalid('''
            from .turns import TurnTracker


            class Session:
                def __init__(self):
                    self.tracker = TurnTracker()

                def dispatch(self, turn, event):
                    if self.tracker.is_latest(turn):
                        return event

                async def send_loop(self, websocket, queue):
                    while True:
                        turn, event = await queue.get()
                        message = self.dispatch(turn, event)  # expect: INV130
                        if message is not None:
                            await websocket.send_json(message)
        ''', files=_TRACKER),
        Invalid('''
            import asyncio

            from .prefetch import Prefetcher


            class ModelManager:
                def __init__(self):
                    self._lock = asyncio.Lock()
                    self._loaded = {}
                    self._prefetcher = Prefetcher()

                def _evict(self, name):
                    self._loaded.pop(name)
                    self._prefetcher.close()

                async def ensure_loaded(self, name):
                    async with self._lock:
                        if len(self._loaded) > 2:
                            self._evict(next(iter(self._loaded)))  # expect: INV130
                        self._loaded[name] = object()
        ''', files=_MANAGER),
    ]
    VALID = [
        Valid('''
            import asyncio
            import threading

            from mlx_lm import stream_generate


            class Engine:
                def __init__(self, model, tokenizer):
                    self.model, self.tokenizer = model, tokenizer

                def _run(self, prompt, loop, tokens):
                    for response in stream_generate(self.model, self.tokenizer, prompt):
                        loop.call_soon_threadsafe(tokens.put_nowait, response.text)
                    loop.call_soon_threadsafe(tokens.put_nowait, None)

                async def stream(self, prompt):
                    tokens = asyncio.Queue()
                    args = (prompt, asyncio.get_running_loop(), tokens)
                    threading.Thread(target=self._run, args=args, daemon=True).start()
                    while (text := await tokens.get()) is not None:
                        yield text
        '''),
        Valid('''
            import asyncio

            from .turns import TurnTracker


            class Session:
                def __init__(self):
                    self.tracker = TurnTracker()

                def dispatch(self, turn, event):
                    if self.tracker.is_latest(turn):
                        return event

                async def send_loop(self, websocket, queue):
                    while True:
                        turn, event = await queue.get()
                        message = await asyncio.to_thread(self.dispatch, turn, event)
                        if message is not None:
                            await websocket.send_json(message)
        ''', files=_TRACKER),
        Valid('''
            import asyncio

            from .prefetch import Prefetcher


            class ModelManager:
                def __init__(self):
                    self._lock = asyncio.Lock()
                    self._loaded = {}
                    self._prefetcher = Prefetcher()

                def _evict(self, name):
                    self._loaded.pop(name)
                    self._prefetcher.close()

                async def ensure_loaded(self, name):
                    async with self._lock:
                        if len(self._loaded) > 2:
                            await asyncio.to_thread(self._evict, next(iter(self._loaded)))
                        self._loaded[name] = object()

                async def shutdown(self):
                    for name in list(self._loaded):
                        self._evict(name)
        ''', files=_MANAGER, options={"select": ["INV130"]}),  # the handoff under the lock is INV105's
        Valid('''
            import queue

            import mlx.core as mx


            class SlotPool:
                def __init__(self, slots):
                    self._free = queue.Queue()
                    for slot in range(slots):
                        self._free.put(slot)

                def copy_in(self, payload, buffers):
                    slot = self._free.get(timeout=5)
                    try:
                        buffers[slot][: len(payload)] = payload
                        return mx.array(buffers[slot][: len(payload)])
                    finally:
                        self._free.put(slot)

                async def receive(self, payload, buffers):
                    return self.copy_in(payload, buffers)
        '''),
        # A worker its framework runs on a thread of its own, with a loop of its own (Textual's thread workers),
        # whoever calls it: the call only starts it there.
        Valid('''
            import queue

            import mlx.core as mx
            from textual import work


            class Recorder:
                def __init__(self):
                    self.chunks = queue.Queue()

                def next_chunk(self):
                    return self.chunks.get()

                async def on_record(self, model):
                    self.transcribe(model)

                @work(thread=True)
                async def transcribe(self, model):
                    while (chunk := self.next_chunk()) is not None:
                        mx.eval(model(mx.array(chunk)))
        ''', options={"select": ["INV130"]}),
    ]
