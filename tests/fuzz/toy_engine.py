"""A toy third-party engine: MLX on one worker thread, serialised by an asyncio lock. Imports nothing of
mlx-invariants and marks no points; the drop-in observation has to see its bugs unaided.

`wait` picks how a request waits for its worker while holding the lock:
- "plain": `await` the job. A cancel ends the wait, `async with` releases the lock, and the worker is
  still inside MLX while the next request's work is handed over (the seed-000 bug);
- "drain-once": on a cancel, wait for the job, then re-raise; a second cancel during that wait lets go
  of the lock just the same;
- "drain": wait for the job through any number of cancels, then re-raise (the fix).

With `prep_s`, `generate` first tokenizes on the worker, `prep_s` long: its decode job waits behind
that, so a client that leaves at once leaves before any MLX work of its request started.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from typing import AsyncIterator

import mlx.core as mx

WIDTH = 256
DEPTH = 4
VOCAB = 50
WAITS = ("plain", "drain-once", "drain")


class ToyEngine:
    def __init__(self, wait: str = "drain", prep_s: float = 0.0):
        if wait not in WAITS:
            raise ValueError(f"wait must be one of {WAITS}")
        self.wait, self.prep_s = wait, prep_s
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._lock: asyncio.Lock | None = None
        self._weights: tuple[mx.array, mx.array, mx.array] | None = None

    async def start(self) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="toy-mlx")
        self._lock = asyncio.Lock()
        self._weights = await asyncio.get_running_loop().run_in_executor(self._pool, _load)

    async def generate(self, prompt: str, max_tokens: int) -> list[int]:
        """All tokens at once: one worker job, under the lock."""
        async with self._lock:
            context = await self._run(_prepared, prompt, self.prep_s) if self.prep_s else _tokens(prompt)
            return await self._run(_decode, self._weights, context, max_tokens)

    async def stream(self, prompt: str, max_tokens: int) -> AsyncIterator[int]:
        """One worker job per token, the lock held for the whole stream."""
        context = _tokens(prompt)
        async with self._lock:
            for _ in range(max_tokens):
                token = (await self._run(_decode, self._weights, context, 1))[0]
                context.append(token)
                yield token

    async def shutdown(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            pool.shutdown(wait=True)

    async def _run(self, fn, *args):
        job = asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
        if self.wait == "plain":
            return await job
        try:
            return await asyncio.shield(job)
        except asyncio.CancelledError:
            if self.wait == "drain-once":
                await asyncio.wait({job})
                raise
            while not job.done():
                try:
                    await asyncio.wait({job})
                except asyncio.CancelledError:
                    continue
            raise


def _load() -> tuple[mx.array, mx.array, mx.array]:
    keys = mx.random.split(mx.random.key(0), 3)
    embed = mx.random.normal((VOCAB, WIDTH), key=keys[0])
    layers = mx.random.normal((DEPTH, WIDTH, WIDTH), key=keys[1]) / WIDTH ** 0.5
    out = mx.random.normal((WIDTH, VOCAB), key=keys[2])
    mx.eval(embed, layers, out)
    return embed, layers, out


def _decode(weights: tuple[mx.array, mx.array, mx.array], context: list[int], count: int) -> list[int]:
    """`count` greedy tokens, a few milliseconds each (so a cancel finds the worker still busy)."""
    embed, layers, out = weights
    context = list(context)
    for _ in range(count):
        hidden = embed[mx.array(context[-8:])]
        for layer in range(DEPTH):
            hidden = mx.tanh(hidden @ layers[layer])
        context.append(int(mx.argmax(hidden.mean(axis=0) @ out).item()))
    return context[-count:]


def _prepared(prompt: str, prep_s: float) -> list[int]:
    """A slow tokenizer pass, no MLX in it."""
    time.sleep(prep_s)
    return _tokens(prompt)


def _tokens(prompt: str) -> list[int]:
    return [sum(map(ord, word)) % VOCAB for word in prompt.split()] or [0]
