from __future__ import annotations

from mlx_invariants.checker.model.queries import INFERENCE_ON_LOOP_MESSAGE
from mlx_invariants.checker.rule import PACKAGE_ONLY, Invalid, Rule, Valid

# An embeddings module of the kind a retrieval server keeps: the model loaded once, encoded per request.
_EMBEDDINGS = {"app/embeddings.py": '''
    from sentence_transformers import SentenceTransformer


    class Embedder:
        def __init__(self, name):
            self.model = SentenceTransformer(name)

        def embed(self, texts):
            return self.model.encode(texts, normalize_embeddings=True).tolist()
'''}


class BlockingInferenceOnEventLoop(Rule):
    """INV108's hazard for the backends that are not MLX. An `async def` runs on the event loop's one thread: a
    model library's inference called there (an embedding model's `encode`, a Whisper transcription, an ONNX
    session's `run`, a llama.cpp completion) holds that thread for the whole computation, tens of milliseconds
    to minutes, and meanwhile no other request, stream, websocket frame or timer of the server moves. Servers
    with several backends keep the model on an object made once (`self.model = SentenceTransformer(name)`) and
    call it from a coroutine through a sync helper of another module, which is where this rule follows it.
    wadyatalkinabewt/koe's transcription routes run faster-whisper on the loop, under a threading lock, through
    its engine class (src/server.py@db357b7:481, whisper_engine.py); joonsoome/embed-rerank's torch reranker
    backend calls `CrossEncoder.predict` in an async method (app/backends/torch_reranker_backend.py@18a792d:90,
    while its other backends use `run_in_executor`); collabora/WhisperLive's REST stream transcribes in its SSE
    generator (whisper_live/server.py@bde730b:507).

    Most servers reach their models through objects nothing types: a backend picked at run time, an engine
    loaded by another library, a global filled lazily. There the call is judged by what it says: a method
    inference libraries name so, alone or with what it works on (`transcribe`, `transcribe_file`, `generate`,
    `generate_speech`, `synthesize`, `embed`, `rerank`, `predict`, `diarize`, `encode` on a model or an embedder;
    not `generate_id`, `generate_progress`, a model's `embed_tokens` layer, nor a `*_stream()` that is not
    iterated where it is made) on a receiver whose name ends in a word for what holds a model
    (`_stt_engine`, `local_model`, `reranker`, `embeddings_backend`; not `model_name` or `user_service`), not
    awaited, and its result not run as an awaitable anywhere (`await wrapper(engine.generate(...))`, `async for`
    over it, a task or `wait_for` made of it, a coroutine returning it as it is: an async backend's call). A
    call the package model follows into a def of the package is judged there instead, and a generator made on
    the loop and stepped on a thread (`gen = chat_stream(messages)`, then `to_thread(next, gen)`) runs there. waybarrios/vllm-mlx's
    speech and embedding routes call `_stt_engine.transcribe`, `_tts_engine.generate` and
    `_embedding_engine.embed` inline (vllm_mlx/server.py@4b654c0, the HEAD of docs/corpus.md);
    Blaizzy/mlx-audio's realtime websocket runs `stt_model.generate` on the loop while its other routes hand
    inference to a thread (mlx_audio/server.py@ebf44df:1203). Written from held-out misses:
    vectorize-io/hindsight's recall embedding (HS-RECALLEMBED) and open-jarvis/OpenJarvis's local transcription
    (OJ-TRANSCRIBE) reach the model through an untyped backend object. Such a call is judged in a module that
    imports no model library and nothing the checker knows as the package's: homelab-00/TranscriptionSuite's
    routes take their engine from the app's state and import the package by its installed name (`server.core`,
    while it lives in `server/backend`), and call `engine.transcribe_file(...)` inline
    (server/backend/api/routes/transcription.py@6e3ea51:265, TS-ROUTEBLOCK).

    The calls it knows by type (model/blocking.py): `SentenceTransformer.encode` (and `encode_query`,
    `encode_document`), `CrossEncoder.predict` and `rank`, faster-whisper's `WhisperModel.transcribe` and
    `detect_language`, openai-whisper's `transcribe`, `onnxruntime.InferenceSession.run`, and llama-cpp-python's
    completions and embeddings, on objects typed as the package model types receivers (an attribute its class
    assigns, a local). Not judged, as INV130 leaves its waits: start-up and teardown coroutines (a warm-up in a
    lifespan), a coroutine on an event loop of its own, the arm of a mode `if` whose other arm hands the work to
    a thread, set-up a start-up hook has run, tests, scripts and command lines, a call reached through a
    constructor or a model load, and a callable handed to a thread. MLX a typed call reaches is INV108's."""

    id = "INV138"
    catches = "a model's inference (typed: sentence-transformers, faster-whisper, onnxruntime, llama.cpp; or named: `backend.transcribe()`, `engine.generate()`) in an async def, itself or through the package's sync calls"
    message = INFERENCE_ON_LOOP_MESSAGE
    known_problems = (
        "A call judged by its name is a guess: a `generate` of an object named `engine` that returns at once (a "
        "request id, a handle) is reported as inference, and an inference method named otherwise (`run`, "
        "`__call__`, `process`) on an untyped object is not seen. A call on a tiny input (one short sentence for "
        "a small embedding model, half a second of audio) is reported as a long one. Like every rule of the "
        "package model, it reads a module only if it mentions MLX, imports from its package or imports one of "
        "the typed libraries (model/phase.py)."
    )
    # On by default. On the HEADs of the 281 repositories mirrored here (issue 23), graded blind: the typed calls,
    # 14 findings in 7 repositories, 12 true, 2 arguable (a voice-activity ONNX call on 32 ms of audio in two
    # single-user apps), none false; the calls judged by name (fourteenth session), 60 more findings in 29
    # repositories, 45 true, 15 arguable (a single sentence for a small embedding model, a file nothing launches,
    # a one-shot command line or batch job, a localhost sidecar with one client), none false; then methods named
    # for a verb and its object (`transcribe_file`, `synthesize_full`), 15 more, 9 true and 6 false: a streaming
    # session made and kept (`transcribe_stream()`), and five streams of a sync backend made on the loop and
    # stepped on a thread, both left out since. In all, 83 findings: 66 true, 17 arguable, none false.
    triggers = PACKAGE_ONLY

    INVALID = [
        Invalid('''
            import onnxruntime


            class VoiceActivity:
                def __init__(self, path):
                    self.session = onnxruntime.InferenceSession(path)

                async def on_frame(self, frame, state):
                    speech, state = self.session.run(None, {"input": frame, "state": state})  # expect: INV138
                    return float(speech[0][0]) > 0.5, state
        '''),
        Invalid('''
            from fastapi import FastAPI

            from .embeddings import Embedder

            app = FastAPI()
            embedder = Embedder("all-MiniLM-L6-v2")


            @app.post("/v1/embeddings")
            async def embeddings(body: dict):
                return {"data": embedder.embed(body["input"])}  # expect: INV138
        ''', files=_EMBEDDINGS),
        Invalid('''
            from faster_whisper import WhisperModel


            class Transcriber:
                def __init__(self, size):
                    self.model = WhisperModel(size, compute_type="int8")

                def text_of(self, path):
                    segments, _info = self.model.transcribe(path, beam_size=5)
                    return " ".join(s.text for s in segments)

                async def transcribe(self, upload):
                    return {"text": self.text_of(upload)}  # expect: INV138
        '''),
        # The backend is picked at run time, so nothing types it: the call names the inference, the receiver the model.
        Invalid('''
            from fastapi import FastAPI, UploadFile

            from .backends import pick_backend

            app = FastAPI()


            @app.post("/v1/audio/transcriptions")
            async def transcriptions(file: UploadFile):
                stt_backend = pick_backend()
                text = stt_backend.transcribe(await file.read())  # expect: INV138
                return {"text": text}


            @app.post("/v1/audio/files")
            async def transcribe_file(path: str):
                return {"text": pick_backend().transcribe_file(path)}  # expect: INV138


            @app.post("/v1/embeddings")
            async def embeddings(texts: list[str]):
                embeddings_backend = pick_backend()
                return {"data": embeddings_backend.encode(texts).tolist()}  # expect: INV138
        ''', files={"app/backends.py": '''
            import importlib

            def pick_backend():
                return importlib.import_module("stt_plugins").load()
        '''}),
        Invalid('''
            from fastapi import FastAPI, Request

            app = FastAPI()


            @app.post("/transcribe")
            async def transcribe(request: Request, path: str):
                engine = request.app.state.stt_engine
                result = engine.transcribe_file(path, language="en")  # expect: INV138
                return {"text": result.text}
        '''),
    ]
    VALID = [
        Valid('''
            import asyncio

            import onnxruntime


            class VoiceActivity:
                def __init__(self, path):
                    self.session = onnxruntime.InferenceSession(path)

                async def on_frame(self, frame, state):
                    speech, state = await asyncio.to_thread(
                        self.session.run, None, {"input": frame, "state": state})
                    return float(speech[0][0]) > 0.5, state
        '''),
        Valid('''
            import asyncio

            from fastapi import FastAPI

            from .embeddings import Embedder

            app = FastAPI()
            embedder = Embedder("all-MiniLM-L6-v2")


            @app.post("/v1/embeddings")
            async def embeddings(body: dict):
                return {"data": await asyncio.to_thread(embedder.embed, body["input"])}
        ''', files=_EMBEDDINGS),
        # A warm-up before the server serves: nothing waits behind it.
        Valid('''
            from contextlib import asynccontextmanager

            from fastapi import FastAPI

            from .embeddings import Embedder

            embedder = Embedder("all-MiniLM-L6-v2")


            @asynccontextmanager
            async def lifespan(app):
                embedder.embed(["warm-up"])
                yield


            app = FastAPI(lifespan=lifespan)
        ''', files=_EMBEDDINGS),
        # An async backend's calls, run as awaitables where they are made or later, the `encode` of a tokenizer and
        # of a string, a streaming session made and kept: none holds the loop.
        Valid('''
            import asyncio

            from .disconnect import until_disconnected


            class Chat:
                def __init__(self, engine, tokenizer, model_name):
                    self.engine = engine
                    self.tokenizer = tokenizer
                    self.model_name = model_name

                async def complete(self, prompt):
                    ids = self.tokenizer.encode(prompt)
                    key = self.model_name.encode()
                    pending = self.engine.generate(ids, cache_key=key, request=self.engine.generate_request_id())
                    return await asyncio.wait_for(pending, timeout=60)

                async def answer(self, prompt, request):
                    return await until_disconnected(self.engine.generate(prompt), request)

                async def stream(self, prompt):
                    async for chunk in self.engine.generate(prompt):
                        yield chunk

                async def stream_of(self, prompt):
                    return self.engine.generate(prompt)

                async def live_session(self, stt_model):
                    session = stt_model.transcribe_stream(context_size=(256, 256))
                    self.sessions.append(session)
                    return len(self.sessions)
        '''),
        # A sync backend's stream made on the loop and stepped on a thread: its body runs there.
        Valid('''
            import asyncio

            from .backends import llm_backend


            def chat_stream(messages):
                return llm_backend.generate_chat_completion(messages)


            async def stream_chunks(messages):
                chunks = chat_stream(messages)
                while (chunk := await asyncio.to_thread(next, chunks, None)) is not None:
                    yield chunk
        '''),
    ]
