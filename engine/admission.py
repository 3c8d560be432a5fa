"""Admission: decide at once, before any byte is sent, whether a request may run.

This is the only place a request waits for capacity, and the wait is bounded
in both depth and time (milliseconds). Nothing waits on an MLX lock with a
timeout: a lock acquired under a timeout is an admission queue in disguise,
and under agent traffic it piles requests up for minutes.
"""

from __future__ import annotations

import asyncio
from collections import deque

from mlx_invariants.engine.base import AdmissionMode
from mlx_invariants.engine.errors import Busy, ShuttingDown


class Admission:
    """At most `capacity` holders; in wait mode up to `max_queue` more wait FIFO, each at most `max_wait_s`.

    Costs: fail-fast answers Busy within the same loop turn; wait mode within
    `max_wait_s`. Every refusal is counted in `rejected`.
    """

    def __init__(self, capacity: int, mode: AdmissionMode = "fail-fast", max_queue: int = 0,
                 max_wait_s: float = 0.0, busy_code: str = "text_generation_busy", retry_after: float = 1.0):
        self.capacity = capacity
        self.mode = mode
        self.max_queue = max_queue if mode == "wait" else 0
        self.max_wait_s = max_wait_s
        self.busy_code = busy_code
        self.retry_after = retry_after
        self.holders = 0
        self.rejected = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def _busy(self, why: str) -> Busy:
        self.rejected += 1
        return Busy(f"{why}; retry after {self.retry_after:g}s", code=self.busy_code, retry_after=self.retry_after)

    async def enter(self) -> None:
        """Take a place or raise `Busy`/`ShuttingDown`; pair every successful call with `leave()`."""
        if self._closed:
            raise ShuttingDown("the engine is shutting down and admits no new requests")
        if self.holders < self.capacity and not self._waiters:
            self.holders += 1
            return
        if len(self._waiters) >= self.max_queue:
            raise self._busy("the engine is busy generating")
        loop = asyncio.get_running_loop()
        grant: asyncio.Future[None] = loop.create_future()
        self._waiters.append(grant)
        expiry = loop.call_later(self.max_wait_s, self._expire, grant)
        try:
            await grant
        except asyncio.CancelledError:
            if grant.done() and not grant.cancelled() and grant.exception() is None:
                self.leave()  # granted in the same turn we were cancelled: pass the place on
            elif grant in self._waiters:
                self._waiters.remove(grant)
            raise
        finally:
            expiry.cancel()

    def _expire(self, grant: asyncio.Future[None]) -> None:
        if not grant.done():
            self._waiters.remove(grant)
            grant.set_exception(self._busy(f"no generation slot freed within {self.max_wait_s * 1000:.0f} ms"))

    def leave(self) -> None:
        """Give a place back; the oldest live waiter inherits it."""
        self.holders -= 1
        while self._waiters:
            grant = self._waiters.popleft()
            if not grant.done():
                self.holders += 1
                grant.set_result(None)
                return

    def reopen(self) -> None:
        """Admit again after `close()`: the engine started again. Places still held stay held (their
        `leave()` is still to come), so a holder of the last run shows in `holders`, not lost."""
        self._closed = False

    def close(self) -> None:
        """Refuse everyone until `reopen()`, waiters included."""
        self._closed = True
        while self._waiters:
            grant = self._waiters.popleft()
            if not grant.done():
                grant.set_exception(ShuttingDown("the engine is shutting down"))
