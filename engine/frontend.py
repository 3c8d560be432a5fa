"""The event-loop half every reference engine shares: start, delivery, health, status, shutdown."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Optional

from mlx_invariants.engine.admission import Admission
from mlx_invariants.engine.base import EngineConfig
from mlx_invariants.engine.errors import InvalidRequest, ShuttingDown, StartupError
from mlx_invariants.engine.messages import Event, Pending, Terminal
from mlx_invariants.engine.model import LoadedModel
from mlx_invariants.engine.owner import OwnerThread
from mlx_invariants.engine.stream import RequestStream

log = logging.getLogger(__name__)


class EngineFrontend:
    """Loop-side state: the streams by request id, admission, and the owner thread handle.

    Threads: every method runs on the event loop thread; the owner thread only
    reaches this object through `_deliver`, scheduled by call_soon_threadsafe.
    """

    name = "engine"

    def __init__(self, config: EngineConfig | None = None):
        self.config = config or EngineConfig()
        self._owner: Optional[OwnerThread] = None
        self._loaded: Optional[LoadedModel] = None
        self._streams: dict[str, RequestStream] = {}
        self._phase: dict[str, str] = {}
        self._admission = self._make_admission()
        self._shutting_down = False

    # -- subclass hooks --------------------------------------------------------
    def _make_admission(self) -> Admission:
        raise NotImplementedError

    def _make_owner(self, loop: asyncio.AbstractEventLoop) -> OwnerThread:
        raise NotImplementedError

    # -- lifecycle ---------------------------------------------------------------
    async def start(self) -> None:
        """Ready only once load, construction and warmup succeeded on the owner thread.

        Also after `shutdown()` returned: a server restarts its engine on a config reload, so a start
        reopens admission and a new owner thread loads the model again. What the last run still holds
        (a slot, a stream) stays held and shows in `status()`; an owner that has not stopped refuses it.
        """
        if self._owner is not None and not self._owner.stopped.done():
            raise StartupError("the engine is running, or its last owner thread has not stopped")
        self._shutting_down = False
        self._admission.reopen()
        owner = self._make_owner(asyncio.get_running_loop())
        self._owner = owner
        owner.start()
        try:
            self._loaded = await asyncio.wait_for(asyncio.shield(owner.ready), self.config.startup_timeout_s)
        except asyncio.TimeoutError:
            owner.stop()
            raise StartupError(f"engine not ready within {self.config.startup_timeout_s:g}s") from None

    @property
    def healthy(self) -> bool:
        owner = self._owner
        return (owner is not None and owner.is_alive() and owner.ready.done()
                and owner.ready.exception() is None and not owner.stopping and not self._shutting_down)

    @property
    def tokenizer(self) -> Any:
        return self._require_loaded().tokenizer

    @property
    def model_id(self) -> str:
        return self._require_loaded().model_id

    @property
    def context_length(self) -> int:
        return self._require_loaded().context_length

    def _require_loaded(self) -> LoadedModel:
        if self._loaded is None:
            raise StartupError("the engine has not started")
        return self._loaded

    # -- requests ------------------------------------------------------------------
    def _check_submittable(self, pending: Pending) -> None:
        """Refuse what can never run, before admission counts it."""
        if self._shutting_down or not self.healthy:
            raise ShuttingDown("the engine is shutting down or not ready")
        if not pending.prompt:
            raise InvalidRequest("the prompt is empty", param="prompt")
        if pending.params.max_tokens < 1:
            raise InvalidRequest("max_tokens must be at least 1", param="max_tokens")
        total = len(pending.prompt) + pending.params.max_tokens
        if total > self.context_length:
            raise InvalidRequest(
                f"this model's context window is {self.context_length} tokens; the prompt has "
                f"{len(pending.prompt)} and max_tokens asks for {pending.params.max_tokens} more",
                code="context_length_exceeded", param="max_tokens")
        if pending.rid in self._streams:
            raise InvalidRequest(f"request id {pending.rid!r} is already running", param="rid")

    def _open_stream(self, pending: Pending) -> RequestStream:
        stream = RequestStream(pending.rid, len(pending.prompt), self._abort, self._close)
        self._streams[pending.rid] = stream
        self._phase[pending.rid] = "queued"
        return stream

    def _deliver(self, events: list[Event]) -> None:
        """Route owner events to their streams (runs on the loop)."""
        for event in events:
            stream = self._streams.get(event.rid)
            if stream is None:
                continue
            if isinstance(event, Terminal):
                self._phase[event.rid] = "ended"
            elif self._phase.get(event.rid) == "queued":
                self._phase[event.rid] = "decoding"
            stream.push(event)

    def _abort(self, rid: str) -> None:
        raise NotImplementedError

    async def _close(self, stream: RequestStream) -> None:
        raise NotImplementedError

    def _forget(self, rid: str) -> None:
        self._streams.pop(rid, None)
        self._phase.pop(rid, None)

    def status(self) -> dict[str, Any]:
        return {
            "engine": self.name,
            "healthy": self.healthy,
            "shutting_down": self._shutting_down,
            "admission": self.config.admission,
            "active": self._admission.holders,
            "queued": self._admission.waiting,
            "rejected_busy": self._admission.rejected,
            "capacity": self._admission.capacity + self._admission.max_queue,  # requests held at once, queue included
            "requests": dict(self._phase),
            # every resource held for a request, by kind: all zero once every request has ended
            "held": {"streams": len(self._streams), **(self._owner.held() if self._owner is not None else {})},
        }

    async def shutdown(self, grace_s: float = 5.0) -> None:
        """Stop admitting, let running requests finish within `grace_s`, abort the rest, stop the owner.

        Every open stream ends with a terminal event: the owner's `_finish`
        aborts whatever it still holds, and anything it can no longer reach is
        ended here, so no waiter is left blocked.
        """
        self._shutting_down = True
        self._admission.close()
        await self._wait_streams_ended(grace_s)
        for stream in list(self._streams.values()):
            stream.abort()
        await self._wait_streams_ended(max(grace_s, 1.0))
        owner = self._owner
        if owner is not None:
            owner.stop()
            try:
                await asyncio.wait_for(asyncio.shield(owner.stopped), max(grace_s, 1.0) + 5.0)
            except asyncio.TimeoutError:
                log.error("owner thread %s did not stop in time", owner.name)
        for stream in list(self._streams.values()):
            stream.push_terminal_if_open("the engine shut down")

    async def _wait_streams_ended(self, timeout: float) -> None:
        pending = [asyncio.ensure_future(s.wait_ended()) for s in self._streams.values() if not s.ended]
        if pending:
            _, not_done = await asyncio.wait(pending, timeout=timeout)
            for task in not_done:
                task.cancel()
