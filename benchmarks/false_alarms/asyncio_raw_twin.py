"""TWIN of asyncio_raw: the slot is released on cancel before the worker thread has returned.

A raw HTTP/1.1 OpenAI server on `asyncio.start_server`, generation on one dedicated thread.

    python -m false_alarms.asyncio_raw --port PORT

Each connection's handler reads one request, then a watcher reads the socket: at EOF (the client went)
it cancels the handler task. The handler tells the worker to stop, keeps the generation slot until the
worker has returned, and then returns normally; nobody awaits handler tasks (`start_server` made them).

Threads: a one-thread executor is the generation thread: it loads the model and runs each request from
its first MLX call to its generator's close. Handoffs: pieces back through `loop.call_soon_threadsafe`;
a `threading.Event` per request to stop. Costs: a gone client stops decode within one token.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import threading
from typing import Any, Optional

from false_alarms._common import (DONE_FRAME, Ask, BadRequest, answer_body, chunk_frame, encode, error_body,
                                  load_model, parse_ask)

_END = object()


class Server:
    def __init__(self) -> None:
        self.generation = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="generation")
        self.slot = asyncio.Lock()  # one request generates at a time

    async def start(self, port: int) -> asyncio.AbstractServer:
        loop = asyncio.get_running_loop()
        self.model, self.tokenizer = await loop.run_in_executor(self.generation, load_model)
        return await asyncio.start_server(self.handle, "127.0.0.1", port)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection, one request; cancelled by its watcher when the client goes."""
        watcher: Optional[asyncio.Task] = None
        try:
            try:
                path, raw = await _read_request(reader)
                ask = parse_ask(path, raw)
            except (asyncio.IncompleteReadError, ConnectionError, ValueError) as exc:
                if not isinstance(exc, BadRequest):
                    return  # the client went before its request was whole
                await _send_json(writer, 404 if "no route" in str(exc) else 400, error_body(str(exc), "bad_request"))
                return
            watcher = asyncio.ensure_future(_cancel_at_eof(reader, asyncio.current_task()))
            await self.serve(ask, writer)
        except asyncio.CancelledError:
            pass  # our own watcher: the client went; serve() has stopped its worker and freed the slot
        except ConnectionError:
            pass  # the client went while we wrote
        finally:
            if watcher is not None:
                watcher.cancel()
            writer.close()

    async def serve(self, ask: Ask, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        pieces: asyncio.Queue = asyncio.Queue()
        stop = threading.Event()
        async with self.slot:
            job = loop.run_in_executor(self.generation, self.generate, ask, stop,
                                       lambda item: loop.call_soon_threadsafe(pieces.put_nowait, item))
            try:
                if ask.stream:
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                 b"Cache-Control: no-cache\r\nConnection: close\r\n\r\n")
                text = []
                while (item := await pieces.get()) is not _END:
                    piece, finish = item
                    if ask.stream:
                        writer.write(chunk_frame(ask, piece, finish))
                        await writer.drain()
                    else:
                        text.append(piece)
                finish = await job
                if ask.stream:
                    writer.write(DONE_FRAME)
                    await writer.drain()
                else:
                    await _send_json(writer, 200, answer_body(ask, "".join(text), finish))
            except BaseException:
                stop.set()  # the slot is freed on the way out while the worker may still be in MLX
                raise

    def generate(self, ask: Ask, stop: threading.Event, send: Any) -> str:
        """One request on the generation thread; its generator is closed here."""
        from mlx_lm import stream_generate

        finish = "length"
        try:
            generator = stream_generate(self.model, self.tokenizer, encode(self.tokenizer, ask.text, ask.chat),
                                        max_tokens=ask.max_tokens)
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


async def _drain(job: "asyncio.Future[Any]") -> None:
    """Wait until the worker has returned, through any number of cancels; then the caller goes on."""
    while not job.done():
        try:
            await asyncio.wait({job})
        except asyncio.CancelledError:
            pass
    if not job.cancelled():
        job.exception()


async def _cancel_at_eof(reader: asyncio.StreamReader, handler: asyncio.Task) -> None:
    try:
        while await reader.read(4096):
            pass
    except ConnectionError:
        pass
    handler.cancel()


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:] if ":" in line)}
    if method != "POST":
        raise BadRequest(f"no route {method} {path}")
    return path, await reader.readexactly(int(headers.get("content-length", "0")))


async def _send_json(writer: asyncio.StreamWriter, status: int, payload: dict) -> None:
    data = json.dumps(payload).encode()
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}[status]
    writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
    await writer.drain()


async def main(port: int) -> None:
    server = await Server().start(port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    asyncio.run(main(parser.parse_args().port))
