from __future__ import annotations

from mlx_invariants.checker.model.queries import UNGUARDED_MESSAGE
from mlx_invariants.checker.rule import PACKAGE_ONLY, Invalid, Rule, Valid

# The engine the examples import: a sync def that encodes MLX work, one that waits for it.
_ENGINE = {"app/engine.py": '''
    import mlx.core as mx

    class Engine:
        def encode(self, prompt):
            return mx.array(prompt)

        def generate_all(self, prompt):
            tokens = self.encode(prompt)
            mx.eval(tokens)
            return tokens
'''}
# This rule alone: the handoffs under a lock are INV103's and INV105's to judge, the default pool INV107's.
_ONLY = {"select": ["INV125"]}
_LOCK = {**_ONLY, "mlx-locks": ["self._generation_lock"]}
# A speech pipeline that declares nothing: a process-wide lock in a shared module, which two handlers of two
# modules take around their models (so the package shows it is its MLX lock), and a third handler that does not.
_SHARED_LOCK = '''
    import threading

    # Metal runs one command buffer at a time for us: every handler takes this around its model.
    MLX_LOCK = threading.Lock()
'''
_TRANSCRIBER = '''
    import mlx.core as mx

    from .utils import MLX_LOCK


    class Transcriber:
        def __init__(self, model):
            self.model = model

        def process(self, audio):
            with MLX_LOCK:
                return self.model(mx.array(audio))
'''
_RESPONDER = '''
    import mlx.core as mx

    from . import utils


    class Responder:
        def __init__(self, model):
            self.model = model

        def process(self, text):
            with utils.MLX_LOCK:
                return self.model.generate(text)
'''
_SPEAKER = '''
    import mlx.core as mx


    class Speaker:
        def __init__(self, model):
            self.model = model

        def process(self, text):
            return self.model.generate(text)
'''
_PIPELINE = {"app/utils.py": _SHARED_LOCK, "app/stt.py": _TRANSCRIBER, "app/llm.py": _RESPONDER, "app/tts.py": _SPEAKER}


