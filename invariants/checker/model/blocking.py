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

Where the summary cannot type the receiver (a backend picked at run time, a model another library loaded), an
inference call is guessed from its method's and receiver's names (`guessed`, INV138 only), and left to the
package model where the call names a def of the package.

Left out: subprocesses (on request paths of MLX servers nearly all are a `sysctl` probe of a few
milliseconds, model/waits.py), model hub downloads and model loads (`from_pretrained`, a Whisper
`load_model`: start-up work, which INV108 leaves to start-up as it leaves loads), sockets (a
server's own protocol code), SDK clients built on these libraries (OpenAI's, Anthropic's: their
methods are not told apart from their data here), and MLX, which INV108 judges.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable, Iterator

# The kinds of the summary's entries for these calls (`Function.waits`), as a finding says them.
HTTP = "a sync HTTP call"
INFERENCE = "a model's inference"
GUESSED = "a model's inference, by its name"  # `guessed` below: judged with INFERENCE, where no package def is called

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
    return last_name(call.func) in _NAMES


def kind(qual: str | None) -> str | None:
    """HTTP or INFERENCE when the callee named `qual` is a call of that table, else None."""
    return _KINDS.get(qual) if qual is not None else None


# Inference a call names where the model cannot type its receiver: a model handed in from another library's
# loader, a backend chosen at run time (`embeddings_backend.encode(texts)`, `self.whisper.transcribe(path)`). The
# method is one inference libraries name so, and the receiver's name ends in a word for what holds a model
# (`stt_engine`, `local_model`, not `model_name`), or in a word for what serves one after a word for the model
# (`transcription_service`, not `user_service`); `encode` only on a model or an embedder (a tokenizer's, a JSON
# encoder's or a string's `encode` takes microseconds).
_GUESSED_VERBS = frozenset({"transcribe", "synthesize", "embed", "rerank", "diarize", "generate", "predict", "infer",
                            "encode"})
_VERB_STARTS = tuple(_GUESSED_VERBS)
# A method is named for one of these verbs alone or followed by what it works on (`transcribe_file`,
# `generate_speech`, `embed_documents`), but not by what a method that is no inference makes (`generate_id`,
# `generate_progress`), nor a model's token-embedding layer (`model.embed_tokens(ids)`, a table lookup).
_NOT_INFERENCE = frozenset({"id", "ids", "uuid", "key", "keys", "name", "hash", "password", "secret", "salt", "filename",
                            "path", "url", "slug", "token", "tokens", "nonce", "config", "schema", "cache", "progress",
                            "status", "stats", "next"})
_HOLDERS = frozenset({"model", "models", "whisper", "pipeline", "pipe", "llm", "tts", "stt", "asr", "vlm", "embedder",
                      "embedding", "embeddings", "encoder", "reranker", "synthesizer", "transcriber", "diarizer",
                      "recognizer", "engine", "backend"})
_SERVERS = frozenset({"service", "manager", "runner", "worker", "provider"})
_WHAT_IS_SERVED = frozenset({"model", "whisper", "llm", "tts", "stt", "asr", "vlm", "embedding", "embeddings", "embed",
                             "rerank", "reranker", "speech", "transcription", "inference", "ocr", "vision"})
# A call of a method so named on a receiver so named, in a file's text (`engine.transcribe_file(`,
# `get_backend().embed(`): such a file may hold an inference `guessed` judges (model/phase.py). Not `encode`,
# which an embedder's text says more about. The method is sought first (a literal dot leads the pattern), the
# receiver's name then in the few characters before it: a pattern led by the receivers' names would be tried at
# every character of every file.
_NAMED_METHOD = re.compile(r"\.[ \t]*_?(?:" + "|".join(sorted(_GUESSED_VERBS - {"encode"})) + r")\w*[ \t]*\(", re.I)
_NAMED_RECEIVER = re.compile(r"(?:" + "|".join(sorted(_HOLDERS | _SERVERS)) + r")s?[ \t]*(?:\(\))?[ \t]*$", re.I)


def names_inference(text: str) -> bool:
    return any(_NAMED_RECEIVER.search(text, max(0, m.start() - 40), m.start()) for m in _NAMED_METHOD.finditer(text))
