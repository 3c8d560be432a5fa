"""`BatchedEngine`: continuous batching on mlx-lm's `BatchGenerator`, admitted per step."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from engine.admission import Admission
from engine.drain import wait_through_cancellation
from engine.frontend import EngineFrontend
from engine.messages import Event, Failed, Finished, Pending, Token
from engine.owner import OwnerThread
from engine.points import Point, reach
from engine.sampling import StopMatcher, logprob_of, make_request_sampler
from engine.stream import RequestStream

log = logging.getLogger(__name__)


# Warmup probes (token 0 is in every vocabulary): a lone prefill, then a padded pair of prefills.
WARMUP_PROMPTS = ([[0] * 4], [[0] * 4, [0] * 2])


@dataclass
class Active:
    """Owner-side state of one request inside the batch."""

    pending: Pending
    uid: int
    detokenizer: Any
    stops: StopMatcher
    produced: int = 0


class BatchOwner(OwnerThread):
    """Owns the `BatchGenerator`: builds it, warms it, and is the only caller of insert/next/remove/close.

    Each iteration: take new requests and aborts in one critical section (so no
    abort can fall between leaving the inbox and entering the batch), apply the
    aborts, insert every new request, run exactly one `next()`, dispatch. A
    request arriving mid-decode is inserted before the next step, so its first
    token comes within a couple of steps instead of after the batch drains.
    """

    def __init__(self, *args: Any, max_batch: int, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.max_batch = max_batch
        self._pending: list[Pending] = []   # guarded by self.lock
        self._aborts: set[str] = set()      # guarded by self.lock
        self._active: dict[int, Active] = {}
        self._uid_of: dict[str, int] = {}
        self._generator: Any = None

    # -- loop side: record only, under the short lock ---------------------------
    def post(self, pending: Pending) -> None:
        with self.lock:
            self._pending.append(pending)
        self.wake()

    def abort(self, rid: str) -> None:
        with self.lock:
            self._aborts.add(rid)
        self.wake()

    # -- owner thread --------------------------------------------------------------
    def _start(self) -> None:
        super()._start()
        self._generator = self._build()
        if self.warmup_enabled:
            self._warmup()

    def _build(self) -> Any:
        from mlx_lm.generate import BatchGenerator

        eos = sorted(self.loaded.tokenizer.eos_token_ids)
        return BatchGenerator(self.loaded.model, stop_tokens=[[t] for t in eos],
                              completion_batch_size=self.max_batch,
                              prefill_batch_size=min(8, self.max_batch))

    def _warmup(self) -> None:
        """Probes through the prefill paths requests take, so none pays a GPU's first-use kernel compile.

        A lone multi-token prompt (prefill), then two prompts of different
        lengths together (padded prefill, batched decode): on MLX's CUDA backend
        the first of each cost 9.5 s and 7.8 s, a one-token probe covers neither.
        """
        for prompts in WARMUP_PROMPTS:
            self._probe(prompts)

    def _probe(self, prompts: list[list[int]]) -> None:
        """One token for each prompt; the probes are removed even if a step fails."""
        uids = self._generator.insert(prompts, max_tokens=[1] * len(prompts))
        try:
            left = set(uids)
            for _ in range(16):
                _, generated = self._generator.next()
                left -= {r.uid for r in generated if r.finish_reason}
                if not left:
                    break
        finally:
            self._generator.remove(uids)

    def _iteration(self) -> None:
        self._wait_if_idle()
        new, aborts = self._take_inbox()
        events: list[Event] = []
        try:
            new = self._apply_aborts(aborts, new, events)
            self._admit(new, events)
            self._step(events)
        except Exception as exc:  # an MLX error: fail the requests in the step, rebuild, go on
            self._fail_batch(exc, events)
        self.emit(events)

    def _wait_if_idle(self) -> None:
        """Block while there is nothing to decode and nothing posted; never spin."""
        if self._active:
            return
        with self.lock:
            idle = not self._pending and not self._aborts
        if idle:
            self.wait_for_work()

    def _take_inbox(self) -> tuple[list[Pending], set[str]]:
        """New requests and aborts, taken together: every aborted id is now new, active, or already over."""
        with self.lock:
            new, self._pending = self._pending, []
            aborts, self._aborts = self._aborts, set()
        return new, aborts

    def _apply_aborts(self, aborts: set[str], new: list[Pending], events: list[Event]) -> list[Pending]:
        """Remove aborted requests from the batch; aborted new ones never enter it. Returns the rest."""
        kept = []
        for pending in new:
            if pending.rid in aborts:
                self._end(pending, 0, Finished(pending.rid, "abort", len(pending.prompt), 0), events)
            else:
                kept.append(pending)
        for rid in aborts:
            uid = self._uid_of.get(rid)
            if uid is not None:
                self._generator.remove([uid])
                self._retire(uid, "abort", events)
        return kept

    def _admit(self, new: list[Pending], events: list[Event]) -> None:
        """Insert every new request now, between two steps."""
        admitted = []
        for pending in new:
            try:
                reach(Point.WORKER_STARTED, pending.rid)
            except Exception as exc:
                self._end(pending, 0, Failed(pending.rid, f"insert failed: {type(exc).__name__}: {exc}"), events)
            else:
                admitted.append(pending)
        if not admitted:
            return
        uids = self._generator.insert(
            [list(p.prompt) for p in admitted],
            max_tokens=[p.params.max_tokens for p in admitted],
            samplers=[make_request_sampler(p.params) for p in admitted],
        )
        tokenizer = self.loaded.tokenizer
        for pending, uid in zip(admitted, uids):
            self._active[uid] = Active(pending, uid, tokenizer.detokenizer, StopMatcher(pending.params.stop))
            self._uid_of[pending.rid] = uid

    def _step(self, events: list[Event]) -> None:
        """Exactly one `next()`; turn its responses into events."""
        if not self._active:
            return
        for active in list(self._active.values()):
            reach(Point.BEFORE_DECODE, active.pending.rid, step=active.produced)
        _, generated = self._generator.next()
        for response in generated:
            active = self._active.get(response.uid)
            if active is not None:
                self._take_token(active, response, events)

    def _take_token(self, active: Active, response: Any, events: list[Event]) -> None:
        rid, params = active.pending.rid, active.pending.params
        if active.produced == 0:
            reach(Point.PREFILL_DONE, rid)
        active.produced += 1
        active.detokenizer.add_token(response.token)
        if response.finish_reason is not None:
            active.detokenizer.finalize()
        text, stopped = active.stops.feed(active.detokenizer.last_segment)
        logprob = logprob_of(response.logprobs, response.token) if params.logprobs else None
        events.append(Token(rid, response.token, text, logprob))
        if stopped and response.finish_reason is None:
            self._generator.remove([active.uid])  # still in the batch: a stop string is ours, not mlx-lm's
        if stopped or response.finish_reason is not None:
            self._retire(active.uid, "stop" if stopped else response.finish_reason, events)

    def _retire(self, uid: int, reason: str, events: list[Event]) -> None:
        active = self._active.pop(uid)
        del self._uid_of[active.pending.rid]
        pending = active.pending
        self._end(pending, active.produced, Finished(pending.rid, reason, len(pending.prompt), active.produced), events)

    @staticmethod
    def _end(pending: Pending, produced: int, terminal: Finished | Failed, events: list[Event]) -> None:
        """The request's last MLX work is over: mark it, then queue its terminal event."""
        reach(Point.FINISHED, pending.rid)
        events.append(terminal)

    def _fail_batch(self, exc: Exception, events: list[Event]) -> None:
        """A step raised: every request in the batch fails with the cause, and the generator is rebuilt."""
        log.error("batch step failed; failing %d request(s): %s", len(self._active), exc, exc_info=True)
        message = f"generation step failed: {type(exc).__name__}: {exc}"
        for active in list(self._active.values()):
            self._end(active.pending, active.produced, Failed(active.pending.rid, message), events)
        self._active.clear()
        self._uid_of.clear()
        self._generator.close()
        self._generator = self._build()

    def _finish(self) -> None:
        """End every request still held (queued or in the batch), then close the generator."""
        events: list[Event] = []
        with self.lock:
            queued, self._pending = self._pending, []
        for pending in queued:
            self._end(pending, 0, Finished(pending.rid, "abort", len(pending.prompt), 0), events)
        for active in list(self._active.values()):
            rid = active.pending.rid
            terminal: Finished | Failed = (
                Failed(rid, f"engine stopped: {self.crashed}") if self.crashed
                else Finished(rid, "abort", len(active.pending.prompt), active.produced))
            self._end(active.pending, active.produced, terminal, events)
        self._active.clear()
        self._uid_of.clear()
        self.emit(events)
        if self._generator is not None:
            self._generator.close()
            self._generator = None  # so its finalizer never runs on whichever thread collects it


