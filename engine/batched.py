"""`BatchedEngine`: continuous batching on mlx-lm's `BatchGenerator`, admitted per step."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from mlx_invariants.engine.admission import Admission
from mlx_invariants.engine.drain import wait_through_cancellation
from mlx_invariants.engine.errors import Unavailable
from mlx_invariants.engine.frontend import EngineFrontend
from mlx_invariants.engine.messages import Event, Failed, Finished, Pending, SamplingParams, Token
from mlx_invariants.engine.owner import OwnerThread
from mlx_invariants.engine.points import Point, reach
from mlx_invariants.engine.prefill import FirstToken, pads_prefill, prefill, warmup_lengths
from mlx_invariants.engine.sampling import (WARMUP_SAMPLED, StopMatcher, logprob_of, make_request_sampler,
                                            read_logprobs, top_logprobs_of)
from mlx_invariants.engine.stream import RequestStream

log = logging.getLogger(__name__)


# Warmup probes (token 0 is in every vocabulary): a lone prompt, then two prompts of different lengths
# decoding together, the shapes every request takes (prefill at batch 1, merged caches, batched decode).
WARMUP_PROMPTS = ([[0] * 4], [[0] * 4, [0] * 2])
WARMUP_TOKENS = 3  # the prefill's token, then two batched decode steps


@dataclass
class Active:
    """Owner-side state of one started request: its first token is out, it may be in the batch."""

    pending: Pending
    detokenizer: Any
    stops: StopMatcher
    uid: int = -1  # the BatchGenerator's id, once inserted
    produced: int = 0


class BatchOwner(OwnerThread):
    """Owns the `BatchGenerator`: builds it, warms it, and is the only caller of insert/next/remove/close.

    Each iteration: take new requests and aborts in one critical section (so no
    abort can fall between leaving the inbox and entering the batch), apply the
    aborts, start every request the batch has a seat for (prefill here, first
    token out, primed cache inserted), run exactly one `next()`, dispatch. A
    request arriving mid-decode has its first token before the next step and
    decodes with the batch from the one after; requests beyond `max_batch` wait
    here, unprefilled, in arrival order.
    """

    def __init__(self, *args: Any, max_batch: int, pad_prefill: bool | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.max_batch = max_batch
        self.pad_prefill = pad_prefill  # None: decided on the owner thread, from the device MLX runs on
        self._pending: list[Pending] = []   # guarded by self.lock
        self._aborts: set[str] = set()      # guarded by self.lock
        self._waiting: deque[Pending] = deque()
        self._starting: dict[str, Pending] = {}  # taken from `_waiting`, not yet in the batch nor ended
        self._active: dict[int, Active] = {}
        self._uid_of: dict[str, int] = {}
        self._generator: Any = None
        self._generator_rows = 0  # what the generator itself holds, written here before each emit
        self._eos: frozenset[int] = frozenset()

    # -- loop side: record only, under the short lock ---------------------------
    def post(self, pending: Pending) -> None:
        with self.lock:
            self._pending.append(pending)
        self.wake()

    def abort(self, rid: str) -> None:
        with self.lock:
            self._aborts.add(rid)
        self.wake()

    def drain(self) -> None:
        """Drop the requests and aborts posted and not taken; only once this thread is gone."""
        with self.lock:
            self._pending, self._aborts = [], set()

    def held(self) -> dict[str, int]:
        """The owner's books (`seats`), and the inbox's requests and aborts."""
        with self.lock:
            inbox, aborts = len(self._pending), len(self._aborts)
        return self.seats() | {"inbox": inbox, "aborts": aborts}

    def seats(self) -> dict[str, int]:
        """Generator rows (as the owner's books and as the generator itself counts them), started requests and
        requests waiting for a seat. No lock: a check made on the owner thread at a point inside its iteration
        must not wait for the inbox lock, which the owner itself may hold there."""
        return {"rows": len(self._uid_of), "generator": self._generator_rows, "running": len(self._active),
                "waiting": len(self._waiting)}

    def emit(self, events: list[Event]) -> None:
        """The generator's own row count is taken before the events go out, so the loop never sees a request
        end with the count from before its row left: a row the owner's books dropped but the generator kept
        (a missed `remove`) shows in `status()` once every request has ended."""
        self._generator_rows = _rows_in(self._generator)
        super().emit(events)

    # -- owner thread --------------------------------------------------------------
    def _start(self) -> None:
        super()._start()
        self._eos = frozenset(self.loaded.tokenizer.eos_token_ids)
        if self.pad_prefill is None:
            self.pad_prefill = pads_prefill()
        self._generator = self._build()
        if self.warmup_enabled:
            self._warmup()

    def _build(self) -> Any:
        from mlx_lm.generate import BatchGenerator

        # prefill_batch_size: how many primed requests join the decode per step; all of them.
        return BatchGenerator(self.loaded.model, stop_tokens=[[t] for t in sorted(self._eos)],
                              completion_batch_size=self.max_batch, prefill_batch_size=self.max_batch)

    def _warmup(self) -> None:
        """Probes through the paths requests take, so none pays a GPU's first-use kernel compile.

        A lone multi-token prompt, then two of different lengths decoding
        together: on MLX's CUDA backend the first prefill and the first padded
        pair cost 9.5 s and 7.8 s; a one-token probe covers neither. Then a pair
        on the sampled paths (top-p, a seeded draw, top log-probabilities), which
        compile kernels of their own. With padded prefill, every bucket's shape
        too, so no prompt length is new.
        """
        greedy = SamplingParams(max_tokens=WARMUP_TOKENS)
        for prompts in WARMUP_PROMPTS:
            self._probe([(prompt, greedy) for prompt in prompts])
        self._probe([([0] * 4, WARMUP_SAMPLED[0]), ([0] * 2, WARMUP_SAMPLED[1])])
        if self.pad_prefill:
            sampler = make_request_sampler(greedy)
            for length in warmup_lengths():
                self._prefill([0] * length, sampler)

    def _probe(self, rows: list[tuple[list[int], SamplingParams]]) -> None:
        """Each prompt prefilled with its params' sampler, then decoded together, reading the log-probabilities
        as a request with those params does; the probes are removed even if a step fails."""
        samplers = [make_request_sampler(params) for _, params in rows]
        firsts = [self._prefill(prompt, sampler) for (prompt, _), sampler in zip(rows, samplers)]
        for first in firsts:
            read_logprobs(first.logprobs, first.token)
        uids = self._generator.insert([[f.token] for f in firsts], max_tokens=[WARMUP_TOKENS - 1] * len(rows),
                                      caches=[f.cache for f in firsts], all_tokens=[prompt for prompt, _ in rows],
                                      samplers=samplers)
        try:
            left = set(uids)
            for _ in range(16):
                _, generated = self._generator.next()
                for response in generated:
                    read_logprobs(response.logprobs, response.token)
                left -= {r.uid for r in generated if r.finish_reason}
                if not left:
                    break
        finally:
            self._generator.remove(uids)

    def _prefill(self, prompt: Sequence[int], sampler: Any) -> FirstToken:
        return prefill(self.loaded.model, prompt, sampler, self._generator.stream, pad=bool(self.pad_prefill))

    def _iteration(self) -> None:
        self._wait_if_idle()
        new, aborts = self._take_inbox()
        events: list[Event] = []
        try:
            self._apply_aborts(aborts, new, events)
            self._admit(events)
            self.emit(events)  # aborts and failed starts go out now, not one step later
            events = []
            self._step(events)
        except Exception as exc:  # an MLX error: fail the requests in the step, rebuild, go on
            self._fail_batch(exc, events)
        except BaseException as exc:  # the loop itself dies (`_serve`): unhealthy first, then what was decided
            self.crashed = exc
            self.emit(events)
            raise
        self.emit(events)

    def _wait_if_idle(self) -> None:
        """Block while there is nothing to decode and nothing posted; never spin."""
        if self._active or self._waiting:
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

    def _apply_aborts(self, aborts: set[str], new: list[Pending], events: list[Event]) -> None:
        """Remove aborted requests from the batch; aborted waiting ones never start. The rest wait their turn."""
        waiting = deque()
        for pending in [*self._waiting, *new]:
            if pending.rid in aborts:
                self._end(pending, Finished(pending.rid, "abort", len(pending.prompt), 0), events)
            else:
                waiting.append(pending)
        self._waiting = waiting
        for rid in aborts:
            uid = self._uid_of.get(rid)
            if uid is not None:
                self._generator.remove([uid])
                self._retire(uid, "abort", events)

    def _admit(self, events: list[Event]) -> None:
        """Start waiting requests while the batch has seats; insert the ones still going, all at once."""
        started: list[tuple[Active, FirstToken, Any]] = []
        while self._waiting and len(self._active) + len(started) < self.max_batch:
            own: list[Event] = []
            pending = self._waiting.popleft()
            self._starting[pending.rid] = pending
            begun = self._begin(pending, own)
            self.emit(own)  # each first token as soon as it exists, not after the whole burst's prefills
            if begun is not None:
                started.append(begun)
        if not started:
            return
        try:
            uids = self._generator.insert(
                [[first.token] for _, first, _ in started],
                max_tokens=[a.pending.params.max_tokens - a.produced for a, _, _ in started],
                caches=[first.cache for _, first, _ in started],
                all_tokens=[list(a.pending.prompt) for a, _, _ in started],
                samplers=[sampler for _, _, sampler in started],
            )
        except Exception as exc:  # nothing entered the batch: only these requests fail
            log.error("insert failed; failing %d request(s): %s", len(started), exc, exc_info=True)
            for active, _, _ in started:
                self._end(active.pending, Failed(active.pending.rid, _failure("insert failed", exc)), events)
            return
        for (active, _, _), uid in zip(started, uids):
            active.uid = uid
            self._starting.pop(active.pending.rid, None)
            self._active[uid] = active
            self._uid_of[active.pending.rid] = uid

    def _begin(self, pending: Pending, events: list[Event]) -> Optional[tuple[Active, FirstToken, Any]]:
        """Prefill one request and queue its first token; returns what to insert, or None if it ended here."""
        rid = pending.rid
        active = Active(pending, self.loaded.tokenizer.detokenizer, StopMatcher(pending.params.stop))
        try:
            reach(Point.WORKER_STARTED, rid)
            sampler = make_request_sampler(pending.params)
            first = self._prefill(pending.prompt, sampler)
            reach(Point.PREFILL_DONE, rid)
            ends = "stop" if first.token in self._eos else "length" if pending.params.max_tokens <= 1 else None
            reason = self._take_token(active, first.token, first.logprobs, ends, events)
        except Exception as exc:  # its own cache and sample: the batch is untouched, only this request fails
            log.error("request %s failed to start: %s", rid, exc, exc_info=True)
            self._end(pending, Failed(rid, _failure("prefill failed", exc)), events)
            return None
        if reason is not None:
            self._end(pending, Finished(rid, reason, len(pending.prompt), active.produced), events)
            return None
        return active, first, sampler

    def _step(self, events: list[Event]) -> None:
        """Exactly one `next()`; turn its responses into events."""
        if not self._active:
            return
        for active in list(self._active.values()):
            reach(Point.BEFORE_DECODE, active.pending.rid, step=active.produced)
        _, generated = self._generator.next()
        for response in generated:
            active = self._active.get(response.uid)
            if active is None:
                continue
            reason = self._take_token(active, response.token, response.logprobs, response.finish_reason, events)
            if reason is not None:
                if response.finish_reason is None:
                    self._generator.remove([active.uid])  # still in the batch: a stop string is ours, not mlx-lm's
                self._retire(active.uid, reason, events)

    def _take_token(self, active: Active, token: int, logprobs: Any, finish_reason: Optional[str],
                    events: list[Event]) -> Optional[str]:
        """Queue the token's event; returns why the request ends here (mlx-lm's reason or a stop string), if it does."""
        params = active.pending.params
        active.produced += 1
        active.detokenizer.add_token(token)
        if finish_reason is not None:
            active.detokenizer.finalize()
        text, stopped = active.stops.feed(active.detokenizer.last_segment)
        logprob = logprob_of(logprobs, token) if params.logprobs else None
        top = top_logprobs_of(logprobs, params.top_logprobs)
        events.append(Token(active.pending.rid, token, text, logprob, top))
        return "stop" if stopped else finish_reason

    def _retire(self, uid: int, reason: str, events: list[Event]) -> None:
        active = self._active.pop(uid)
        del self._uid_of[active.pending.rid]
        pending = active.pending
        self._end(pending, Finished(pending.rid, reason, len(pending.prompt), active.produced), events)

    def _end(self, pending: Pending, terminal: Finished | Failed, events: list[Event]) -> None:
        """The request's last MLX work is over: mark it, then queue its terminal event."""
        self._starting.pop(pending.rid, None)
        reach(Point.FINISHED, pending.rid)
        events.append(terminal)

    def _ended_by_stop(self, rid: str, prompt_tokens: int, produced: int) -> Finished | Failed:
        """How a request the owner still holds ends when its loop ends: aborted, or failed if it crashed."""
        if self.crashed is None:
            return Finished(rid, "abort", prompt_tokens, produced)
        return Failed(rid, f"the engine's owner thread died: {type(self.crashed).__name__}: {self.crashed}",
                      kind=Unavailable.DEAD)

    def _fail_batch(self, exc: Exception, events: list[Event]) -> None:
        """A step raised: every request in the batch fails with the cause, and the generator is rebuilt."""
        log.error("batch step failed; failing %d request(s): %s", len(self._active), exc, exc_info=True)
        message = _failure("generation step failed", exc)
        for active in list(self._active.values()):
            self._end(active.pending, Failed(active.pending.rid, message), events)
        self._active.clear()
        self._uid_of.clear()
        self._generator.close()
        self._generator = self._build()

    def _finish(self) -> None:
        """End every request still held (queued, waiting or in the batch), then close the generator."""
        events: list[Event] = []
        with self.lock:
            queued, self._pending = self._pending, []
        for pending in [*self._waiting, *queued]:
            self._end(pending, Finished(pending.rid, "abort", len(pending.prompt), 0), events)
        self._waiting.clear()
        for pending in list(self._starting.values()):  # the loop died while starting them
            self._end(pending, self._ended_by_stop(pending.rid, len(pending.prompt), 0), events)
        for active in list(self._active.values()):
            pending = active.pending
            self._end(pending, self._ended_by_stop(pending.rid, len(pending.prompt), active.produced), events)
        self._active.clear()
        self._uid_of.clear()
        self.emit(events)
        if self._generator is not None:
            self._generator.close()
            self._generator = None  # so its finalizer never runs on whichever thread collects it
        self._generator_rows = 0


