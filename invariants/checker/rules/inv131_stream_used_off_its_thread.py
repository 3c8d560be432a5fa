from __future__ import annotations

from mlx_invariants.checker.model.queries import STREAM_MESSAGE
from mlx_invariants.checker.rule import PACKAGE_ONLY, Invalid, Rule, Valid

# A worker module that steps generation on a thread of its own, with the stream the main module made at import.
_WORKER = {"app/worker.py": '''
    import queue
    import threading

    import mlx.core as mx

    from .main import STREAM


    class Worker:
        def __init__(self, model):
            self.model = model
            self.inbox = queue.Queue()
            threading.Thread(target=self._run, daemon=True).start()

        def _run(self):
            while True:
                x, done = self.inbox.get()
                with mx.stream(STREAM):
                    done(self.model(x))
'''}


class StreamUsedOffItsThread(Rule):
    """From MLX 0.31.2 streams and command encoders are per thread: a stream made with
    `mx.new_stream` exists only on the thread that made it, and using it anywhere else
    (`with mx.stream(s):`, `mx.synchronize(s)`, `wired_limit(model, [s])`, `stream=s`) raises
    "There is no Stream(gpu, N) in current thread". A stream made at module level is made on
    whichever thread imports the module first, the main thread of a server, while the work that
    uses it runs on a request's pool thread, an executor or the MLX owner thread. mlx-lm's own
    `generation_stream` was such a stream until 0.31.3 (ml-explore/mlx#3727, mlx-lm#1090), and
    mlx-vlm's until 0.5.0: every server that generated off the importing thread failed at once on
    MLX 0.31.2. heylookitsanllm made its own at import and used it in its vision strategy, run on a
    request's pool thread (src/heylook_llm/providers/mlx_provider.py@c8a5f72:98, 412, 431), fixed in
    4ce23f9 with `mx.new_thread_local_stream`; omlx synchronized and bound mlx-lm's
    `generation_stream` on its MLX executor thread (omlx/scheduler.py@ae908e6:53, 1780, 3420), fixed by
    making a stream on the worker in b72e38f and for good by mlx-lm 0.31.3.

    It follows the package: a module-level name bound once to `mx.new_stream(...)`, read (in any
    expression) by a function the model runs on another thread than the importing one (a callable
    handed to `asyncio.to_thread`, an executor or a `Thread`, what those call, a declared owner's
    helpers are not judged). A stream of the package is reported once, where it is made, with its
    readers; a library's `generation_stream` where it is read. It is true from MLX 0.31.2 on: where
    the project runs only older releases (an exact pin, a lock file, `mlx-version`) it is not
    reported, and where it admits both, the message says so."""

    id = "INV131"
    catches = "a stream made at import with `mx.new_stream` (or mlx-lm's old `generation_stream`) used on another thread"
    message = STREAM_MESSAGE
    known_problems = (
        "A module imported first on a worker thread (a lazy `import` inside the worker) makes its stream there, "
        "and the rule still reports it. Only module-level streams are followed: one kept on `self` or made in a "
        "function and handed around is not. Readers are found through the package model's thread roles, so a "
        "reader the model cannot reach from a handoff (a callable kept in a registry, a dynamic dispatch) is not "
        "seen. A module that rebinds the name on each worker thread (an executor's initializer assigning "
        "`module.STREAM`) is not seen either, and is still reported."
    )
    triggers = PACKAGE_ONLY

    INVALID = [
        Invalid('''
            import asyncio

            import mlx.core as mx
            from mlx_lm.generate import wired_limit

            generation_stream = mx.new_stream(mx.default_device())  # expect: INV131


            def describe(model, pixels):
                with wired_limit(model, [generation_stream]):
                    return model(mx.array(pixels))


            async def vision(model, pixels):
                return await asyncio.to_thread(describe, model, pixels)
        ''', options={"mlx-version": "0.31.2"}),  # where a pool thread per call is fine (INV107), but not this
        Invalid('''
            import asyncio
            from concurrent.futures import ThreadPoolExecutor

            import mlx.core as mx
            from mlx_lm.generate import generation_stream

            MLX = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlx")


            def sync_and_clear():
                mx.synchronize(generation_stream)  # expect: INV131
                mx.clear_cache()


            async def cleanup():
                await asyncio.get_running_loop().run_in_executor(MLX, sync_and_clear)
        '''),
        Invalid('''
            import mlx.core as mx

            STREAM = mx.new_stream(mx.gpu)  # expect: INV131
        ''', files=_WORKER),
    ]
    VALID = [
        # Each thread gets its own instance of a thread-local stream.
        Valid('''
            import asyncio

            import mlx.core as mx

            generation_stream = mx.new_thread_local_stream(mx.default_device())


            def describe(model, pixels):
                with mx.stream(generation_stream):
                    return model(mx.array(pixels))


            async def vision(model, pixels):
                return await asyncio.to_thread(describe, model, pixels)
        ''', options={"mlx-version": "0.31.2"}),
        # Made on the thread that uses it.
        Valid('''
            import threading

            import mlx.core as mx


            class Worker:
                def __init__(self, model, inbox):
                    self.model, self.inbox = model, inbox
                    threading.Thread(target=self._run, daemon=True).start()

                def _run(self):
                    stream = mx.new_stream(mx.gpu)
                    while True:
                        x, done = self.inbox.get()
                        with mx.stream(stream):
                            done(self.model(x))
        '''),
        # Used only on the thread that imported it (the event loop's, a command line's), and a local of the same name.
        Valid('''
            import asyncio

            import mlx.core as mx

            STREAM = mx.new_stream(mx.gpu)


            def warm_up(model, x):
                with mx.stream(STREAM):
                    return model(x)


            async def prepare(x):
                with mx.stream(STREAM):
                    return mx.array(x) * 2


            def offline(model, x):
                STREAM = mx.new_stream(mx.gpu)
                with mx.stream(STREAM):
                    return model(x)


            async def batch(model, x):
                return await asyncio.to_thread(offline, model, x)
        ''', options={"mlx-version": "0.31.2"}),
        # A project that runs only MLX 0.30.4, where every thread shares the streams.
        Valid('''
            import asyncio
            from concurrent.futures import ThreadPoolExecutor

            import mlx.core as mx

            generation_stream = mx.new_stream(mx.default_device())
            MLX = ThreadPoolExecutor(max_workers=1)


            def describe(model, pixels):
                with mx.stream(generation_stream):
                    return model(mx.array(pixels))


            async def vision(model, pixels):
                return await asyncio.get_running_loop().run_in_executor(MLX, describe, model, pixels)
        ''', options={"mlx-version": "0.30.4"}),
        # mlx-lm 0.31.3 made its generation stream thread-local.
        Valid('''
            import asyncio

            import mlx.core as mx
            from mlx_lm.generate import generation_stream


            def sync_and_clear():
                mx.synchronize(generation_stream)
                mx.clear_cache()


            async def cleanup():
                await asyncio.to_thread(sync_and_clear)
        ''', options={"mlx-version": "0.31.2", "mlx-lm-version": "0.31.3"}),
    ]
