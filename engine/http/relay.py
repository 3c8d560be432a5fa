"""Drive one submitted request to the client, stream or not, and abort it when the client leaves.

Both relays are ASGI apps run by a route only after `engine.submit`
succeeded, so busy and bad requests were already answered with a proper
status. While generating, each relay watches the ASGI `receive` channel for
`http.disconnect` concurrently with the work: a client that hangs up, during
prefill or decode, stream or not, cancels the work, and the stream is closed
(which aborts it in the engine).

Closing: each request has one `aclose()` task, started as soon as the engine
ended the request (a client that stops reading must not hold the slot), or
when the relay ends, whichever is first. A request the engine finished
normally is released *before* its last bytes (`[DONE]`, or the JSON body) go
out, so a client that sends its next request as soon as it has its answer
never finds its previous one still holding the slot. A request the engine
ended without its owner thread (it stopped or is stuck: `Failed`) is answered
at once: its release may never come, and the client must still get its
terminal event. `Counters.open_generations` drops only once the engine let go.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable

from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from mlx_invariants.engine.http import sse
from mlx_invariants.engine.http.errors import error_body
from mlx_invariants.engine.http.payloads import Shape
from mlx_invariants.engine.http.telemetry import Counters
from mlx_invariants.engine.messages import Failed, Finished, Token
from mlx_invariants.engine.stream import RequestStream

log = logging.getLogger(__name__)


async def wait_finished(work: Awaitable[None], receive: Receive) -> bool:
    """Run `work`; True once it finished, False if the client disconnected first (then `work` is cancelled)."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_wait_disconnect(receive))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        task.cancel()
        watch.cancel()
        await asyncio.gather(task, watch, return_exceptions=True)
    if task.cancelled():
        return False
    task.result()  # a bug in the work surfaces as the 500 it is
    return True


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _failure(result: Failed) -> dict[str, Any]:
    return error_body(result.message, "server_error", result.kind)


class _Relay:
    """What both relays share: the one close task, and the wait for a normal release."""

    def __init__(self, stream: RequestStream, shape: Shape, counters: Counters):
        self.stream = stream
        self.shape = shape
        self.counters = counters
        self._closing: asyncio.Future[None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.counters.open_generations += 1
        ended = asyncio.ensure_future(self.stream.wait_ended())
        ended.add_done_callback(lambda done: done.cancelled() or self._close())
        try:
            if not await wait_finished(self._relay(scope, receive, send), receive):
                self.counters.client_disconnects += 1
        finally:
            ended.cancel()
            self._close()

    async def _relay(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise NotImplementedError

    def _close(self) -> asyncio.Future[None]:
        """Start the request's one `aclose()` (aborting it if it still runs) unless already started."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self.stream.aclose())
            self._closing.add_done_callback(self._closed)
        return self._closing

    def _closed(self, closing: asyncio.Future[None]) -> None:
        self.counters.open_generations -= 1
        if not closing.cancelled() and closing.exception() is not None:
            log.error("closing request %s failed", self.stream.rid, exc_info=closing.exception())

    async def _wait_released(self) -> None:
        """Wait for the engine to let go of a request it finished; never for one it failed (see module doc)."""
        if isinstance(self.stream.result, Finished):
            await asyncio.shield(self._close())


class StreamRelay(_Relay):
    """SSE: a role chunk, one chunk per token, the finish chunk (and usage), then `[DONE]`."""

    async def _relay(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def emit(payload: dict[str, Any] | None) -> None:
            if payload is not None:
                await send({"type": "http.response.body", "body": sse.event(payload), "more_body": True})

        await send({"type": "http.response.start", "status": 200, "headers": sse.HEADERS})
        await emit(self.shape.first_chunk())
        async for token in self.stream:
            # Tokens that piled up while we were writing go out in one write: per-token sends cost
            # the loop more than the owner thread spends on a decode step at high concurrency.
            ready = [token, *self.stream.tokens_nowait()]
            body = b"".join(sse.event(self.shape.token_chunk(t)) for t in ready)
            await send({"type": "http.response.body", "body": body, "more_body": True})
        await self._wait_released()
        result = self.stream.result
        if isinstance(result, Finished):
            await emit(self.shape.finish_chunk(result.reason))
            if self.shape.include_usage:
                await emit(self.shape.usage_chunk(result))
        else:
            await emit(_failure(result))
        await send({"type": "http.response.body", "body": sse.DONE, "more_body": False})


class OnceRelay(_Relay):
    """Non-stream: collect every token, then one JSON body (an engine failure is a 500 error body)."""

    async def _relay(self, scope: Scope, receive: Receive, send: Send) -> None:
        tokens: list[Token] = [token async for token in self.stream]
        await self._wait_released()
        result = self.stream.result
        if isinstance(result, Finished):
            response = JSONResponse(self.shape.body(tokens, result))
        else:
            response = JSONResponse(_failure(result), status_code=500)
        await response(scope, receive, send)
