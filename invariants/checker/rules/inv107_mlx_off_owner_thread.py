from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from mlx_invariants.checker import mlx_api
from mlx_invariants.checker.iteration import CONSUMERS
from mlx_invariants.checker.locks import is_lock, shared_lock
from mlx_invariants.checker.loop_owner import handed_reaches
from mlx_invariants.checker.model.queries import OFF_OWNER_MESSAGE, off_owner_wording
from mlx_invariants.checker.names import dotted
from mlx_invariants.checker.nodes import children
from mlx_invariants.checker.offload import (
    Handoff, handoff, iterated_in_pool, only_makes_generator, shifting_pool, streamed_handoff, unwrap_callable,
)
from mlx_invariants.checker.rule import Invalid, Rule, Valid
from mlx_invariants.checker.walker import OWN_BODY_STOP

if TYPE_CHECKING:
    from collections.abc import Callable

    from mlx_invariants.checker.facts import CallSite, FunctionFacts
    from mlx_invariants.checker.walker import FileContext


# A preview endpoint that asks a runtime module for its engine manager, then hands the generation to the pool.
_PREVIEW = '''
    import asyncio

    from mlx_lm import generate

    from . import runtime


    async def preview(prompt):
        try:
            manager = runtime.get_engine_manager()
            return await asyncio.to_thread(generate, manager.model, manager.tokenizer, prompt)  # expect: INV107
        except Exception:
            return None
'''


# An engine with optional backends: mlx-lm imported lazily, its generation wrapped in an async adapter whose
# constructor keeps the generator and whose `__anext__` steps it, one `next()` per token, on {pool}
# (avalan-ai/avalan's MlxLmStream, src/avalan/model/nlp/text/mlxlm.py@861b268:99).
_ADAPTER = '''
    import asyncio
    import importlib
    from typing import Any, Callable, Iterator, cast
    {setup}

    def _require_mlx_lm():
        return importlib.import_module("mlx_lm")


    class TokenStream:
        _DONE = object()

        def __init__(self, generator: Iterator[object]):
            self._iterator = generator

        def __aiter__(self):
            return self

        async def __anext__(self):
            loop = asyncio.get_running_loop()
            item = await loop.run_in_executor({pool}, next, self._iterator, self._DONE){expect}
            if item is self._DONE:
                raise StopAsyncIteration
            return item.text


    class MlxBackend:
        def __init__(self, model, tokenizer):
            self.model, self.tokenizer = model, tokenizer

        async def stream(self, prompt):
            stream_generate = cast(Callable[..., Any], getattr(_require_mlx_lm(), "stream_generate"))
            async for text in TokenStream(iter(stream_generate(self.model, self.tokenizer, prompt))):
                yield text
'''


# Checked as a package: the package model follows the generator from the backend's call into the adapter.
_PACKAGE = {"app/settings.py": "PORT = 8000\n"}


# A route module that streams a generation through the stepping helper of the main module (below).
_STREAM_ROUTE = '''
    from mlx_lm import stream_generate

    from .main import chunks


    def tokens(model, tokenizer, prompt):
        for response in stream_generate(model, tokenizer, prompt):
            yield response.text


    async def completions(model, tokenizer, prompt):
        async for text in chunks(tokens(model, tokenizer, prompt)):
            yield text
'''
# The helper: each `next()` of the generator it is handed runs on the pool named by `pool`; it names no MLX.
_STEPPER = '''
    import asyncio
    {setup}

    async def chunks(generator):
        loop = asyncio.get_running_loop()

        def get_next():
            return next(generator, None)

        while (chunk := await loop.run_in_executor({pool}, get_next)) is not None:{expect}
            yield chunk
'''


@dataclass
class _Candidate:
    work: Handoff
    target: cst.BaseExpression
    statement: cst.CSTNode | None
    streamed: bool  # a sync generator handed to a streaming response: judged once the file's defs are known
    stepped: cst.BaseExpression | None = None  # the generator the builtin `next` handed over steps
    locked: bool = False  # awaited inside `async with <lock>`: one call at a time while the lock is held


