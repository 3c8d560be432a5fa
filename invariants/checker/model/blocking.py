"""Sync library calls that hold their thread for as long as someone else takes, or the work takes: what INV137
(HTTP) and INV138 (inference) follow from the event loop.

A sync HTTP client holds its thread until the other end answers, for as long as the other end
takes: a model registry's probe, an upstream's completion, a file download. A model library's
inference call (an embedding model's `encode`, a Whisper transcription, an ONNX session's `run`,
llama.cpp's completion) holds it for the whole computation. On the event loop's thread that is
every request of the server standing still. flake8-async sees the module-level HTTP calls
(`requests.get`) and a client made in the same `async def`; the clients and models engines keep
are made once, in `__init__` (`self._client = httpx.Client(...)`, `self.model =
SentenceTransformer(name)`), and called from a coroutine through a sync method of another module,
which is where the package model types and follows them.

A call is judged by the qualified name the summary gives its callee, receivers typed as
`collect.py` types them (an attribute its class assigns, a local, a `with httpx.Client() as
client:` target). An awaited call is an asyncio client's, never one of these.

Left out: subprocesses (on request paths of MLX servers nearly all are a `sysctl` probe of a few
milliseconds, model/waits.py), model hub downloads and model loads (`from_pretrained`, a Whisper
`load_model`: start-up work, which INV108 leaves to start-up as it leaves loads), sockets (a
server's own protocol code), SDK clients built on these libraries (OpenAI's, Anthropic's: their
methods are not told apart from their data here), and MLX, which INV108 judges.
"""

from __future__ import annotations

import ast

# The kinds of the summary's entries for these calls (`Function.waits`), as a finding says them.
HTTP = "a sync HTTP call"
INFERENCE = "a model's inference"

_VERBS = ("get", "post", "put", "patch", "delete", "head", "options", "request")
# Functions, by qualified name, and the methods of objects by the constructor that made them.
_TABLES: dict[str, tuple[frozenset[str], dict[str, tuple[str, ...]]]] = {
    HTTP: (
        frozenset({*(f"requests.{v}" for v in _VERBS), *(f"httpx.{v}" for v in _VERBS), "httpx.stream",
                   "urllib.request.urlopen", "urllib3.request"}),
        {
            "requests.Session()": (*_VERBS, "send"),
            "requests.sessions.Session()": (*_VERBS, "send"),
            "requests.session()": (*_VERBS, "send"),
            "httpx.Client()": (*_VERBS, "stream", "send"),
            "urllib3.PoolManager()": ("request", "urlopen", "request_encode_body", "request_encode_url"),
            "http.client.HTTPConnection()": ("request", "getresponse", "connect"),
            "http.client.HTTPSConnection()": ("request", "getresponse", "connect"),
        },
    ),
    INFERENCE: (
        frozenset({"whisper.transcribe"}),
        {
            "sentence_transformers.SentenceTransformer()": ("encode", "encode_query", "encode_document"),
            "sentence_transformers.CrossEncoder()": ("predict", "rank"),
            "faster_whisper.WhisperModel()": ("transcribe", "detect_language"),
            "whisper.load_model()": ("transcribe", "detect_language"),
            "onnxruntime.InferenceSession()": ("run",),
            "llama_cpp.Llama()": ("create_completion", "create_chat_completion", "create_embedding", "embed"),
        },
    ),
}
_KINDS: dict[str, str] = {
    qual: kind for kind, (functions, objects) in _TABLES.items()
    for qual in (*functions, *(f"{made}.{method}" for made, methods in objects.items() for method in methods))}
# The last names of the calls above: a call named otherwise is none of them, whatever its receiver.
_NAMES = frozenset(qual.rpartition(".")[2] for qual in _KINDS)
# The last names of the HTTP clients' constructors: `with httpx.Client() as client:` binds the client itself.
CLIENT_CLASSES = frozenset(made[:-2].rpartition(".")[2] for made in _TABLES[HTTP][1])
# The top-level names each kind's calls are imported from: a module that imports none of them makes none of them.
LIBRARIES: dict[str, frozenset[str]] = {
    kind: frozenset(qual.split(".", 1)[0] for qual, of in _KINDS.items() if of == kind) for kind in _TABLES}


def named(call: ast.Call) -> bool:
    """`call`'s last name is one of the table's (`get`, `stream`, `encode`, `transcribe`, ...): worth typing its
    receiver."""
    func = call.func
    return (func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else "") in _NAMES


def kind(qual: str | None) -> str | None:
    """HTTP or INFERENCE when the callee named `qual` is a call of that table, else None."""
    return _KINDS.get(qual) if qual is not None else None
