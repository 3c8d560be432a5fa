"""Server-side counters and event-loop lag, reported by `GET /v1/status` next to the engine's own."""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass, field
from typing import Any, Optional

from starlette.types import ASGIApp, Message, Receive, Scope, Send


@dataclass
class Counters:
    """Plain counters, touched only on the event loop thread."""

    requests: int = 0
    open_requests: int = 0
    open_generations: int = 0    # submitted to the engine and not yet closed
    client_disconnects: int = 0  # generations aborted because the client went away
    responses: collections.Counter = field(default_factory=collections.Counter)

    def snapshot(self) -> dict[str, Any]:
        return {"requests": self.requests, "open_requests": self.open_requests,
                "open_generations": self.open_generations, "client_disconnects": self.client_disconnects,
                "responses": {str(k): v for k, v in sorted(self.responses.items())}}


class CountingMiddleware:
    """Counts every HTTP request and the status it was answered with (5xx here is a bug to chase)."""

    def __init__(self, app: ASGIApp, counters: Counters):
        self.app = app
        self.counters = counters

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        counters = self.counters
        counters.requests += 1
        counters.open_requests += 1

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                counters.responses[message["status"]] += 1
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            counters.open_requests -= 1


class LoopLag:
    """How late the loop wakes a short timer: what every request pays before its handler runs."""

    def __init__(self, period_s: float = 0.02, window: int = 1000):
        self.period_s = period_s
        self.samples: collections.deque[float] = collections.deque(maxlen=window)
        self.worst_s = 0.0
        self._task: Optional[asyncio.Task] = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="loop-lag")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await asyncio.sleep(self.period_s)
            lag = max(0.0, loop.time() - started - self.period_s)
            self.samples.append(lag)
            self.worst_s = max(self.worst_s, lag)

    def snapshot(self) -> dict[str, Any]:
        ordered = sorted(self.samples)

        def ms(q: float) -> float:
            return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2) if ordered else 0.0

        return {"p50_ms": ms(0.5), "p99_ms": ms(0.99), "max_ms": round(self.worst_s * 1000, 2),
                "samples": len(ordered)}
