"""The event-loop half every reference engine shares: start, delivery, health, status, shutdown.

Liveness: the engine is unavailable (`unavailable`, `/health` 503, new requests refused at once with
`Unavailable`) once its owner thread died (an exception escaped it) or has made no progress for
`stall_timeout_s` while a request was held. Either way every request in flight ends with that error: at
once when the thread ends (its `stopped` future), and by a timer armed while requests are held for a
stall. A stalled owner that moves again makes the engine available again; a dead one never does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Optional

from mlx_invariants.engine.admission import Admission
from mlx_invariants.engine.base import EngineConfig
from mlx_invariants.engine.errors import InvalidRequest, ShuttingDown, StartupError, Unavailable
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
        self._work_since = 0.0                          # monotonic: when the first held request of a busy spell came
        self._stall_watch: Optional[asyncio.TimerHandle] = None
        self._stalled_at: Optional[float] = None        # the owner's progress_at when a stall was declared

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
        self._stalled_at = None
        owner.stopped.add_done_callback(lambda _: self._owner_ended(owner))
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
                and owner.ready.exception() is None and not owner.stopping and not self._shutting_down
                and self.unavailable is None)

    def broken_invariants(self) -> list[str]:
        """What the engine's own books say is wrong now, judged only where they are consistent (a route's owner
        thread, between its steps; the admission's, on the loop); [] when every invariant holds. A harness calls
        it at each named point. Here, on the loop, `_loop_invariants`."""
        return self._loop_invariants() if on_loop_thread() else []

    def _loop_invariants(self) -> list[str]:
        """The loop-side books: no more requests wait for admission than its queue (none in fail-fast, whose busy
        answer comes in the same loop turn)."""
        waiting, bound = self._admission.waiting, self._admission.max_queue
        return [f"{waiting} requests wait for admission, more than its queue of {bound}"] if waiting > bound else []

    @property
    def unavailable(self) -> Optional[Unavailable]:
        """Why a started owner can no longer generate: it died, or it is stalled; None otherwise (also
        while starting or shutting down, which `healthy` and `submit` answer on their own)."""
        owner = self._owner
        if (owner is None or self._shutting_down or owner.stopping or not owner.ready.done()
                or owner.ready.cancelled() or owner.ready.exception() is not None):
            return None
        if owner.crashed is not None or owner.stopped.done() or not owner.is_alive():
            cause = f": {type(owner.crashed).__name__}: {owner.crashed}" if owner.crashed is not None else ""
            return Unavailable(f"the engine's owner thread died{cause}; this server can no longer generate",
                               Unavailable.DEAD)
        if self._stalled_at is not None and owner.progress_at == self._stalled_at:
            return Unavailable(f"the engine's owner thread has made no progress for "
                               f"{time.monotonic() - owner.progress_at:.1f}s with requests waiting",
                               Unavailable.STALLED)
        return None

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
        down = self.unavailable
        if down is not None:
            raise down
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
        if not self._streams:
            self._work_since = time.monotonic()
        self._streams[pending.rid] = stream
        self._watch_stall()
        asyncio.get_running_loop().call_soon(self._posted, stream)  # once `submit` has posted it
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

    # -- liveness ------------------------------------------------------------------
    def _watch_stall(self) -> None:
        """Arm the stall timer while requests are held: it fires when the owner's last progress (or the
        first held request, if later) is `stall_timeout_s` old."""
        owner = self._owner
        if self._stall_watch is not None or not self._streams or owner is None or self._stalled_at is not None:
            return
        age = time.monotonic() - max(owner.progress_at, self._work_since)
        delay = max(0.0, self.config.stall_timeout_s - age)
        self._stall_watch = asyncio.get_running_loop().call_later(delay, self._check_stall)

    def _check_stall(self) -> None:
        self._stall_watch = None
        owner = self._owner
        if owner is None or not self._streams or self._shutting_down or owner.stopped.done():
            return
        progress = owner.progress_at
        if time.monotonic() - max(progress, self._work_since) < self.config.stall_timeout_s:
            self._watch_stall()
            return
        self._stalled_at = progress
        down = self.unavailable
        log.critical("owner thread %s stalled: %s", owner.name, down)
        for rid, stream in list(self._streams.items()):
            if not stream.ended:
                self._abort(rid)  # should it move again, it stops these at once
        self._fail_in_flight(down)
        self._recover_watch()

    def _recover_watch(self) -> None:
        """While stalled, look now and then whether the owner moved again (then the stall is over)."""
        owner = self._owner
        if self._stalled_at is None or owner is None or owner.stopped.done():
            return
        if owner.progress_at != self._stalled_at:
            log.warning("owner thread %s moved again after a stall", owner.name)
            self._stalled_at = None
            self._watch_stall()
            return
        self._stall_watch = asyncio.get_running_loop().call_later(
            min(1.0, self.config.stall_timeout_s), self._recover_watch_fired)

    def _recover_watch_fired(self) -> None:
        self._stall_watch = None
        self._recover_watch()

    def _owner_ended(self, owner: OwnerThread) -> None:
        """The owner thread is gone: unless it was stopped (shutdown) or never got ready, it died, and
        nothing it held will ever end by itself."""
        if self._stall_watch is not None:
            self._stall_watch.cancel()
            self._stall_watch = None
        if owner is not self._owner or owner.stopping:
            return
        if self._shutting_down and owner.ready.done() and not owner.ready.cancelled() \
                and owner.ready.exception() is None:
            # It died during the shutdown's grace, before being told to stop: end what it held now, not after
            # the grace periods spent waiting for a thread that is gone.
            down: Optional[Unavailable] = Unavailable(
                "the engine's owner thread died while the engine was shutting down", Unavailable.DEAD)
        else:
            down = self.unavailable
        if down is None:
            return  # startup failed: `start()` reports it
        log.critical("owner thread %s ended while serving: %s", owner.name, down)
        self._fail_in_flight(down)
        self._owner_gone()

    def _posted(self, stream: RequestStream) -> None:
        """A turn after the stream opened (its request posted): one admitted while its owner died (it waited
        for admission or the slot meanwhile) ends as the ones in flight did, and the dead inbox is emptied."""
        down = self.unavailable
        if down is not None and down.code == Unavailable.DEAD:
            stream.push_terminal_if_open(str(down), kind=down.code)
            if self._owner is not None and self._owner.stopped.done():
                self._owner_gone()

    def _fail_in_flight(self, down: Optional[Unavailable]) -> None:
        if down is None:
            return
        for stream in list(self._streams.values()):
            stream.push_terminal_if_open(str(down), kind=down.code)

    def _owner_gone(self) -> None:
        """Let go of what only the (now dead) owner would have released; no MLX work can still run."""

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
            "owner": self._owner_state(),
            "admission": self.config.admission,
            "active": self._admission.holders,
            "queued": self._admission.waiting,
            "rejected_busy": self._admission.rejected,
            "capacity": self._admission.capacity + self._admission.max_queue,  # requests held at once, queue included
            "requests": dict(self._phase),
            # every resource held for a request, by kind: all zero once every request has ended
            "held": {"streams": len(self._streams), **(self._owner.held() if self._owner is not None else {})},
        }

    def _owner_state(self) -> str:
        """`starting`, `serving`, `dead`, `stalled` or `stopped`, for /v1/status."""
        owner = self._owner
        down = self.unavailable
        if down is not None:
            return "dead" if down.code == Unavailable.DEAD else "stalled"
        if owner is None or not owner.ready.done():
            return "starting" if owner is not None and owner.is_alive() else "stopped"
        return "serving" if self.healthy else "stopped"

    async def shutdown(self, grace_s: float = 5.0) -> None:
        """Stop admitting, let running requests finish within `grace_s`, abort the rest, stop the owner.

        Every open stream ends with a terminal event: the owner's `_finish`
        aborts whatever it still holds, and anything it can no longer reach is
        ended here, so no waiter is left blocked.
        """
        self._shutting_down = True
        self._admission.close()
        if self._stall_watch is not None:
            self._stall_watch.cancel()
            self._stall_watch = None
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
                owner.abandoned.set_result(None)
        for stream in list(self._streams.values()):
            stream.push_terminal_if_open("the engine shut down")

    async def _wait_streams_ended(self, timeout: float) -> None:
        pending = [asyncio.ensure_future(s.wait_ended()) for s in self._streams.values() if not s.ended]
        if pending:
            _, not_done = await asyncio.wait(pending, timeout=timeout)
            for task in not_done:
                task.cancel()


def on_loop_thread() -> bool:
    """Whether the caller runs an event loop: the engine's loop-side books are consistent only there."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
