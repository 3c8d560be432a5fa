"""`RequestStream`: the event loop's view of one request.

The owner thread never touches it directly: its events arrive through
`loop.call_soon_threadsafe(stream.push, event)`, so every method here runs on
the event loop thread.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Awaitable, Callable, Optional

from mlx_invariants.engine.messages import Event, Failed, Finished, Terminal, Token
from mlx_invariants.engine.points import Point, reach

log = logging.getLogger(__name__)


class RequestStream:
    """An async iterator of `Token`s; `result` holds the one terminal event once it arrived.

    `abort()` only records the wish (the owner applies it on its next
    iteration) and is acknowledged only while the stream has not ended: an
    acknowledged abort always ends with finish reason "abort", even if the owner
    finished the request naturally in the meantime.

    `aclose()` must be called by whoever called `submit`, in a `finally`: it
    aborts an unfinished request and returns only once the engine has let go of
    it (the serialized slot or batch seat is free), also if the caller is
    cancelled again while waiting.
    """

    def __init__(
        self,
        rid: str,
        prompt_tokens: int,
        on_abort: Callable[[str], None],
        on_close: Callable[["RequestStream"], Awaitable[None]],
    ):
        self.rid = rid
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = 0
        self.result: Finished | Failed | None = None
        self.abort_acknowledged = False
        self._events: deque[Event] = deque()
        self._waiter: Optional[asyncio.Future[None]] = None
        self._on_abort = on_abort
        self._on_close = on_close
        self._ended = asyncio.get_running_loop().create_future()
        self._let_go = asyncio.get_running_loop().create_future()  # the owner's own terminal arrived
        self._closed = False
        self._chunks = 0

    # -- owner side (delivered on the loop) -------------------------------
    def push(self, event: Event) -> None:
        """Take one event from the owner thread; drops anything after the terminal event."""
        if isinstance(event, Terminal) and not self._let_go.done():
            self._let_go.set_result(None)  # the owner removed the request, whoever ended the stream first
        self._take(event)

    def _take(self, event: Event) -> None:
        if self._ended.done():
            return
        if isinstance(event, Terminal):
            if self.abort_acknowledged and isinstance(event, Finished) and event.reason != "abort":
                event = Finished(event.rid, "abort", event.prompt_tokens, event.completion_tokens)
            self.result = event
            self._ended.set_result(event)
        elif self.abort_acknowledged:
            return
        self._events.append(event)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def push_terminal_if_open(self, message: str, kind: str = "engine_stopped") -> None:
        """End a stream the owner can no longer reach (it stopped, died or is stuck) so no consumer waits
        forever; `kind` is the error code its client sees."""
        if not self._ended.done():
            self._take(Failed(self.rid, message, kind=kind))

    # -- consumer side -----------------------------------------------------
    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> Token:
        while not self._events:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        event = self._events.popleft()
        if isinstance(event, Token):
            return self._hand_out(event)
        self._events.appendleft(event)  # the terminal stays: iterating again ends again
        raise StopAsyncIteration

    def tokens_nowait(self) -> list[Token]:
        """Every token already delivered, without waiting: lets a relay send them in one write."""
        ready = []
        while self._events and isinstance(self._events[0], Token):
            ready.append(self._hand_out(self._events.popleft()))
        return ready

    def _hand_out(self, token: Token) -> Token:
        self.completion_tokens += 1
        reach(Point.CHUNK_SENT, self.rid, index=self._chunks)
        self._chunks += 1
        return token

    @property
    def ended(self) -> bool:
        return self._ended.done()

    @property
    def ended_future(self) -> "asyncio.Future[Finished | Failed]":
        """Resolved with the terminal event; engines drain on it when releasing a seat."""
        return self._ended

    @property
    def owner_let_go(self) -> "asyncio.Future[None]":
        """Resolved once the owner sent its own terminal event (it removed the request), which comes after
        `ended_future` when the engine ended the stream itself (its owner stalled)."""
        return self._let_go

    def abort(self) -> bool:
        """Ask the engine to stop this request; True if acknowledged (it will end as "abort")."""
        if self._ended.done() or self.abort_acknowledged:
            return False
        self.abort_acknowledged = True
        self._on_abort(self.rid)
        return True

    async def wait_ended(self) -> Finished | Failed:
        """The terminal event, waited for without being cancellable from outside."""
        return await asyncio.shield(self._ended)

    async def aclose(self) -> None:
        """Abort if still running and hold on until the engine released the request."""
        if self._closed:
            return
        self._closed = True
        if not self._ended.done():
            self.abort()
        await self._on_close(self)
