"""TWIN of aiohttp_server: the slot is taken before the body is read, so a request that fails there never releases it.

An aiohttp OpenAI server (streaming and not): each request's generation is one job on a one-thread
executor, one request at a time under an `asyncio.Semaphore` slot.

    python -m false_alarms.aiohttp_server --port PORT      (needs aiohttp: pip install 'aiohttp==3.14.5')

Threads: the executor's one thread loads the model and runs each request from its first MLX call to its
generator's close. Handoffs: pieces back through `loop.call_soon_threadsafe`; a `threading.Event` per
request, set when the client has gone (aiohttp does not cancel handlers: a closed transport, or a write
that fails, says so). The slot is taken only once the body is read, and freed in a `finally` after the
job has returned. Costs: a gone client stops decode within one token.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import threading
from typing import Any

from aiohttp import web

from false_alarms._common import (DONE_FRAME, Ask, BadRequest, answer_body, chunk_frame, encode, error_body,
                                  load_model, parse_ask)

_END = object()
MLX = web.AppKey("mlx", concurrent.futures.ThreadPoolExecutor)
SLOT = web.AppKey("slot", asyncio.Semaphore)
MODEL = web.AppKey("model", tuple)


async def completions(request: web.Request) -> web.StreamResponse:
    slot = request.app[SLOT]
    await slot.acquire()
    raw = await request.read()  # a cut body raises here, before the try: the slot is never released
    try:
        ask = parse_ask(request.path, raw)
    except BadRequest as exc:
        return web.json_response(error_body(str(exc), "bad_request"), status=400)
    try:
        return await generate(request, ask)
    finally:
        slot.release()


async def generate(request: web.Request, ask: Ask) -> web.StreamResponse:
    loop = asyncio.get_running_loop()
    pieces: asyncio.Queue = asyncio.Queue()
    stop = threading.Event()
    model, tokenizer = request.app[MODEL]
    job = loop.run_in_executor(request.app[MLX], run, model, tokenizer, ask, stop,
                               lambda item: loop.call_soon_threadsafe(pieces.put_nowait, item))
    try:
        response = None
        if ask.stream:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await response.prepare(request)
        text = []
        while (item := await pieces.get()) is not _END:
            if request.transport is None or request.transport.is_closing():
                stop.set()  # the client went: decode no further for it
            elif response is not None:
                await response.write(chunk_frame(ask, *item))
            else:
                text.append(item[0])
        finish = await job
        if response is not None:
            await response.write(DONE_FRAME)
            await response.write_eof()
            return response
        return web.json_response(answer_body(ask, "".join(text), finish))
    finally:
        stop.set()
        while not job.done():  # the slot is held until the worker has returned, through any cancel
            try:
                await asyncio.wait({job})
            except asyncio.CancelledError:
                pass
        if not job.cancelled():
            job.exception()


def run(model: Any, tokenizer: Any, ask: Ask, stop: threading.Event, send: Any) -> str:
    """One request on the MLX thread; its generator is closed here."""
    from mlx_lm import stream_generate

    finish = "length"
    try:
        generator = stream_generate(model, tokenizer, encode(tokenizer, ask.text, ask.chat), max_tokens=ask.max_tokens)
        try:
            for response in generator:
                finish = response.finish_reason or finish
                send((response.text, response.finish_reason))
                if stop.is_set():
                    break
        finally:
            generator.close()
    finally:
        send(_END)
    return finish


async def on_startup(app: web.Application) -> None:
    app[MODEL] = await asyncio.get_running_loop().run_in_executor(app[MLX], load_model)


def make_app() -> web.Application:
    app = web.Application()
    app[MLX] = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mlx")
    app[SLOT] = asyncio.Semaphore(1)
    app.on_startup.append(on_startup)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", completions)
    return app


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    web.run_app(make_app(), host="127.0.0.1", port=parser.parse_args().port, print=None)