class MlxOutsideDeclaredLock(Rule):
    """Lockset completeness: every path that reaches MLX holds the lock the project guards MLX
    with. Such an engine serializes MLX by that lock: two requests inside Metal at once, or a
    prompt cache built while another request's generation runs, is what the lock is there to
    prevent. One path that reaches MLX without it undoes the lock for every request, and nothing
    fails until two requests meet there. vllm-mlx's SimpleEngine took `self._generation_lock`
    around its generations (vllm_mlx/engine/simple.py@67632e9:242, 401; "Must hold
    _generation_lock to prevent concurrent Metal access", :626) while the cache-hit path of
    `_stream_generate_text` built a prompt cache and an `mx.array` on the loop without it
    (:1024-1028, fixed in d76f9b3). Maintainers check this today with `git grep` for the
    lock's name, which misses the path that never names the lock; the package model checks
    every module.

    Which lock. A project may declare it (`mlx-locks = ["self._generation_lock"]` in
    [tool.invariants], or `# invariants: mlx-lock` on the line that assigns one); then only
    that. Most never do: a speech or serving pipeline keeps one process-wide `MLX_LOCK` in a
    shared module, its handlers each run on a thread of their own and take the lock around their
    model calls, and the handler added last forgets it. So without a declaration the model
    infers the lock (model/locks.py): a process-wide lock (a module-level name followed through
    imports, a class's attribute, a getter of the package; never an instance's own) held around
    MLX that runs in Metal (a forward pass, an eval, a generation, a model-named call), directly
    or through the calls the model resolves, by functions of at least two modules. A lock one
    module keeps for its own pieces is not enough: omlx's `_mx_buffer_access_lock`, held in
    three functions of scheduler.py alone, would have judged the whole package by it (34
    findings on start-up, shutdown and tests, mostly false).

    Declared: a request handler is an `async def` on the event loop (not one declared to run on
    the owner thread); its family is its class, or its module's top level, and only a family
    that takes a declared lock somewhere is asked: the lock is that class's, not another's.
    Reported where a handler leaves the lock out: its own MLX call, its call of a sync def of
    the package that reaches MLX with no declared lock taken on the way, and a handoff to a
    thread (the default pool, an executor, a `Thread`; not the owner executor of
    owner-executors, which serializes by itself) of work that does. With `mlx-locks =
    ["self._generation_lock"]`, vllm-mlx at 67632e9 gives two findings: the bug above
    (:1028) and `start()`'s `build_text_model()` (:166, start-up work, arguable); at its fix
    d76f9b3 only the second; at 4b654c0 none (`stop()`'s `mx.clear_cache()`, :976, was
    one until the allocator's cache clear counted as safe on any thread, mlx_facts.py).

    Inferred: judged by thread role, not only the loop. Reported: a handler on the event loop
    whose MLX runs in Metal outside every MLX lock, and, from any function, a handoff of work
    that does to a thread other than an owner (a `threading.Thread`, an executor, the default
    pool). Not judged: a family that serializes its MLX on an owner of its own (a declared owner
    function or executor, an engine loop owning MLX on the event loop, an executor its file
    builds with one worker), start-up (MLX run or handed to a pool by a lifespan before its
    `yield` or a start-up hook, loading weights; a `Thread` started there serves and is judged),
    and, in both forms, a def every caller enters with the lock held (judged at its
    callers). On the HEADs of 29 MLX servers' mirrors no package shares such a lock across
    modules: no finding."""

    id = "INV125"
    catches = ("MLX reached without the lock the project guards MLX with: declared (mlx-locks), or inferred from "
               "a process-wide lock functions of two modules hold around their MLX")
    message = UNGUARDED_MESSAGE
    known_problems = (
        "Declared: needs mlx-locks or the comment, and judges only handlers on the event loop; start-up and "
        "shutdown work (`start()`, `stop()`) is judged like any handler: take the lock there too, or suppress "
        "the line where nothing else can run yet. Inferred: only a lock the model can name process-wide (a "
        "module-level name, a class's attribute, a getter; not `self._lock` unless it holds one of those) and "
        "that functions of two modules hold around MLX the model sees (a call through an object it cannot name "
        "is not followed); a thread the model cannot name (`Thread(target=handler.run)` over a loop of "
        "handlers) is not judged; a family with an owner executor of its own is not judged even where its "
        "owner thread and a lock holder's thread can meet in Metal. Only `with` / `async with` blocks count as "
        "holding the lock (`lock.acquire()` ... `release()` does not); a helper that forwards its callable to a "
        "thread under any lock of lock-names counts as serialized. A blocking call without the lock is INV108's "
        "too (it says to move it off the loop, this rule to take the lock)."
    )
    triggers = PACKAGE_ONLY

    INVALID = [
        Invalid('''
            import asyncio

            import mlx.core as mx


            class Engine:
                def encode(self, prompt):
                    return mx.array(prompt)


            class Server:
                def __init__(self):
                    self.engine = Engine()
                    # Serializes Metal command-buffer (MLX) access; not an admission gate.
                    self._generation_lock = asyncio.Lock()  # invariants: mlx-lock

                async def prefill(self, prompt):
                    async with self._generation_lock:
                        return self.engine.encode(prompt)

                async def count_tokens(self, prompt):
                    return len(self.engine.encode(prompt))  # expect: INV125

                async def embed(self, prompt):
                    return mx.array(prompt)  # expect: INV125
        '''),
        Invalid('''
            import asyncio

            from .engine import Engine


            class Server:
                def __init__(self):
                    self.engine = Engine()
                    self._generation_lock = asyncio.Lock()

                async def generate(self, prompt):
                    async with self._generation_lock:
                        return await asyncio.to_thread(self.engine.generate_all, prompt)

                async def count_tokens(self, prompt):
                    return len(self.engine.encode(prompt))  # expect: INV125
        ''', options=_LOCK, files=_ENGINE),
        Invalid('''
            import asyncio

            from .engine import Engine


            class Server:
                def __init__(self):
                    self.engine = Engine()
                    self._generation_lock = asyncio.Lock()

                async def generate(self, prompt):
                    return await asyncio.to_thread(self.engine.generate_all, prompt)  # expect: INV125

                async def count_tokens(self, prompt):
                    async with self._generation_lock:
                        return len(self.engine.encode(prompt))
        ''', options=_LOCK, files=_ENGINE),
        # Inferred: two handlers of two modules take `MLX_LOCK` around their models; the third runs on its
        # own thread without it.
        Invalid('''
            import threading

            from .llm import Responder
            from .stt import Transcriber
            from .tts import Speaker


            def serve(models):
                transcriber = Transcriber(models["stt"])
                responder = Responder(models["llm"])
                speaker = Speaker(models["tts"])
                threading.Thread(target=transcriber.process).start()
                threading.Thread(target=responder.process).start()
                threading.Thread(target=speaker.process).start()  # expect: INV125
        ''', options=_ONLY, files=_PIPELINE),
    ]
    VALID = [
        # Inferred: the third handler's family hands its MLX to an executor of one worker of its own, which
        # serializes it.
        Valid('''
            import asyncio
            import threading
            from concurrent.futures import ThreadPoolExecutor

            from .llm import Responder
            from .stt import Transcriber
            from .tts import Speaker


            class Voice:
                def __init__(self, model):
                    self.speaker = Speaker(model)
                    self._executor = ThreadPoolExecutor(max_workers=1)

                async def speak(self, text):
                    loop = asyncio.get_running_loop()
                    return await loop.run_in_executor(self._executor, self.speaker.process, text)


            async def serve(models, texts):
                transcriber = Transcriber(models["stt"])
                responder = Responder(models["llm"])
                threading.Thread(target=transcriber.process).start()
                threading.Thread(target=responder.process).start()
                voice = Voice(models["tts"])
                return [await voice.speak(text) for text in texts]
        ''', options=_ONLY, files=_PIPELINE),
        # Inferred: a lock that only one module takes is that module's own, not the package's MLX lock.
        Valid('''
            import threading

            from .stt import Transcriber, transcribe_file
            from .tts import Speaker


            def serve(models):
                transcriber = Transcriber(models["stt"])
                speaker = Speaker(models["tts"])
                threading.Thread(target=transcriber.process).start()
                threading.Thread(target=transcribe_file, args=(models["stt"], "a.wav")).start()
                threading.Thread(target=speaker.process).start()
        ''', options=_ONLY, files={"app/stt.py": _TRANSCRIBER.replace("from .utils import MLX_LOCK", "import threading\n\n    MLX_LOCK = threading.Lock()") + '''

    def transcribe_file(model, path):
        with MLX_LOCK:
            return model(mx.array(path))
''', "app/tts.py": _SPEAKER}),
        # Inferred: warming the third handler up in the lifespan, before the server serves anyone.
        Valid('''
            import threading
            from contextlib import asynccontextmanager

            from .llm import Responder
            from .stt import Transcriber
            from .tts import Speaker


            @asynccontextmanager
            async def lifespan(app):
                speaker = Speaker(app.state.models["tts"])
                speaker.process("warm up")
                threading.Thread(target=Transcriber(app.state.models["stt"]).process).start()
                threading.Thread(target=Responder(app.state.models["llm"]).process).start()
                yield
        ''', options=_ONLY, files=_PIPELINE),
        Valid('''
            import asyncio

            import mlx.core as mx


            class Engine:
                def encode(self, prompt):
                    return mx.array(prompt)


            class Server:
                def __init__(self):
                    self.engine = Engine()
                    # Serializes Metal command-buffer (MLX) access; not an admission gate.
                    self._generation_lock = asyncio.Lock()  # invariants: mlx-lock

                async def prefill(self, prompt):
                    async with self._generation_lock:
                        return self.engine.encode(prompt)

                async def count_tokens(self, prompt):
                    async with self._generation_lock:
                        return len(self.engine.encode(prompt))

                async def embed(self, prompt):
                    async with self._generation_lock:
                        return mx.array(prompt)
        '''),
        Valid('''
            import asyncio

            from .engine import Engine


            class Server:
                def __init__(self):
                    self.engine = Engine()
                    self._generation_lock = asyncio.Lock()

                async def generate(self, prompt):
                    async with self._generation_lock:
                        return await asyncio.to_thread(self.engine.generate_all, prompt)

                async def count_tokens(self, prompt):
                    async with self._generation_lock:
                        return len(self.engine.encode(prompt))
        ''', options=_LOCK, files=_ENGINE),
        Valid('''
            import asyncio

            from .engine import Engine


            class Server:
                def __init__(self):
                    self.engine = Engine()
                    self._generation_lock = asyncio.Lock()

                async def generate(self, prompt):
                    async with self._generation_lock:
                        return await self._run(prompt)

                async def _run(self, prompt):
                    return await asyncio.to_thread(self.engine.generate_all, prompt)
        ''', options=_LOCK, files=_ENGINE),
        # The lock is Server's: a class that never takes it is not judged by it.
        Valid('''
            import asyncio

            from .engine import Engine


            class Server:
                def __init__(self):
                    self.engine = Engine()
                    self._generation_lock = asyncio.Lock()

                async def count_tokens(self, prompt):
                    async with self._generation_lock:
                        return len(self.engine.encode(prompt))


            class Warmup:
                def __init__(self):
                    self.engine = Engine()
                    self._generation_lock = asyncio.Lock()

                async def run(self, prompt):
                    return len(self.engine.encode(prompt))
        ''', options=_LOCK, files=_ENGINE),
        # No lock declared: the project did not ask.
        Valid('''
            import asyncio

            from .engine import Engine


            class Server:
                def __init__(self):
                    self.engine = Engine()

                async def count_tokens(self, prompt):
                    return len(self.engine.encode(prompt))
        ''', options=_ONLY, files=_ENGINE),
        # The owner executor serializes MLX by itself.
        Valid('''
            import asyncio
            from concurrent.futures import ThreadPoolExecutor

            from .engine import Engine


            class Server:
                def __init__(self):
                    self.engine = Engine()
                    self._generation_lock = asyncio.Lock()
                    self._mlx_executor = ThreadPoolExecutor(max_workers=1)

                async def generate(self, prompt):
                    loop = asyncio.get_running_loop()
                    return await loop.run_in_executor(self._mlx_executor, self.engine.generate_all, prompt)

                async def count_tokens(self, prompt):
                    async with self._generation_lock:
                        return len(self.engine.encode(prompt))
        ''', options={**_LOCK, "owner-executors": ["self._mlx_executor"]}, files=_ENGINE),
        # A loop that runs on the owner thread, declared so.
        Valid('''
            import asyncio

            from .engine import Engine


            class Server:
                def __init__(self):
                    self.engine = Engine()
                    self._generation_lock = asyncio.Lock()

                async def _owner_main(self, prompts):  # invariants: owner-thread
                    return [len(self.engine.encode(p)) for p in prompts]

                async def count_tokens(self, prompt):
                    async with self._generation_lock:
                        return len(self.engine.encode(prompt))
        ''', options=_LOCK, files=_ENGINE),
    ]
