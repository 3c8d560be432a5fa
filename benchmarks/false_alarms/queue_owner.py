"""In-process engine: one owner thread fed by a `queue.Queue` of jobs runs every MLX call; results go back
to each request's `asyncio.Queue` through `loop.call_soon_threadsafe`.

Threads: the owner thread loads the model, then generates one job at a time. Handoffs: `Job` into the
inbox; ("piece" | "end" | "error", value) back to the job's queue; a `threading.Event` per job to stop it;
the owner's exit back through the loop. Costs: a cancel stops decode within one token; a job cancelled
while queued never starts; shutdown ends the running job within a token and every queued one at once.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from dataclasses import dataclass, field
from typing import AsyncIterator, Optional

from false_alarms._adapter import EngineAdapter
from false_alarms._common import EngineClosed, PointHook, encode, load_model, mark


@dataclass
class Job:
    rid: str
    text: str
    chat: bool
    max_tokens: int
    send: object  # a callable taking (kind, value), safe from any thread
    stop: threading.Event = field(default_factory=threading.Event)


class Engine:
    on_point: Optional[PointHook] = None

    def __init__(self) -> None:
        self._thread: Optional[threading.Thread] = None
        self._closed = True

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._inbox: "queue.Queue[Optional[Job]]" = queue.Queue()
        self._stopping = threading.Event()
        self._ready = loop.create_future()
        self._exited = loop.create_future()
        self._thread = threading.Thread(target=self._run, name="mlx-owner", daemon=True)
        self._thread.start()
        await self._ready  # the model loaded on the owner, or its error
        self._closed = False

    async def stream(self, text: str, max_tokens: int, rid: str = "", chat: bool = False) -> AsyncIterator[str]:
        if self._closed:
            raise EngineClosed("the engine is shut down")
        loop = asyncio.get_running_loop()
        results: asyncio.Queue = asyncio.Queue()
        job = Job(rid, text, chat, max_tokens, lambda kind, value: loop.call_soon_threadsafe(
            results.put_nowait, (kind, value)))
        self._inbox.put(job)
        try:
            while True:
                kind, value = await results.get()
                if kind == "end":
                    return
                if kind == "error":
                    raise EngineClosed(value) if self._stopping.is_set() else RuntimeError(value)
                yield value
        finally:
            job.stop.set()  # cancelled or closed early: the owner drops it within a token

    async def shutdown(self) -> None:
        if self._thread is None or self._exited.done() and not self._thread.is_alive():
            return
        self._closed = True
        self._stopping.set()
        self._inbox.put(None)
        await self._exited
        self._thread.join()

    def status(self) -> dict[str, int]:
        return {"queued": self._inbox.qsize()} if self._thread is not None and not self._closed else {}

    # The owner thread.

    def _run(self) -> None:
        try:
            self._model, self._tokenizer = load_model()
        except BaseException as exc:
            self._loop.call_soon_threadsafe(_settle, self._ready, exc)
            self._loop.call_soon_threadsafe(_settle, self._exited, None)
            raise
        self._loop.call_soon_threadsafe(_settle, self._ready, None)
        try:
            while not self._stopping.is_set():  # a shutdown starts no queued job
                if (job := self._inbox.get()) is None:
                    break
                self._generate(job)
            self._fail_queued()
        finally:
            self._loop.call_soon_threadsafe(_settle, self._exited, None)

    def _generate(self, job: Job) -> None:
        """One job; its terminal message is always sent."""
        from mlx_lm import stream_generate

        if job.stop.is_set():
            return  # its client left while it waited
        try:
            mark(self.on_point, "WORKER_STARTED", job.rid)
            generator = stream_generate(self._model, self._tokenizer, encode(self._tokenizer, job.text, job.chat),
                                        max_tokens=job.max_tokens)
            try:
                for step, response in enumerate(generator, start=1):
                    job.send("piece", response.text)
                    if response.finish_reason or job.stop.is_set():
                        break
                    if self._stopping.is_set():
                        raise EngineClosed("the engine was shut down mid-request")
                    mark(self.on_point, "BEFORE_DECODE", job.rid, step=step)
            finally:
                generator.close()
        except Exception as exc:  # an MLX error or a shutdown: this job fails, the owner goes on
            job.send("error", f"{type(exc).__name__}: {exc}")
        else:
            job.send("end", None)

    def _fail_queued(self) -> None:
        """Every job still in the inbox ends now; none of them touched MLX."""
        while True:
            try:
                job = self._inbox.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                job.send("error", "the engine was shut down before the request started")


def _settle(future: asyncio.Future, error: Optional[BaseException]) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


def make() -> EngineAdapter:
    return EngineAdapter("queue-owner", Engine())
