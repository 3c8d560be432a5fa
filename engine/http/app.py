"""The route list: an OpenAI-compatible Starlette app around one started engine.

Everything here runs on the event loop except parsing, validation and
tokenization, which may take seconds for a 4 MiB body and run in a worker
thread (plain Python and the Rust tokenizer, never MLX). MLX is reached only through `engine.submit`,
whose refusals (busy, shutting down, too long) are answered before the first
response byte.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from typing import Any, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from mlx_invariants.engine.base import Engine
from mlx_invariants.engine.errors import EngineError, InvalidRequest
from mlx_invariants.engine.http import openapi, schemas
from mlx_invariants.engine.http.errors import ApiError, error_body, from_engine_error
from mlx_invariants.engine.http.payloads import ChatShape, Shape, TextShape
from mlx_invariants.engine.http.relay import OnceRelay, StreamRelay, wait_finished
from mlx_invariants.engine.http.telemetry import CountingMiddleware, Counters, LoopLag
from mlx_invariants.engine.messages import Pending, SamplingParams
from mlx_invariants.engine.stream import RequestStream

BODY_TIMEOUT_S = 30.0  # a client trickling its body holds no engine slot, but must not hold a task forever
REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")


def error_response(err: ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


class GenerationRoute:
    """`POST /v1/chat/completions` or `/v1/completions` as a raw ASGI endpoint.

    Raw ASGI, not a Starlette function endpoint, so that reading the body, a
    client leaving mid-body, submission and the relay share one coroutine, and
    no await separates `engine.submit` returning from the relay's `finally`
    that closes the stream. A client that leaves while its request waits for
    admission (wait mode) gives its place up at once.
    """

    def __init__(self, parse: Callable[[Any], schemas.GenerationRequest], shape: type[Shape], prefix: str):
        self.parse = parse
        self.shape = shape
        self.prefix = prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        state = request.app.state
        try:
            raw = await _read_body(request, state.max_body_bytes)
            req = await asyncio.to_thread(_parse, self.parse, raw)  # seconds for a pathological 4 MiB body
            rid = f"{self.prefix}-{_client_request_id(request) or uuid.uuid4().hex}"
            pending = await _pending(state.engine, req, rid, state.vocab_size)
            try:
                stream = await _submit_unless_gone(state.engine, pending, receive)
            except InvalidRequest as exc:
                if exc.param != "rid":
                    raise from_engine_error(exc) from None
                raise ApiError(409, f"a request with this X-Request-Id is still running ({pending.rid})",
                               "request_id_in_use", param="X-Request-Id") from None
            except EngineError as exc:
                raise from_engine_error(exc) from None
        except ApiError as err:
            await error_response(err)(scope, receive, send)
            return
        except ClientDisconnect:
            return  # left while sending the body: nothing was submitted, nobody to answer
        if stream is None:
            state.counters.client_disconnects += 1
            return
        shape = self.shape(pending.rid, state.engine.model_id, req.logprobs, req.stream and req.include_usage)
        relay = StreamRelay if req.stream else OnceRelay
        await relay(stream, shape, state.counters)(scope, receive, send)


async def _submit_unless_gone(engine: Engine, pending: Pending, receive: Receive) -> RequestStream | None:
    """`engine.submit`, giving the admission place up if the client leaves while queued; None then."""
    submitting = asyncio.ensure_future(engine.submit(pending))
    try:
        return submitting.result() if await wait_finished(submitting, receive) else None
    except asyncio.CancelledError:
        if submitting.done() and not submitting.cancelled() and submitting.exception() is None:
            await submitting.result().aclose()  # admitted just as we were cancelled: never leak the slot
        raise


def _parse(parse: Callable[[Any], schemas.GenerationRequest], raw: bytes) -> schemas.GenerationRequest:
    return parse(schemas.parse_json(raw))


async def _read_body(request: Request, max_bytes: int) -> bytes:
    schemas.check_content_type(request.headers.get("content-type"))
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)

    async def read() -> bytes:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise _too_large(max_bytes)
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        return await asyncio.wait_for(read(), BODY_TIMEOUT_S)
    except asyncio.TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {BODY_TIMEOUT_S:g}s",
                       "request_timeout") from None


def _client_request_id(request: Request) -> str | None:
    """`X-Request-Id` names the request in the engine, `/v1/status` and the response `id` (tracing, tests)."""
    given = request.headers.get("x-request-id")
    if given is not None and not REQUEST_ID.fullmatch(given):
        raise ApiError(400, "X-Request-Id must be 1 to 64 letters, digits or ._:-", "invalid_value",
                       param="X-Request-Id")
    return given


def _too_large(max_bytes: int) -> ApiError:
    return ApiError(413, f"the request body is larger than {max_bytes} bytes; send a shorter prompt",
                    "request_too_large")


async def _pending(engine: Engine, req: schemas.GenerationRequest, rid: str, vocab_size: int) -> Pending:
    """Check the model, tokenize and fill in the sampling defaults.

    Tokenizing runs in a worker thread: it is pure Python and Rust, never MLX,
    but a 4 MiB prompt takes seconds, and on the loop that would stall every
    other request (and /health) for as long.
    """
    if req.model != engine.model_id:
        raise ApiError(404, f"model {req.model!r} is not served here; this server serves {engine.model_id!r}",
                       "model_not_found", param="model")
    prompt = await asyncio.to_thread(_tokenize, engine, req, vocab_size)
    room = engine.context_length - len(prompt)
    max_tokens = req.max_tokens if req.max_tokens is not None else max(1, min(schemas.DEFAULT_MAX_TOKENS, room))
    params = SamplingParams(max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p,
                            seed=req.seed, stop=req.stop, logprobs=req.logprobs)
    return Pending(rid, prompt, params)


def _tokenize(engine: Engine, req: schemas.GenerationRequest, vocab_size: int) -> tuple[int, ...]:
    import jinja2  # mlx-lm's dependency through transformers; imported here to keep module import light

    tokenizer = engine.tokenizer
    if isinstance(req, schemas.ChatRequest):
        try:
            return tuple(tokenizer.apply_chat_template(list(req.messages), add_generation_prompt=True))
        except jinja2.TemplateError as exc:  # templates reject e.g. misordered roles this way
            raise ApiError(400, f"the model's chat template rejected the messages: {exc}",
                           "invalid_messages", param="messages") from None
    assert isinstance(req, schemas.CompletionRequest)
    if isinstance(req.prompt, str):
        return tuple(tokenizer.encode(req.prompt))
    bad = next((t for t in req.prompt if t >= vocab_size), None)
    if bad is not None:
        raise ApiError(400, f"token id {bad} is outside this model's vocabulary (0..{vocab_size - 1})",
                       "invalid_value", param="prompt")
    return req.prompt


# -- small routes ------------------------------------------------------------------------

async def health(request: Request) -> Response:
    engine = request.app.state.engine
    if engine.healthy:
        return JSONResponse({"status": "ok"})
    down = engine.unavailable
    if down is not None:  # the owner thread died or is stuck: say which
        return JSONResponse(error_body(str(down), "service_unavailable", down.code), status_code=503)
    return JSONResponse(error_body("the engine is not ready or is shutting down", "service_unavailable",
                                   "engine_unavailable"), status_code=503)


async def models(request: Request) -> Response:
    state = request.app.state
    return JSONResponse({"object": "list", "data": [
        {"id": state.engine.model_id, "object": "model", "created": state.started, "owned_by": "mlx-invariants"},
    ]})


async def status(request: Request) -> Response:
    state = request.app.state
    return JSONResponse({**state.engine.status(), "server": state.counters.snapshot(),
                         "loop_lag": state.lag.snapshot()})


async def openapi_document(request: Request) -> Response:
    return JSONResponse(openapi.document())


# -- errors that never reach a route -------------------------------------------------------

_HTTP_CODES = {404: "route_not_found", 405: "method_not_allowed"}


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    message = exc.detail if exc.status_code != 404 else f"no route {request.method} {request.url.path}"
    code = _HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
    return error_response(ApiError(exc.status_code, str(message), code, headers=dict(exc.headers or {})))


async def _unexpected(request: Request, exc: Exception) -> Response:
    """Any exception reaching here is a server bug: answer JSON, and let Starlette log the traceback."""
    return error_response(ApiError(500, "internal server error; this is a bug, the server log has the traceback",
                                   "internal_error"))


def build_app(engine: Engine, counters: Counters | None = None, lag: LoopLag | None = None,
              max_body_bytes: int = schemas.MAX_BODY_BYTES) -> ASGIApp:
    """The ASGI app for a started engine, wrapped so that every response, 500s included, is counted."""
    app = Starlette(
        routes=[
            Route("/v1/chat/completions", GenerationRoute(schemas.parse_chat, ChatShape, "chatcmpl"),
                  methods=["POST"]),
            Route("/v1/completions", GenerationRoute(schemas.parse_completion, TextShape, "cmpl"),
                  methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/v1/status", status, methods=["GET"]),
            Route("/openapi.json", openapi_document, methods=["GET"]),
        ],
        exception_handlers={HTTPException: _http_exception, Exception: _unexpected},
    )
    app.router.redirect_slashes = False  # a 307 to "/v1/models/" helps no API client
    counters = counters or Counters()
    app.state.engine = engine
    app.state.counters = counters
    app.state.lag = lag or LoopLag()
    app.state.max_body_bytes = max_body_bytes
    app.state.vocab_size = len(engine.tokenizer.get_vocab())
    app.state.started = int(time.time())
    return CountingMiddleware(app, counters)
