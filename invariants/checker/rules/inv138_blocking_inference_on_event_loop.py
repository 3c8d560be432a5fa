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
    generator (whisper_live/server.py@bde730b:507). Written from a class of held-out misses it does not catch
    itself (vectorize-io/hindsight's recall embedding, HS-RECALLEMBED; open-jarvis/OpenJarvis's local
    transcription, OJ-TRANSCRIBE: both reach the model through an untyped backend object).

    The calls it knows (model/blocking.py): `SentenceTransformer.encode` (and `encode_query`,
    `encode_document`), `CrossEncoder.predict` and `rank`, faster-whisper's `WhisperModel.transcribe` and
    `detect_language`, openai-whisper's `transcribe`, `onnxruntime.InferenceSession.run`, and llama-cpp-python's
    completions and embeddings, on objects typed as the package model types receivers (an attribute its class
    assigns, a local). Not judged, as INV130 leaves its waits: start-up and teardown coroutines (a warm-up in a
    lifespan), a coroutine on an event loop of its own, the arm of a mode `if` whose other arm hands the work to
    a thread, set-up a start-up hook has run, tests, scripts and command lines, a call reached through a
    constructor or a model load, and a callable handed to a thread. MLX is INV108's."""

    id = "INV138"
    catches = "a model library's inference (sentence-transformers, faster-whisper, onnxruntime, llama.cpp) in an async def, itself or through the package's sync calls"
    message = INFERENCE_ON_LOOP_MESSAGE
    known_problems = (
        "Only the libraries of the table are known, and only on a receiver the model can type: a model passed "
        "around untyped, a `transformers` pipeline or a torch module called directly, is not seen. A call on a "
        "tiny input (one short string) is reported as a long one. Like every rule of the package model, it reads "
        "a module only if it mentions MLX, imports from its package or imports one of these libraries "
        "(model/phase.py)."
    )
    # On by default: on the HEADs of the 281 repositories mirrored here (issue 23), 14 findings in 7 repositories
    # (none on the ten servers of docs/corpus.md), graded blind: 12 true, 2 arguable (a voice-activity ONNX call on
    # 32 ms of audio, well under a millisecond, in two single-user apps), none false.
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
    ]