_STREAMS = frozenset({"stream", "streaming"})
_EMBEDDERS = frozenset({"model", "models", "embedder", "embedding", "embeddings"})
_EMBEDDING = frozenset({"embed", "embedder", "embedding", "embeddings"})
# Calls that take a coroutine or an awaitable and run it: a value passed to one was never a sync result.
_RUNS_AWAITABLES = frozenset({"create_task", "ensure_future", "gather", "wait_for", "shield", "wait",
                              "run_coroutine_threadsafe", "as_completed", "timeout"})


def guessed(call: ast.Call, stmt: ast.stmt | None, own: Callable[[], Iterable[ast.AST]], coroutine: bool) -> bool:
    """`call`, not awaited, names a model's inference on a receiver named for a model (`backend.transcribe(path)`),
    and its def (`own()`: its nodes, asked for last; `coroutine`: an `async def`) uses the result as a sync
    call's: its statement runs nothing holding it as an awaitable, a coroutine does not return it as it is, and
    a name it is assigned to is never run so (a call of an async backend kept and awaited later is the loop's
    way)."""
    func = call.func
    if not isinstance(func, ast.Attribute) or not func.attr.lstrip("_").lower().startswith(_VERB_STARTS):
        return False  # most calls, cheaply: this runs on every call the summary reads
    verb = _words(func.attr)
    if not verb or verb[0] not in _GUESSED_VERBS or _NOT_INFERENCE.intersection(verb[1:]):
        return False
    if _STREAMS.intersection(verb) and not (isinstance(stmt, ast.For) and stmt.iter is call):
        return False  # `transcribe_stream()` makes a stream or a session; iterated in place, it works here
    receiver = func.value.func if isinstance(func.value, ast.Call) else func.value  # `get_backend().embed(texts)`
    words = _words(last_name(receiver))
    if not words:
        return False
    if verb[0] == "encode":  # `embeddings_backend.encode(texts)`
        if not (words[-1] in _EMBEDDERS or (words[-1] in _HOLDERS | _SERVERS and _EMBEDDING.intersection(words))):
            return False
    elif not (words[-1] in _HOLDERS or (words[-1] in _SERVERS and _WHAT_IS_SERVED.intersection(words[:-1]))):
        return False
    if stmt is None or any(_holds(_awaitable(node), lambda n: n is call) for node in _header(stmt)):
        return False
    if coroutine and isinstance(stmt, ast.Return) and stmt.value is call:
        return False  # a coroutine that returns an async backend's stream (`return engine.generate(prompt)`)
    if not (isinstance(stmt, ast.Assign | ast.AnnAssign) and stmt.value is call):
        return True  # used where it is made: a statement, a return, a loop's iterable, an argument, a subscript
    names = {n.id for t in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]) for n in ast.walk(t)
             if isinstance(n, ast.Name)}
    return not any(_holds(_awaitable(node), lambda n: isinstance(n, ast.Name) and n.id in names) for node in own())


_BLOCKS = frozenset({"body", "orelse", "handlers", "finalbody", "cases"})  # the fields of a statement's blocks


def _header(stmt: ast.stmt) -> Iterator[ast.AST]:
    """The nodes of `stmt` but those of the statements in its blocks (an `if`'s test, not its body)."""
    stack: list[ast.AST] = [stmt]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(child for field, value in ast.iter_fields(node) if field not in _BLOCKS
                     for child in (value if isinstance(value, list) else [value]) if isinstance(child, ast.AST))


def _awaitable(node: ast.AST) -> list[ast.AST]:
    """What `node` runs as an awaitable: an `await`'s expression (`await wait_with_disconnect(engine.generate())`),
    an `async for`'s iterable, an `async with`'s context managers, a call that takes coroutines (`create_task`,
    `gather`, `wait_for`)."""
    if isinstance(node, ast.Await):
        return [node.value]
    if isinstance(node, ast.AsyncFor):
        return [node.iter]
    if isinstance(node, ast.AsyncWith):
        return [item.context_expr for item in node.items]
    return [node] if isinstance(node, ast.Call) and last_name(node.func) in _RUNS_AWAITABLES else []


def _holds(exprs: list[ast.AST], found: Callable[[ast.AST], bool]) -> bool:
    return any(found(n) for expr in exprs for n in ast.walk(expr))


def _words(name: str) -> list[str]:
    """`_sttEngine` -> ["stt", "engine"]."""
    return [w for w in re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower().split("_") if w]


def last_name(func: ast.AST) -> str:
    """The name a call is made by: `get` of `client.get(...)`, `sleep` of `sleep(...)`; "" for anything else."""
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
