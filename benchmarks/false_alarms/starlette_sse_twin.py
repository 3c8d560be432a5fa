"""TWIN of starlette_sse: a closed or cancelled stream never stops its job: generation continues for a disconnected client.

A Starlette + uvicorn OpenAI server streaming SSE, generation on one owner thread fed by a queue.

    python -m false_alarms.starlette_sse --port PORT

Threads: the owner thread loads the model (during the app's lifespan) and runs every job; the event loop
only parses, streams and watches clients. Handoffs: `Job` into the owner's `queue.Queue`; pieces back
through `loop.call_soon_threadsafe`; a `threading.Event` per job to stop it, set when the client goes (a
stream closed or cancelled by Starlette on disconnect; a non-streaming client's `http.disconnect`).
Costs: a gone client stops decode within one token; a job is queued only once its stream is read.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from false_alarms._common import (DONE_FRAME, Ask, BadRequest, answer_body, chunk_frame, encode, error_body,
                                  load_model, parse_ask)


@dataclass
class Job:
    ask: Ask
    send: Any  # (kind, value) -> None, safe from any thread
    stop: threading.Event = field(default_factory=threading.Event)


class Owner:
    """The one thread that touches MLX."""

    def __init__(self) -> None:
        self.inbox: "queue.Queue[Job]" = queue.Queue()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self.run, name="mlx-owner", daemon=True)

    def run(self) -> None:
        self.model, self.tokenizer = load_model()
        self.ready.set()
        while True:
            self.generate(self.inbox.get())

    def generate(self, job: Job) -> None:
        from mlx_lm import stream_generate

        if job.stop.is_set():
            return
        finish = "length"
        try:
            generator = stream_generate(self.model, self.tokenizer, encode(self.tokenizer, job.ask.text, job.ask.chat),
                                        max_tokens=job.ask.max_tokens)
            try:
                for response in generator:
                    finish = response.finish_reason or finish
                    job.send("piece", (response.text, response.finish_reason))
                    if job.stop.is_set():
                        break
            finally:
                generator.close()
        except Exception as exc:
            job.send("error", f"{type(exc).__name__}: {exc}")
        else:
            job.send("end", finish)


OWNER = Owner()


async def pieces(ask: Ask) -> AsyncIterator[tuple[str, Any]]:
    """Queue the job and yield its pieces, then ("end", finish); the job stops when this is closed."""
    loop = asyncio.get_running_loop()
    results: asyncio.Queue = asyncio.Queue()
    job = Job(ask, lambda kind, value: loop.call_soon_threadsafe(results.put_nowait, (kind, value)))
    OWNER.inbox.put(job)
    try:
        while True:
            kind, value = await results.get()
            if kind == "error":
                raise RuntimeError(value)
            yield kind, value
            if kind == "end":
                return
    finally:
        pass  # the owner is never told: it decodes on for a client that has gone


async def completions(request: Request) -> Response:
    try:
        ask = parse_ask(request.url.path, await request.body())
    except BadRequest as exc:
        return JSONResponse(error_body(str(exc), "bad_request"), status_code=400)
    except ClientDisconnect:
        return Response(status_code=400)  # the client went before its body was whole
    if ask.stream:
        return StreamingResponse(sse(ask), media_type="text/event-stream")
    watch = asyncio.ensure_future(_until_disconnect(request))
    text, finish = [], "length"
    try:
        async with contextlib.aclosing(pieces(ask)) as stream:
            async for kind, value in stream:
                if watch.done():
                    break  # the client went: closing the stream stops the job
                if kind == "piece":
                    text.append(value[0])
                else:
                    finish = value
    finally:
        watch.cancel()
    return JSONResponse(answer_body(ask, "".join(text), finish))


async def sse(ask: Ask) -> AsyncIterator[bytes]:
    async with contextlib.aclosing(pieces(ask)) as stream:
        async for kind, value in stream:
            if kind == "piece":
                yield chunk_frame(ask, *value)
    yield DONE_FRAME


async def _until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    OWNER.thread.start()
    await asyncio.get_running_loop().run_in_executor(None, OWNER.ready.wait)
    yield


app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"]),
                        Route("/v1/chat/completions", completions, methods=["POST"])], lifespan=lifespan)

if __name__ == "__main__":
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    uvicorn.run(app, host="127.0.0.1", port=parser.parse_args().port, log_level="warning")