def _rows_in(generator: Any) -> int:
    """Sequences `generator` holds in any stage (queued, prefilling, decoding); mlx-lm 0.32 has no public count."""
    if generator is None:
        return 0
    return (len(generator._unprocessed_sequences) + len(generator._prompt_batch)
            + len(generator._generation_batch))


def _failure(what: str, exc: Exception) -> str:
    return f"{what}: {type(exc).__name__}: {exc}"


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
                          max_batch=self.config.max_batch, pad_prefill=self.config.pad_prefill)

    async def submit(self, pending: Pending) -> RequestStream:
        self._check_submittable(pending)
        await self._admission.enter()
        reach(Point.ADMITTED, pending.rid)
        stream = self._open_stream(pending)
        reach(Point.SLOT_ACQUIRED, pending.rid)
        self._owner.post(pending)
        return stream

    def _owner_gone(self) -> None:
        """The owner died: what it never took from its inbox is dropped (its streams are ended)."""
        self._owner.drain()

    def _abort(self, rid: str) -> None:
        self._owner.abort(rid)

    def broken_invariants(self) -> list[str]:
        """Adds, on the owner thread: no more requests started, nor rows in the generator, than the batch's seats
        (a burst started past them stalls every running stream for its prefills and strands its extra rows)."""
        owner = self._owner
        if owner is None or threading.current_thread() is not owner:
            return super().broken_invariants()
        held = owner.seats()
        return [f"{held[count]} {what}, more than the batch's {owner.max_batch} seats"
                for count, what in (("running", "requests started"), ("rows", "rows in the generator"))
                if held[count] > owner.max_batch]

    def status(self) -> dict[str, Any]:
        """Adds how prompts are prefilled, `padded` or `exact`, as the owner decided at startup."""
        pad = self._owner.pad_prefill if self._owner is not None else self.config.pad_prefill
        return super().status() | {"prefill": {None: "auto", True: "padded", False: "exact"}[pad]}

    async def _close(self, stream: RequestStream) -> None:
        """Hold the seat until the owner has sent the terminal event, i.e. removed the request."""
        self._phase[stream.rid] = "draining"
        try:
            await wait_through_cancellation(stream.ended_future)
            await wait_through_cancellation(self._owner_let_go(stream))
        finally:
            self._forget(stream.rid)
            self._admission.leave()
            reach(Point.SLOT_RELEASED, stream.rid)  # after the seat went to the next waiter, as on the serialized route

    def _owner_let_go(self, stream: RequestStream) -> asyncio.Future:
        """Resolved once the owner removed the request's row (its own terminal event), stopped for good, or was
        abandoned by a shutdown (stuck, it never will). A stream the engine ended itself (its owner stalled,
        maybe inside MLX on this row) keeps its seat until then: a seat freed earlier would let one request
        more into the batch than its bound once the owner moves again."""
        owner = self._owner
        if stream.owner_let_go.done() or owner is None or owner.stopped.done() or owner.abandoned.done():
            return stream.ended_future
        done = asyncio.get_running_loop().create_future()
        for future in (stream.owner_let_go, owner.stopped, owner.abandoned):
            future.add_done_callback(lambda _: done.done() or done.set_result(None))
        return done
