"""In-process engine: a request's whole generation is one `asyncio.to_thread` call, one request at a time
under an `asyncio.Lock` held through a drain on cancel: the worker is told to stop, awaited even when the
waiter is cancelled (any number of times), and only then does the cancel go on.

Threads: whatever thread the loop's default executor picks loads the model and runs each request's
generation from its first MLX call to its generator's close; the lock keeps one such call at a time.
Handoffs: text pieces back through `loop.call_soon_threadsafe`, a `threading.Event` to stop.
Costs: a cancel stops decode within one token.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, AsyncIterator, Optional

from false_alarms._adapter import EngineAdapter
from false_alarms._common import EngineClosed, PointHook, encode, load_model, mark

_END = object()


class Engine:
    on_point: Optional[PointHook] = None

    def __init__(self) -> None:
        self._lock: Optional[asyncio.Lock] = None
        self._stops: set[threading.Event] = set()
        self._closed = True

    async def start(self) -> None:
        self._lock = asyncio.Lock()
        self._model, self._tokenizer = await asyncio.to_thread(load_model)
        self._closed = False

    async def stream(self, text: str, max_tokens: int, rid: str = "", chat: bool = False) -> AsyncIterator[str]:
        if self._closed:
            raise EngineClosed("the engine is shut down")
        loop = asyncio.get_running_loop()
        pieces: asyncio.Queue = asyncio.Queue()
        stop = threading.Event()
        async with self._lock:
            if self._closed:
                raise EngineClosed("the engine was shut down while the request waited")
            self._stops.add(stop)
            job = asyncio.ensure_future(asyncio.to_thread(
                self._generate, text, chat, max_tokens, rid, stop, lambda item: loop.call_soon_threadsafe(
                    pieces.put_nowait, item)))
            try:
                while (piece := await pieces.get()) is not _END:
                    yield piece
                await asyncio.shield(job)  # the worker's own error, if it failed; a cancel here leaves job running for _drain
            except asyncio.CancelledError:
                await _drain(job, stop)
                raise
            except BaseException:  # closed early (GeneratorExit) or the worker failed
                await _drain(job, stop)
                raise
            finally:
                self._stops.discard(stop)
        if stop.is_set() and self._closed:
            raise EngineClosed("the engine was shut down mid-request")

    def _generate(self, text: str, chat: bool, max_tokens: int, rid: str, stop: threading.Event, send) -> None:
        """One request, start to end, on this worker thread; the generator is closed where it ran."""
        from mlx_lm import stream_generate

        try:
            mark(self.on_point, "WORKER_STARTED", rid)
            generator = stream_generate(self._model, self._tokenizer, encode(self._tokenizer, text, chat),
                                        max_tokens=max_tokens)
            try:
                for step, response in enumerate(generator, start=1):
                    send(response.text)
                    if stop.is_set() or response.finish_reason:
                        break
                    mark(self.on_point, "BEFORE_DECODE", rid, step=step)
            finally:
                generator.close()
        finally:
            send(_END)

    async def shutdown(self) -> None:
        if self._closed or self._lock is None:
            return
        self._closed = True
        for stop in list(self._stops):
            stop.set()
        async with self._lock:  # the running request, if any, has drained
            pass

    def status(self) -> dict[str, int]:
        return {"active": int(self._lock is not None and self._lock.locked())}


async def _drain(job: "asyncio.Future[Any]", stop: threading.Event) -> None:
    """Stop the worker and wait until it has returned, through any number of cancels."""
    stop.set()
    cancelled = False
    while not job.done():
        try:
            await asyncio.wait({job})
        except asyncio.CancelledError:
            cancelled = True
    if not job.cancelled():
        job.exception()  # retrieved: the caller gets its own exception, not the worker's
    if cancelled:
        raise asyncio.CancelledError


def make() -> EngineAdapter:
    return EngineAdapter("to-thread-drain", Engine())
