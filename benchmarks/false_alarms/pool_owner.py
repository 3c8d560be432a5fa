"""In-process engine: a single-thread `ThreadPoolExecutor` owns MLX; each token is one job on it, one
request at a time under an `asyncio.Lock`.

Threads: the pool's one thread loads the model, opens, steps and closes every generator. The loop only
awaits jobs. Handoffs: each job's result through its future; `_call` waits for a job through any number
of cancels before the cancel goes on, so the lock never outlives the work done under it. Costs: a cancel
stops decode within the token in flight; an abandoned generator is closed on the pool thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any, AsyncIterator, Callable, Optional

from false_alarms._adapter import EngineAdapter
from false_alarms._common import EngineClosed, PointHook, encode, load_model, mark


class Engine:
    on_point: Optional[PointHook] = None

    def __init__(self) -> None:
        self._pool: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._lock: Optional[asyncio.Lock] = None
        self._closed = True

    async def start(self) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mlx-owner")
        self._lock = asyncio.Lock()
        self._model, self._tokenizer = await self._call(load_model)
        self._closed = False

    async def stream(self, text: str, max_tokens: int, rid: str = "", chat: bool = False) -> AsyncIterator[str]:
        if self._closed:
            raise EngineClosed("the engine is shut down")
        async with self._lock:
            if self._closed:
                raise EngineClosed("the engine was shut down while the request waited")
            generator = await self._call(self._open, text, chat, max_tokens, rid)
            try:
                step = 0
                while (response := await self._call(self._next, generator, rid, step)) is not None:
                    yield response.text  # the last one too: the generator then ends on the pool thread
                    step += 1
                    if self._closed:
                        raise EngineClosed("the engine was shut down mid-request")
            except BaseException:  # cancelled, closed early, shut down or a failed step
                await self._abandon(generator)
                raise

    async def _abandon(self, generator: Any) -> None:
        """Close a generator left mid-body, on the pool thread where it runs. The caller holds the lock."""
        await self._call(generator.close)

    def _open(self, text: str, chat: bool, max_tokens: int, rid: str) -> Any:
        from mlx_lm import stream_generate

        return stream_generate(self._model, self._tokenizer, encode(self._tokenizer, text, chat),
                               max_tokens=max_tokens)

    def _next(self, generator: Any, rid: str, step: int) -> Any:
        if step == 0:
            mark(self.on_point, "WORKER_STARTED", rid)
        else:
            mark(self.on_point, "BEFORE_DECODE", rid, step=step)
        return next(generator, None)

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` on the MLX thread; a cancel waits for it to return, then goes on."""
        job = asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
        try:
            return await asyncio.shield(job)
        except asyncio.CancelledError:
            while not job.done():
                try:
                    await asyncio.wait({job})
                except asyncio.CancelledError:
                    pass
            if not job.cancelled():
                job.exception()  # retrieved: the caller gets the cancel
            raise

    async def shutdown(self) -> None:
        if self._closed or self._lock is None:
            return
        self._closed = True
        async with self._lock:  # the running request has stopped and closed its generator
            self._pool.shutdown(wait=True)

    def status(self) -> dict[str, int]:
        return {"active": int(self._lock is not None and self._lock.locked())}


def make() -> EngineAdapter:
    return EngineAdapter("pool-owner", Engine())
