"""TWIN of batched_owner: aborts and new requests are taken in two critical sections, so an abort for a waiting request is lost.

In-process engine: one owner thread decodes every running request together, one token each per
iteration, and applies aborts at the top of every iteration (an abort set, as vllm-style schedulers keep).

Threads: the owner thread loads the model and makes every MLX call; the loop only submits, aborts and
reads. Handoffs: new requests and aborts under one `threading.Condition`, taken together in one critical
section per iteration; pieces back through `loop.call_soon_threadsafe`. Costs: an abort or a cancel takes
effect before the request's next token, whether it is running or still waiting to be admitted.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Optional

from false_alarms._adapter import EngineAdapter
from false_alarms._common import EngineClosed, PointHook, RequestAborted, encode, load_model, mark


@dataclass
class Request:
    rid: str
    text: str
    chat: bool
    max_tokens: int
    send: Any  # (kind, value) -> None, safe from any thread
    tokens: Any = None  # the mlx-lm generator, once admitted (owner thread only)
    detokenizer: Any = None
    produced: int = 0
    left: int = 0
    ended: bool = field(default=False)


class Engine:
    on_point: Optional[PointHook] = None

    def __init__(self) -> None:
        self._thread: Optional[threading.Thread] = None
        self._closed = True
        self._known: set[str] = set()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._cond = threading.Condition()
        self._pending: list[Request] = []
        self._aborts: set[str] = set()
        self._active: dict[str, Request] = {}
        self._stopping = False
        self._ready = loop.create_future()
        self._exited = loop.create_future()
        self._thread = threading.Thread(target=self._run, name="mlx-batch-owner", daemon=True)
        self._thread.start()
        await self._ready
        self._closed = False

    async def stream(self, text: str, max_tokens: int, rid: str = "", chat: bool = False) -> AsyncIterator[str]:
        if self._closed:
            raise EngineClosed("the engine is shut down")
        loop = asyncio.get_running_loop()
        results: asyncio.Queue = asyncio.Queue()
        request = Request(rid, text, chat, max_tokens,
                          lambda kind, value: loop.call_soon_threadsafe(results.put_nowait, (kind, value)))
        with self._cond:
            self._pending.append(request)
            self._known.add(rid)
            self._cond.notify()
        finished = False
        try:
            while True:
                kind, value = await results.get()
                if kind == "end":
                    finished = True
                    return
                if kind == "aborted":
                    finished = True
                    raise RequestAborted(value)
                if kind == "error":
                    finished = True
                    raise EngineClosed(value) if self._closed else RuntimeError(value)
                yield value
        finally:
            if not finished:
                self.abort(rid)  # cancelled or closed early: out of the batch before its next token

    def abort(self, rid: str) -> bool:
        """Ask the owner to end `rid` before its next token; True if the request has not ended yet.

        `_known` holds a request from its submit until the owner ends it (under the same lock), so an
        abort is recorded wherever the request is: pending, being admitted on the owner, or running, and
        one that comes after the end is refused rather than acknowledged and then completed."""
        with self._cond:
            if rid not in self._known:
                return False
            self._aborts.add(rid)
            self._cond.notify()
        return True

    async def shutdown(self) -> None:
        if self._thread is None or self._exited.done() and not self._thread.is_alive():
            return
        self._closed = True
        with self._cond:
            self._stopping = True
            self._cond.notify()
        await self._exited
        self._thread.join()

    def status(self) -> dict[str, int]:
        if self._thread is None or self._closed:
            return {}
        with self._cond:
            return {"queued": len(self._pending), "active": len(self._active), "aborts": len(self._aborts)}

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
            while True:
                with self._cond:
                    while not (self._pending or self._aborts or self._active or self._stopping):
                        self._cond.wait()
                    if self._stopping:
                        break
                    aborts, self._aborts = self._aborts, set()
                self._apply_aborts(aborts, [])
                with self._cond:  # a second critical section: an abort for a request taken here is lost
                    new, self._pending = self._pending, []
                self._admit(new)
                self._step()
        finally:
            self._finish()
            self._loop.call_soon_threadsafe(_settle, self._exited, None)

    def _apply_aborts(self, aborts: set[str], new: list[Request]) -> list[Request]:
        """End every aborted request, running or just taken; returns the new requests still wanted."""
        for rid in aborts:
            if rid in self._active:
                self._end(self._active.pop(rid), "aborted", "aborted by the client")
        for request in new:
            if request.rid in aborts:
                self._end(request, "aborted", "aborted before it started")
        return [request for request in new if request.rid not in aborts]

    def _admit(self, new: list[Request]) -> None:
        """Start each new request's generator; the prefill runs on its first step."""
        from mlx_lm.generate import generate_step

        for request in new:
            try:
                mark(self.on_point, "WORKER_STARTED", request.rid)
                prompt = encode(self._tokenizer, request.text, request.chat)
                request.tokens = generate_step(_array(prompt), self._model, max_tokens=request.max_tokens)
                request.detokenizer = self._tokenizer.detokenizer
                self._active[request.rid] = request
            except Exception as exc:
                self._end(request, "error", f"{type(exc).__name__}: {exc}")

    def _step(self) -> None:
        """One token for every running request."""
        for request in list(self._active.values()):
            try:
                if request.produced:
                    mark(self.on_point, "BEFORE_DECODE", request.rid, step=request.produced)
                token, _ = next(request.tokens)
                request.produced += 1
            except StopIteration:
                self._end(self._active.pop(request.rid), "end", None)
                continue
            except Exception as exc:  # this request failed; the others go on
                self._end(self._active.pop(request.rid), "error", f"{type(exc).__name__}: {exc}")
                continue
            done = token in self._tokenizer.eos_token_ids or request.produced >= request.max_tokens
            if token not in self._tokenizer.eos_token_ids:
                request.detokenizer.add_token(token)
            if done:
                request.detokenizer.finalize()
            request.send("piece", request.detokenizer.last_segment)
            if done:
                self._end(self._active.pop(request.rid), "end", None)

    def _end(self, request: Request, kind: str, value: Any) -> None:
        """The request's terminal message, once; its generator closed here, on the owner. An abort that
        came while its last step ran (the one step of a one-token request, inside its admission) wins over
        completing: it was acknowledged, and the end and `abort()` are decided under one lock."""
        if request.tokens is not None:
            request.tokens.close()
        with self._cond:
            if kind == "end" and request.rid in self._aborts:
                kind, value = "aborted", "aborted by the client"
            self._aborts.discard(request.rid)
            self._known.discard(request.rid)
        if not request.ended:
            request.ended = True
            request.send(kind, value)

    def _finish(self) -> None:
        """Shutdown: every waiting and running request ends with an error."""
        with self._cond:
            waiting, self._pending = self._pending, []
        for request in waiting + list(self._active.values()):
            self._end(request, "error", "the engine was shut down")
        self._active.clear()


def _array(tokens: list[int]) -> Any:
    import mlx.core as mx

    return mx.array(tokens)


def _settle(future: asyncio.Future, error: Optional[BaseException]) -> None:
    if not future.done():
        future.set_exception(error) if error is not None else future.set_result(None)


def make() -> EngineAdapter:
    return EngineAdapter("twin-batched-owner", Engine())