class MlxOffOwnerThread(Rule):
    """MLX work belongs to one owner thread. A pool whose thread changes from
    call to call breaks that in two ways, depending on the MLX version. Before
    MLX 0.31.2 every thread shares one stream and MLX is not thread-safe, so two
    requests handed to the pool at once are inside Metal together. From 0.31.2
    each thread has its own streams and command encoders: work whose arrays are
    all evaluated runs on any thread, but an array left lazy on another thread,
    or a stream made there with `mx.new_stream` (a module's generation stream),
    raises "There is no Stream(gpu, N) in current thread". Hand MLX work to the
    owner: a dedicated long-lived thread fed by a queue (the recommended pattern,
    never flagged), or an executor with exactly one thread, which runs every
    call on the same thread however it is reached (a module global behind a
    getter, an attribute of another object, a class attribute).

    So only pools known to change threads are judged: `asyncio.to_thread`, the
    loop's default executor (`run_in_executor(None, ...)`), a thread pool this
    file builds with more than one worker, and Starlette's hidden one: a sync
    generator handed to `StreamingResponse` (FastAPI's, or sse-starlette's
    `EventSourceResponse`) is iterated with `iterate_in_threadpool`, each step on
    whichever pool thread is free, so two streams run MLX on two threads at once
    and one stream hops threads between chunks (mlx-audio's transcription stream,
    server.py@c64890e:426, fixed in c5a8b90 by one inference thread that owns
    every model call). An executor the file cannot identify is not judged.

    Handing the builtin `next` over with a generator (`run_in_executor(None,
    next, gen)`, `asyncio.to_thread(next, gen)`) runs one step of it on the
    pool, so a generation hops threads from token to token, and two streams
    step at once. It is judged like the rest when the generator is an MLX one:
    an mlx-lm/mlx-vlm stream, a model's stream method, or a generator def of
    this file whose body reaches MLX. mlx-manager stepped its `stream_generate`
    wrapper this way in four handlers
    (backend/mlx_manager/mlx_server/services/inference.py@5da7b61:194, :311,
    :509, :600), fixed in fa74ffa by one thread per generation that feeds a
    queue.

    Which regime holds is read from the project (docs/checker.md, "MLX
    version"): where it admits only MLX 0.31.2 or later the finding is not
    reported, unless the work generates with mlx-lm or mlx-vlm (or a wrapper of
    them) and the project admits an mlx-lm older than 0.31.3 or an mlx-vlm
    older than 0.5.0, whose generation stream was still an `mx.new_stream` made
    on the importing thread (ml-explore/mlx#3727); where the version is
    unknown the message says which versions it is about."""

    id = "INV107"
    catches = ("MLX work handed to asyncio.to_thread, the default pool, a thread pool of several workers, or "
               "Starlette's pool (a sync generator given to StreamingResponse)")
    message = OFF_OWNER_MESSAGE
    known_problems = (
        "Follows the callable into functions and methods of the same file only; a model call is "
        "recognised by name (model-names) in files that import mlx, or by a model loader's result assigned "
        "to the same name in the file (INV108). Judges the default pool and the thread "
        "pools this file builds: an executor created elsewhere (handed in, returned by a getter, kept on "
        "another object) is not judged, whatever it is, and neither is a pool whose worker count is computed "
        "(`ThreadPoolExecutor(max_workers=n)`). A pool is known by the name, attribute or mapping key it is "
        "assigned to (`app[POOL] = ThreadPoolExecutor(4)` makes `request.app[POOL]` that pool, whichever "
        "object holds the mapping, so two mappings that reuse one key for different pools are confused); "
        "one assignment of a one-worker pool among several makes it an owner. A default executor replaced "
        "with a one-worker pool (`loop.set_default_executor`) is not seen: `asyncio.to_thread` is still "
        "judged. A streaming response is judged only when its content is a call of a sync generator defined in "
        "the same file (`StreamingResponse(stream(model, prompt))`); one built elsewhere, or handed over as a "
        "variable, is not followed. `next` handed over is judged by the generator after it: one made in the same "
        "def (or the module body), or the call itself; a generator kept on an attribute or handed in is judged only "
        "when it is an mlx-lm stream. In a project on MLX 0.31.2 or later (and a new enough generation library) nothing is reported, "
        "so a lazy array or an `mx.new_stream` stream handed to the pool, which raises there, is left to "
        "the fuzzer (`mlx-no-stream`). Through the package model, a handoff at start-up (a lifespan before its "
        "`yield`, a start-up hook, a coroutine before the statement that calls its uvicorn or hypercorn serve, and "
        "a coroutine only those await, through plain awaits) and one whose MLX all runs under the package's MLX lock (declared, or "
        "inferred) are not reported: start-up meets no request's MLX in Metal, and the lock lets one thread in at a "
        "time; start-up that runs two handoffs at once (a `gather` of two loads) is not reported either. Start-up is "
        "taken as the code before serving, not the work it starts: a pool handoff there that is not awaited (a `submit` left running, a "
        "`create_task` of one) runs on while the server serves and is still not reported; a server started another way "
        "(`uvicorn.run` in a thread, a serve method of the project's own) makes no start-up span. The per-file rule knows a "
        "shared lock only as one the file imports from a module of its project (a def of the file that takes "
        "it around all its MLX is not reported); a lock of the file's own that other modules import is not seen. "
        "A generation handed over one at a time under a lock is reported only for a project that may run MLX 0.31.2 "
        "or later with a generation library older than its thread-local stream (mlx-lm 0.31.3, mlx-vlm 0.5.0), "
        "where the library's stream fails on the pool thread whatever the lock."
    )
    triggers = (("to_thread", "run_in_executor", "submit", "run_sync", "StreamingResponse", "EventSourceResponse"),
                ("mlx",))

    INVALID = [
        # The builtin `next` handed over with an MLX generator: each step on whichever pool thread is free.
        Invalid('''
            import asyncio
            from mlx_lm import stream_generate

            async def stream(model, tokenizer, prompt):
                def tokens():
                    for response in stream_generate(model, tokenizer, prompt):
                        yield response.text

                generator = tokens()
                loop = asyncio.get_running_loop()
                while (text := await loop.run_in_executor(None, next, generator, None)) is not None:  # expect: INV107
                    yield text

            async def first(model, tokenizer, prompt):
                responses = stream_generate(model, tokenizer, prompt)
                return await asyncio.to_thread(next, responses)  # expect: INV107
        '''),
        Invalid('''
            import asyncio
            import mlx.core as mx

            async def evaluate(logits):
                return await asyncio.to_thread(lambda: mx.eval(logits))  # expect: INV107
        '''),
        Invalid('''
            import asyncio
            from mlx_lm import stream_generate

            class Engine:
                def _run(self, prompt):
                    return list(stream_generate(self.model, self.tokenizer, prompt))

                async def generate(self, prompt):
                    loop = asyncio.get_running_loop()
                    return await loop.run_in_executor(None, self._run, prompt)  # expect: INV107
        '''),
        Invalid('''
            import asyncio
            from concurrent.futures import ThreadPoolExecutor
            from mlx_lm import load, stream_generate

            POOL = "pool"

            def make_app(app, path):
                app[POOL] = ThreadPoolExecutor(4)

            async def on_startup(app, path):
                loop = asyncio.get_running_loop()
                app["model"] = await loop.run_in_executor(app[POOL], load, path)  # expect: INV107

            def run(model, tokenizer, prompt):
                return list(stream_generate(model, tokenizer, prompt))

            async def completions(request, prompt):
                loop = asyncio.get_running_loop()
                model, tokenizer = request.app["model"]
                return await loop.run_in_executor(request.app[POOL], run, model, tokenizer, prompt)  # expect: INV107
        '''),
        Invalid('''
            import asyncio
            from concurrent.futures import ThreadPoolExecutor
            import mlx.core as mx

            class Embedder:
                def __init__(self, model):
                    self.model = model
                    self._pool = ThreadPoolExecutor(thread_name_prefix="embed")

                def _embed(self, batch):
                    vectors = self.model(mx.array(batch))
                    mx.eval(vectors)
                    return vectors

                async def embed(self, batch):
                    loop = asyncio.get_running_loop()
                    return await loop.run_in_executor(self._pool, self._embed, batch)  # expect: INV107
        '''),
        Invalid('''
            from fastapi.responses import StreamingResponse
            from mlx_lm import stream_generate

            def tokens(model, tokenizer, prompt):
                for response in stream_generate(model, tokenizer, prompt):
                    yield response.text

            async def completions(model, tokenizer, prompt):
                return StreamingResponse(tokens(model, tokenizer, prompt))  # expect: INV107
        '''),
        # The model is known by its loader (mlx-audio's transcription stream, server.py@c64890e:426).
        Invalid('''
            import mlx.core as mx
            from fastapi.responses import StreamingResponse

            def transcription(stt_model, path):
                for chunk in stt_model.generate(path, stream=True):
                    yield chunk.text

            async def transcribe(provider, name, path):
                stt_model = provider.load_model(name)
                return StreamingResponse(transcription(stt_model, path))  # expect: INV107
        '''),
        # Where the project's version is unknown (the examples above), or known and older, it is reported.
        Invalid('''
            import asyncio
            from mlx_lm import stream_generate

            async def complete(model, tokenizer, prompt):
                return await asyncio.to_thread(lambda: list(stream_generate(model, tokenizer, prompt)))  # expect: INV107
        ''', files={"pyproject.toml": '''
            [project]
            name = "app"
            dependencies = ["mlx>=0.31.2", "mlx-lm>=0.31.2"]  # mlx-lm's generation stream: thread-local in 0.31.3
        '''}),
        # A warm-up awaited at start-up by a coroutine a route awaits too, and one handed over beside the serve
        # call: both run while requests are served (the VALIDs below are start-up only).
        Invalid('''
            import asyncio

            import mlx.core as mx
            import uvicorn
            from fastapi import FastAPI

            app = FastAPI()

            def warm_up(model):
                mx.eval(model(mx.array([[1]])))

            async def warm(model):
                await asyncio.to_thread(warm_up, model)  # expect: INV107

            @app.post("/reset")
            async def reset(model):
                await warm(model)

            async def run_server(config, model):
                await warm(model)
                server = uvicorn.Server(config)
                await asyncio.gather(asyncio.to_thread(warm_up, model), server.serve())  # expect: INV107
        ''', files={"app/settings.py": "PORT = 8000\n"}),
        Invalid(_PREVIEW, files={"app/runtime.py": '''
            def get_engine_manager():
                return None
        '''}),
        # A helper that steps whatever generator it is handed on the default pool, one `next()` per chunk, and a
        # route of another module that hands it an MLX generation (heylookitsanllm's stream wrapper,
        # src/heylook_llm/streaming_utils.py@4ce23f9:56): the generation hops threads from token to token, and two
        # streams step at once. Reported at the helper's handoff, where the fix goes.
        Invalid(_STEPPER.format(pool="None", setup="", expect="  # expect: INV107"),
                files={"app/routes.py": _STREAM_ROUTE}),
        Invalid(_ADAPTER.format(pool="None", setup="", expect="  # expect: INV107"), files=_PACKAGE),
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
                    for text in await loop.run_in_executor(None, lambda: tokens()):
                        yield text
        '''),
        # The same helper stepping every stream on one worker thread: the owner.
        Valid(_STEPPER.format(pool="_OWNER", expect="", setup="from concurrent.futures import ThreadPoolExecutor\n\n"
                              "    _OWNER = ThreadPoolExecutor(1)"), files={"app/routes.py": _STREAM_ROUTE}),
        Valid(_ADAPTER.format(pool="_OWNER", expect="", setup="from concurrent.futures import ThreadPoolExecutor\n\n"
                              "    _OWNER = ThreadPoolExecutor(max_workers=1)"), files=_PACKAGE),
        # Code that cannot run: the module never defines what the endpoint asks of it (AttributeError, caught), so
        # the handoff after it never happens (qwen3-tts-apple-silicon's voice lab, issue 23's set h, graded false).
        Valid(_PREVIEW.replace("  # expect: INV107", ""), files={"app/runtime.py": '''
            def get_model_manager():
                return None
        '''}),
        # A method the manager's class never defines (the manager the getter's annotation types): the session
        # is never entered, so its body never runs (the same voice lab's design preview).
        Valid('''
            import asyncio

            from mlx_lm import generate

            from .runtime import get_model_manager


            async def design(prompt):
                manager = get_model_manager()
                async with manager.generation_session("design"):
                    return await asyncio.to_thread(generate, manager.model, manager.tokenizer, prompt)
        ''', files={"app/runtime.py": '''
            class ModelManager:
                def __init__(self):
                    self.model = self.tokenizer = None

                def unload(self):
                    self.model = None


            def get_model_manager() -> ModelManager:
                return ModelManager()
        '''}),
        # And a name the file binds nowhere (NameError): the engine cannot even be built (growin-app, set j).
        Valid('''
            import asyncio

            from mlx_lm import generate


            class Engine:
                def __init__(self, model, tokenizer):
                    self.model, self.tokenizer = model, tokenizer

                async def complete(self, prompt):
                    limit = int(os.getenv("MAX_TOKENS", "256"))
                    return await asyncio.to_thread(generate, self.model, self.tokenizer, prompt, max_tokens=limit)
        ''', files={"app/settings.py": "MAX_TOKENS = 256\n"}),
        # Start-up (checker/startup.py), through the package model: everything a coroutine runs before it calls
        # its server's serve, and a coroutine only that awaits, runs before anyone is served; no request's MLX
        # can be in Metal beside it (issue 23: flowtailor-de/live-translation src/main.py@472081f:165-178,
        # 232-300, graded arguable blind).
        Valid('''
            import asyncio

            import mlx.core as mx
            import uvicorn

            def warm_up(model):
                mx.eval(model(mx.array([[1]])))

            async def preload(model):
                await asyncio.to_thread(warm_up, model)

            async def run_server(config, model):
                await preload(model)
                await asyncio.to_thread(warm_up, model)
                server = uvicorn.Server(config)
                await server.serve()
        ''', files={"app/settings.py": "PORT = 8000\n"}),
        # A lifespan awaiting a preload of another module before its `yield`: the preload's handoff is start-up.
        Valid('''
            from contextlib import asynccontextmanager

            from fastapi import FastAPI

            from .stt import preload_stt

            @asynccontextmanager
            async def lifespan(app):
                app.state.stt = await preload_stt("mlx-community/whisper-tiny")
                yield

            app = FastAPI(lifespan=lifespan)
        ''', files={"app/stt.py": '''
            import asyncio

            import mlx.core as mx

            def _load(path):
                weights = mx.load(path)
                mx.eval(weights)
                return weights

            async def preload_stt(path):
                return await asyncio.to_thread(_load, path)
        '''}),
        # A name holding `load_model` inside `download_model` moves a file, it loads nothing (set j, graded false).
        Valid('''
            import asyncio

            import mlx.core as mx

            async def fetch(llm_manager, name):
                return await asyncio.to_thread(llm_manager.download_model, name)
        '''),
        # A project that names no mlx but requires mlx-lm 0.31.3, whose own metadata requires mlx 0.31.2: both
        # facts hold (pins.IMPLIED; issue 23, set j: Poppy, graded false).
        Valid('''
            import asyncio
            from mlx_lm import stream_generate

            async def complete(model, tokenizer, prompt):
                return await asyncio.to_thread(lambda: list(stream_generate(model, tokenizer, prompt)))
        ''', files={"requirements.txt": "mlx-lm>=0.31.3\n"}),
        # A def named like a loader is judged by its body: this one only records a model's name, and the
        # library loads it where it is used (smart-home's Whisper front end, issue 23's set c, graded false).
        # Work that takes the lock the package's modules share around all its MLX: one thread in Metal at a time.
        Valid('''
            import asyncio

            import mlx.core as mx

            from .llm import respond
            from .mlx_lock import MLX_LOCK

            def embed(model, x):
                with MLX_LOCK:
                    out = model(x)
                    mx.eval(out)
                    return out

            async def embeddings(model, x):
                return await asyncio.to_thread(embed, model, x)

            async def reply(model, x):
                return await asyncio.to_thread(respond, model, x)
        ''', files={"app/mlx_lock.py": '''
            import threading

            MLX_LOCK = threading.Lock()
        ''', "app/llm.py": '''
            import mlx.core as mx

            from .mlx_lock import MLX_LOCK

            def respond(model, x):
                with MLX_LOCK:
                    out = model(x)
                    mx.eval(out)
                    return out
        '''}),
        Valid('''
            import asyncio

            import mlx_lm

            _model = None

            def _load_model():
                global _model
                if _model is None:
                    _model = "mlx-community/whisper-tiny"
                return _model

            def transcribe(path):
                return _load_model(), path

            async def preload():
                await asyncio.to_thread(_load_model)

            async def handle(path):
                return await asyncio.to_thread(transcribe, path)
        '''),
        Valid('''
            import asyncio
            import mlx.core as mx

            async def evaluate(owner, logits):
                return await owner.submit(lambda: mx.eval(logits))
        ''', options={"owner-executors": ["owner"]}),
        Valid('''
            import asyncio
            from concurrent.futures import ThreadPoolExecutor
            from mlx_lm import stream_generate

            class Engine:
                def __init__(self):
                    self._mlx_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlx-owner")

                def _run(self, prompt):
                    return list(stream_generate(self.model, self.tokenizer, prompt))

                async def generate(self, prompt):
                    loop = asyncio.get_running_loop()
                    return await loop.run_in_executor(self._mlx_executor, self._run, prompt)
        '''),
        Valid('''
            import threading
            from mlx_lm import stream_generate

            class Engine:
                def start(self):
                    self._owner = threading.Thread(target=self._owner_loop, name="mlx-owner", daemon=True)
                    self._owner.start()

                def _owner_loop(self):
                    for request in iter(self._inbox.get, None):
                        for response in stream_generate(self.model, self.tokenizer, request.prompt):
                            self._loop.call_soon_threadsafe(request.queue.put_nowait, response)
        '''),
        Valid('''
            import asyncio
            import json

            async def save(path, data):
                await asyncio.to_thread(lambda: path.write_text(json.dumps(data)))
        '''),
        Valid('''
            import asyncio
            from concurrent.futures import ThreadPoolExecutor
            from mlx_lm import load, stream_generate

            MLX = "mlx"

            def make_app(app, path):
                app[MLX] = ThreadPoolExecutor(1, thread_name_prefix="mlx")  # the one thread that owns MLX

            async def on_startup(app, path):
                loop = asyncio.get_running_loop()
                app["model"] = await loop.run_in_executor(app[MLX], load, path)

            def run(model, tokenizer, prompt):
                return list(stream_generate(model, tokenizer, prompt))

            async def completions(request, prompt):
                loop = asyncio.get_running_loop()
                model, tokenizer = request.app["model"]
                return await loop.run_in_executor(request.app[MLX], run, model, tokenizer, prompt)
        '''),
        Valid('''
            import asyncio
            from concurrent.futures import ThreadPoolExecutor
            import mlx.core as mx

            class Embedder:
                def __init__(self, model):
                    self.model = model
                    self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embed")

                def _embed(self, batch):
                    vectors = self.model(mx.array(batch))
                    mx.eval(vectors)
                    return vectors

                async def embed(self, batch):
                    loop = asyncio.get_running_loop()
                    return await loop.run_in_executor(self._pool, self._embed, batch)
        '''),
        Valid('''
            import asyncio
            from concurrent.futures import ThreadPoolExecutor
            import mlx.core as mx

            _mlx_executor = None

            def get_mlx_executor():
                global _mlx_executor
                if _mlx_executor is None:
                    _mlx_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlx")
                return _mlx_executor

            async def evaluate(logits):
                loop = asyncio.get_running_loop()
                return await loop.run_in_executor(get_mlx_executor(), lambda: mx.eval(logits))
        '''),
        Valid('''
            import asyncio
            from mlx_lm import stream_generate

            class Engine:
                def __init__(self, core):
                    self._core = core  # core._mlx_executor: the one thread its scheduler steps on

                def _run(self, prompt):
                    return list(stream_generate(self.model, self.tokenizer, prompt))

                async def generate(self, prompt):
                    loop = asyncio.get_running_loop()
                    return await loop.run_in_executor(self._core._mlx_executor, self._run, prompt)
        '''),
        Valid('''
            import asyncio
            from fastapi.responses import StreamingResponse

            async def tokens(owner, prompt):
                queue = asyncio.Queue()
                owner.submit(prompt, queue)  # the one thread that owns MLX fills the queue
                while (text := await queue.get()) is not None:
                    yield text

            async def completions(owner, prompt):
                return StreamingResponse(tokens(owner, prompt))
        '''),
        # The loaded model's stream runs on the one thread that owns MLX, which fills the queue.
        Valid('''
            import asyncio
            import mlx.core as mx
            from fastapi.responses import StreamingResponse

            async def transcription(owner, stt_model, path):
                queue = asyncio.Queue()
                owner.submit(lambda: [queue.put_nowait(c.text) for c in stt_model.generate(path, stream=True)])
                while (text := await queue.get()) is not None:
                    yield text

            async def transcribe(owner, provider, name, path):
                stt_model = provider.load_model(name)
                return StreamingResponse(transcription(owner, stt_model, path))
        '''),
        # `next` stepping a generator with no MLX in it on the pool, or an MLX one on the one owner thread.
        Valid('''
            import asyncio
            from concurrent.futures import ThreadPoolExecutor
            from mlx_lm import stream_generate

            OWNER = ThreadPoolExecutor(max_workers=1)

            async def lines(path):
                def read():
                    with open(path) as f:
                        yield from f

                reader = read()
                return await asyncio.to_thread(next, reader, None)

            async def stream(model, tokenizer, prompt):
                generator = stream_generate(model, tokenizer, prompt)
                loop = asyncio.get_running_loop()
                while (response := await loop.run_in_executor(OWNER, next, generator, None)) is not None:
                    yield response.text
        '''),
        # From MLX 0.31.2 (and mlx-lm 0.31.3 for a generation) a thread of its own is no bug by itself.
        Valid('''
            import asyncio
            import mlx.core as mx

            async def evaluate(logits):
                return await asyncio.to_thread(lambda: mx.eval(logits))
        ''', options={"mlx-version": "0.31.2"}),
        Valid('''
            import asyncio
            from mlx_lm import stream_generate

            async def complete(model, tokenizer, prompt):
                return await asyncio.to_thread(lambda: list(stream_generate(model, tokenizer, prompt)))
        ''', files={"pyproject.toml": '''
            [project]
            name = "app"
            dependencies = ["mlx>=0.31.2", "mlx-lm>=0.31.3"]
        '''}),
    ]

    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        self.candidates: list[_Candidate] = []
        self.awaited: set[int] = set()  # calls awaited directly (`await asyncio.to_thread(...)`)
        self.lock_blocks: list[int] = []  # the `async with <lock>:` blocks the walk is in, by id

    def visit_Await(self, node: cst.Await) -> None:
        self.awaited.add(id(node.expression))

    def visit_With(self, node: cst.With) -> None:
        if node.asynchronous is not None and any(is_lock(item.item, self.ctx) for item in node.items):
            self.lock_blocks.append(id(node))

    def leave_With(self, node: cst.With) -> None:
        if self.lock_blocks and self.lock_blocks[-1] == id(node):
            self.lock_blocks.pop()

    def visit_Call(self, node: cst.Call) -> None:
        work = handoff(node, self.ctx)
        streamed = work is None
        if streamed:
            work = streamed_handoff(node, self.ctx)
        if work is None:
            return
        target = unwrap_callable(work.target, self.ctx)
        if target is None:
            return
        self.ctx.pin(target, work.executor)
        stepped = _stepped(work, target, self.ctx)
        if stepped is not None:
            self.ctx.pin(stepped)
        locked = bool(self.lock_blocks) and id(node) in self.awaited
        self.candidates.append(_Candidate(work, target, self.ctx.statement, streamed, stepped, locked))

    def end(self) -> None:
        for candidate in self.candidates:
            work = candidate.work
            if candidate.streamed and not iterated_in_pool(work, self.ctx):
                continue
            if candidate.stepped is None and self._runs_nothing(candidate.target, candidate.streamed):
                continue
            if candidate.streamed:
                where = (f"Starlette's thread pool, where `{work.how}` runs each step of a sync generator "
                         "(iterate_in_threadpool: whichever thread is free, step by step)")
            elif work.executor is None:
                where = f"the default thread pool via {work.how} (a different thread each call)"
            else:
                pool = shifting_pool(work.executor, self.ctx)
                if pool is None:  # one thread, or not known here
                    continue
                where = f"`{dotted(work.executor) or 'an executor'}`, {pool} (any of them each call)"
            alone = False
            if candidate.stepped is not None:
                what, generates = self._steps(candidate.stepped, work.call)
                label = f"next({dotted(candidate.stepped) or '...'})"
            else:
                what = handed_reaches(candidate.target, self.ctx, mlx_api.reaches)
                generates = handed_reaches(candidate.target, self.ctx, mlx_api.generation) is not None
                label = dotted(candidate.target) or ("lambda" if isinstance(candidate.target, cst.Lambda) else "callable")
                # One call at a time (a lock held across the await, or one the work takes around all its
                # MLX) rules out two threads in Metal at once; a generation's stream is the library's, which
                # from MLX 0.31.2 raises on the pool thread all the same. A cancel that frees an awaited lock
                # early is INV105's.
                alone = what is not None and (candidate.locked or self._under_shared_lock(candidate.target))
            worded = off_owner_wording(label, what, where, generates, alone) if what is not None else None
            if worded is not None:
                self.ctx.report_at(self.id, work.call, candidate.statement, *worded)

    def _runs_nothing(self, target: cst.BaseExpression, streamed: bool) -> bool:
        """`target` names defs of this file that run no MLX on the thread they are handed to: an `async def`,
        whose call only makes a coroutine (the MLX runs where that is awaited), a def that only makes an
        MLX generator and hands it back (`return stream_generate(...)`), which runs where it is iterated, or,
        handed to a thread as a call (not streamed, where Starlette's pool steps it), a generator function of
        the file or a lambda calling one (offload.only_makes_generator).
        Issue 23, set f: crebAI hands its `async def _generate` and a `generate_streaming` that returns
        `stream_generate(...)` to the pool (app/llm/models/mlx_model.py@db71049:124, 193, 423, graded false
        blind; the MLX runs on the loop, where INV108 reports it)."""
        if not streamed and only_makes_generator(target, self.ctx):
            return True
        if not isinstance(target, cst.Name | cst.Attribute):
            return False
        functions = self.ctx.facts.by_key.get(self.ctx.key(target) or "", ())
        if not functions:
            return False
        for function in functions:
            node = function.node
            if isinstance(node, cst.FunctionDef) and node.asynchronous is not None:
                continue
            if _iterates(node) or self._runs_mlx_beyond(function, lambda site: mlx_api.makes_generator(site, self.ctx)):
                return False
        return True

    def _runs_mlx_beyond(self, function: FunctionFacts, left_out: Callable[[CallSite], bool]) -> bool:
        """Some call of `function`'s own body that `left_out` does not excuse runs MLX, itself or through the
        file's defs it calls."""
        direct = lambda site: mlx_api.reaches(site, self.ctx)  # noqa: E731
        return any(not left_out(site) and (direct(site) or any(
            self.ctx.facts.first_reaching(callee, direct) for callee in self.ctx.facts.by_key.get(site.key or "", ())))
            for site in function.calls)

    def _under_shared_lock(self, target: cst.BaseExpression) -> bool:
        """`target` names defs of this file whose every call that runs MLX (itself, or through the file's
        defs it calls) stands inside `with` a lock the process has one of (locks.shared_lock): two pool
        threads running it cannot be in Metal at once, the hazard before MLX 0.31.2 (a generation is still
        reported: its stream is the library's, whatever lock is held). Issue 23, set c: smart-home's
        transcription, handed to the pool under the process-wide `mlx_lock` its LLM and TTS take too
        (belle/stt.py@4e65c3a:301, graded false blind); set f: a lazy load under the module's `_load_lock`
        (qwen-text-server/server.py@58617bd:152, 494, 537, graded arguable blind)."""
        if not isinstance(target, cst.Name | cst.Attribute):
            return False
        functions = self.ctx.facts.by_key.get(self.ctx.key(target) or "", ())
        for function in functions:
            inside = _inside_shared_locks(function.node, self.ctx)
            if self._runs_mlx_beyond(function, lambda site: id(site.node) in inside):
                return False
        return bool(functions)

    def _steps(self, generator: cst.BaseExpression, call: cst.Call) -> tuple[str | None, bool]:
        """What one step of `generator` runs on the pool (`next` handed over with it), and whether it generates:
        an mlx-lm stream, a model's stream method, or a generator def of this file whose body reaches MLX."""
        if not mlx_api.is_mlx_generator(generator, self.ctx, self.ctx.facts.scope_of(call)):
            return None, False
        scope = self.ctx.facts.scope_of(call)
        own = mlx_api.own_generator(generator, self.ctx, lambda site: mlx_api.reaches(site, self.ctx), scope)
        generates = mlx_api.own_generator(generator, self.ctx, lambda site: mlx_api.generation(site, self.ctx), scope)
        return own or "next() on an MLX generator", own is None or generates is not None


def _stepped(work: Handoff, target: cst.BaseExpression, ctx) -> cst.BaseExpression | None:
    """`run_in_executor(None, next, gen)`, `to_thread(next, gen)`: the generator the builtin `next` steps
    there, one step per hand-off (the argument after the callable); None for any other callable."""
    if not (isinstance(target, cst.Name) and target.value == "next" and ctx.resolve(target) in (None, "next")):
        return None
    args = [a.value for a in work.call.args if a.keyword is None and not a.star]
    after = [i for i, value in enumerate(args) if value is work.target]
    return args[after[0] + 1] if after and after[0] + 1 < len(args) else None


def _inside_shared_locks(function: cst.CSTNode, ctx: FileContext) -> set[int]:
    """The ids of the calls in `function`'s own body that stand inside `with` a shared lock."""
    inside: set[int] = set()
    stack: list[tuple[cst.CSTNode, bool]] = [(child, False) for child in children(function)]
    while stack:
        node, locked = stack.pop()
        if isinstance(node, OWN_BODY_STOP):
            continue
        if locked and isinstance(node, cst.Call):
            inside.add(id(node))
        body_locked = locked or (isinstance(node, cst.With) and any(shared_lock(i.item, ctx) for i in node.items))
        stack.extend((child, body_locked if isinstance(node, cst.With) and child is node.body else locked)
                     for child in children(node))
    return inside


def _iterates(function: cst.CSTNode) -> bool:
    """`function`'s own body iterates something (a `for`, a comprehension, `yield`, a builtin that drains)."""
    stack = children(function)
    while stack:
        node = stack.pop()
        if isinstance(node, OWN_BODY_STOP):
            continue
        if isinstance(node, cst.For | cst.CompFor | cst.Yield):
            return True
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value in CONSUMERS:
            return True
        stack.extend(children(node))
    return False
