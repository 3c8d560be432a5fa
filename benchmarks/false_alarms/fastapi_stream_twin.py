"""TWIN of fastapi_stream: each token is decoded on the event loop instead of the MLX thread.

A FastAPI OpenAI server (streaming and not), MLX on a one-thread executor, one token per job.

    python -m false_alarms.fastapi_stream --port PORT      (needs fastapi: pip install 'fastapi==0.165.0')

Threads: the executor's one thread loads the model, opens each request's generator, steps it and closes
it; the event loop awaits those jobs under an `asyncio.Lock`, one request at a time. Handoffs: each job's
result through its future; `on_mlx` waits for a job through any number of cancels (Starlette cancels a
stream whose client went, again and again) before the cancel goes on. Costs: a gone client stops decode
within the token in flight; a non-streaming client is polled with `request.is_disconnected()` per token.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
from typing import Any, AsyncIterator, Callable, Optional

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel

from false_alarms._common import DONE_FRAME, Ask, answer_body, chunk_frame, encode, load_model

MLX = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mlx")


class Message(BaseModel):
    role: str = "user"
    content: str = ""


class CompletionRequest(BaseModel):
    prompt: str = ""
    max_tokens: int = 16
    stream: bool = False


class ChatRequest(BaseModel):
    messages: list[Message]
    max_tokens: int = 16
    stream: bool = False


class State:
    model: Any = None
    tokenizer: Any = None
    lock: Optional[asyncio.Lock] = None


state = State()


async def on_mlx(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` on the MLX thread; a cancel waits for it to return, then goes on."""
    job = asyncio.get_running_loop().run_in_executor(MLX, fn, *args)
    try:
        return await asyncio.shield(job)
    except asyncio.CancelledError:
        while not job.done():
            try:
                await asyncio.wait({job})
            except asyncio.CancelledError:
                pass
        if not job.cancelled():
            job.exception()
        raise


def open_generator(ask: Ask) -> Any:
    from mlx_lm import stream_generate

    return stream_generate(state.model, state.tokenizer, encode(state.tokenizer, ask.text, ask.chat),
                           max_tokens=ask.max_tokens)


async def responses(ask: Ask) -> AsyncIterator[Any]:
    """mlx-lm's responses for `ask`, under the lock; every MLX call on the MLX thread."""
    async with state.lock:
        generator = await on_mlx(open_generator, ask)
        try:
            while (response := next(generator, None)) is not None:  # decode on the event loop
                yield response
        finally:
            await on_mlx(generator.close)  # a generator left mid-body ends where it ran


async def answer(ask: Ask, request: Request) -> Any:
    if ask.stream:
        return StreamingResponse(sse(ask), media_type="text/event-stream")
    text, finish = [], "length"
    async with contextlib.aclosing(responses(ask)) as stream:
        async for response in stream:
            text.append(response.text)
            finish = response.finish_reason or finish
            if await request.is_disconnected():
                break
    return JSONResponse(answer_body(ask, "".join(text), finish))


async def sse(ask: Ask) -> AsyncIterator[bytes]:
    async with contextlib.aclosing(responses(ask)) as stream:
        async for response in stream:
            yield chunk_frame(ask, response.text, response.finish_reason)
    yield DONE_FRAME


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    state.model, state.tokenizer = await on_mlx(load_model)
    state.lock = asyncio.Lock()
    yield


app = FastAPI(lifespan=lifespan)


@app.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request) -> Any:
    return await answer(Ask(body.prompt, False, body.max_tokens, body.stream), request)


@app.post("/v1/chat/completions")
async def chat_completions(body: ChatRequest, request: Request) -> Any:
    text = " ".join(message.content for message in body.messages)
    return await answer(Ask(text, True, body.max_tokens, body.stream), request)


if __name__ == "__main__":
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    uvicorn.run(app, host="127.0.0.1", port=parser.parse_args().port, log_level="warning")