class BatchedEngine(EngineFrontend):
    """Continuous batching: many requests decode together on the owner thread.

    Threads: the owner thread alone drives the `BatchGenerator`. Handoffs:
    `Pending` and abort ids recorded under the owner's short lock; events back
    through `_deliver`. Costs: a new request waits at most one decode step
    before insertion; an abort is applied before the next step; beyond
    `max_batch + max_batch_queue` open requests, 503 `engine_overloaded` at once.
    """

    name = "batched"

    def _make_admission(self) -> Admission:
        c = self.config
        return Admission(c.max_batch + c.max_batch_queue, c.admission, c.max_queue, c.max_wait_ms / 1000.0,
                         busy_code="engine_overloaded", retry_after=c.retry_after_s)

    def _make_owner(self, loop: asyncio.AbstractEventLoop) -> BatchOwner:
        return BatchOwner(self.name, self.config.model, loop, self._deliver, self.config.warmup,
                          max_batch=self.config.max_batch)

    async def submit(self, pending: Pending) -> RequestStream:
        self._check_submittable(pending)
        await self._admission.enter()
        reach(Point.ADMITTED, pending.rid)
        stream = self._open_stream(pending)
        reach(Point.SLOT_ACQUIRED, pending.rid)
        self._owner.post(pending)
        return stream

    def _abort(self, rid: str) -> None:
        self._owner.abort(rid)

    async def _close(self, stream: RequestStream) -> None:
        """Hold the seat until the owner has sent the terminal event, i.e. removed the request."""
        self._phase[stream.rid] = "draining"
        try:
            await wait_through_cancellation(stream.ended_future)
        finally:
            self._forget(stream.rid)
            reach(Point.SLOT_RELEASED, stream.rid)
            self._admission.leave()
