"""`SimpleEngine`: the serialized route, one request generating at a time."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Optional

from mlx_invariants.engine.admission import Admission
from mlx_invariants.engine.drain import wait_through_cancellation
from mlx_invariants.engine.frontend import EngineFrontend
from mlx_invariants.engine.messages import Failed, Finished, Pending, SamplingParams, Token
from mlx_invariants.engine.owner import OwnerThread
from mlx_invariants.engine.points import Point, reach
from mlx_invariants.engine.sampling import (WARMUP_SAMPLED, StopMatcher, logprob_of, make_request_sampler,
                                            read_logprobs, top_logprobs_of)
from mlx_invariants.engine.stream import RequestStream

log = logging.getLogger(__name__)


@dataclass
class Job:
    """One request's work order for the owner thread.

    `stop` is the only field the loop writes after submission (a thread-safe
    flag checked every token); `done` is a loop future the owner resolves once
    it has made its last MLX call for this job.
    """

    pending: Pending
    done: asyncio.Future
    stop: threading.Event = field(default_factory=threading.Event)


class SerialOwner(OwnerThread):
    """Runs jobs one at a time, token by token, checking the stop flag after every token."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._inbox: "queue.SimpleQueue[Optional[Job]]" = queue.SimpleQueue()

    def post(self, job: Job) -> None:
        self._inbox.put(job)

    def drain(self) -> None:
        """Drop every job posted and not taken; only once this thread is gone (its engine ends them)."""
        while True:
            try:
                self._inbox.get_nowait()
            except queue.Empty:
                return

    def held(self) -> dict[str, int]:
        """Jobs posted and not yet taken (the stop marker included, once stopping)."""
        return {"inbox": self._inbox.qsize()}

    def stop(self) -> None:
        super().stop()
        self._inbox.put(None)

    def _start(self) -> None:
        super()._start()
        if self.warmup_enabled:
            self._warmup()

    def _warmup(self) -> None:
        """Real tokens through the paths requests take (greedy, then each sampled one, reading the
        log-probabilities as such a request does), so the first request pays no compile cost."""
        from mlx_lm import stream_generate

        model, tokenizer = self.loaded.model, self.loaded.tokenizer
        for params in (SamplingParams(max_tokens=1), *WARMUP_SAMPLED):
            generator = stream_generate(model, tokenizer, [0], max_tokens=params.max_tokens,
                                        sampler=make_request_sampler(params))
            try:
                for response in generator:
                    read_logprobs(response.logprobs, response.token)
            finally:
                generator.close()

    def _iteration(self) -> None:
        if self._inbox.empty():
            self.going_idle()  # a job posted from here on is in the inbox before `get` looks
        job = self._inbox.get()
        self.beat()
        if job is not None:
            self._run(job)

    def _run(self, job: Job) -> None:
        """Generate one request; the terminal event is always sent, then `done` is resolved."""
        rid = job.pending.rid
        try:
            self.emit([self._generate(job)])
        except Exception as exc:  # an MLX or model error: this request fails, the engine goes on
            log.error("request %s failed on the owner thread: %s", rid, exc, exc_info=True)
            self.emit([Failed(rid, f"generation failed: {type(exc).__name__}: {exc}")])
        except BaseException as exc:  # the owner dies (`_serve`): unhealthy before the loop hears the job is done
            self.crashed = exc
            raise
        finally:
            try:
                reach(Point.FINISHED, rid)
            finally:
                self._to_loop(self._resolve, job.done, None)

    def _generate(self, job: Job) -> Finished:
        from mlx_lm import stream_generate

        pending, params = job.pending, job.pending.params
        rid, tokenizer = pending.rid, self.loaded.tokenizer
        reach(Point.WORKER_STARTED, rid)
        if job.stop.is_set():
            return Finished(rid, "abort", len(pending.prompt), 0)
        sampler = make_request_sampler(params)
        stops = StopMatcher(params.stop)
        generator = stream_generate(self.loaded.model, tokenizer, list(pending.prompt),
                                    max_tokens=params.max_tokens, sampler=sampler)
        produced, reason = 0, "length"
        try:
            for response in generator:
                if produced == 0:
                    reach(Point.PREFILL_DONE, rid)
                produced += 1
                text, stopped = stops.feed(response.text)
                logprob = logprob_of(response.logprobs, response.token) if params.logprobs else None
                top = top_logprobs_of(response.logprobs, params.top_logprobs)
                self.emit([Token(rid, response.token, text, logprob, top)])
                if stopped or response.finish_reason == "stop":
                    reason = "stop"
                    break
                if response.finish_reason == "length":
                    break
                if job.stop.is_set():
                    reason = "abort"
                    break
                reach(Point.BEFORE_DECODE, rid, step=produced)
        finally:
            generator.close()
        return Finished(rid, reason, len(pending.prompt), produced)

    def _finish(self) -> None:
        """End every job still queued; none has touched MLX yet."""
        while True:
            try:
                job = self._inbox.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                rid = job.pending.rid
                self.emit([Finished(rid, "abort", len(job.pending.prompt), 0)])
                self._to_loop(self._resolve, job.done, None)


class SimpleEngine(EngineFrontend):
    """The serialized route: one request generates at a time, on the engine's owner thread.

    Threads: the owner thread runs each job's MLX work; the loop only admits,
    streams and closes. Handoffs: `Job` into the owner's inbox; tokens and the
    terminal event back through `_deliver`; `Job.done` resolved by the owner
    after its last MLX call for the job. Costs: a busy answer takes one loop
    turn (fail-fast) or at most `max_wait_ms` (wait mode); a cancel or
    disconnect stops decode within one token.
    """

    name = "simple"

    def __init__(self, config=None):
        super().__init__(config)
        # Serializes Metal command-buffer (MLX) work: one request's generation at a time, held
        # until its worker has finished. Not an admission gate: `Admission` decides busy before
        # anyone reaches this lock, so it is never waited on.
        self._generation_lock = asyncio.Lock()
        self._jobs: dict[str, Job] = {}

    def _loop_invariants(self) -> list[str]:
        """Adds: no more requests past admission than the one generation slot (one more would wait on the
        generation lock, with no bound, instead of a busy answer)."""
        broken = super()._loop_invariants()
        holders = self._admission.holders
        if holders > 1:
            broken.append(f"{holders} requests past admission, more than the one generation slot: all but one "
                          f"wait on the generation lock")
        return broken

    def status(self) -> dict[str, Any]:
        """Adds the generation jobs still tracked to what is held."""
        status = super().status()
        status["held"]["jobs"] = len(self._jobs)
        return status

    def _make_admission(self) -> Admission:
        c = self.config
        return Admission(1, c.admission, c.max_queue, c.max_wait_ms / 1000.0,
                         busy_code="text_generation_busy", retry_after=c.retry_after_s)

    def _make_owner(self, loop: asyncio.AbstractEventLoop) -> SerialOwner:
        return SerialOwner(self.name, self.config.model, loop, self._deliver, self.config.warmup)

    async def submit(self, pending: Pending) -> RequestStream:
        """Admit (or raise Busy at once), take the slot, hand the job to the owner thread."""
        self._check_submittable(pending)
        await self._admission.enter()
        reach(Point.ADMITTED, pending.rid)
        try:
            await self._generation_lock.acquire()
        except BaseException:
            self._admission.leave()
            raise
        reach(Point.SLOT_ACQUIRED, pending.rid)
        job = Job(pending, asyncio.get_running_loop().create_future())
        self._jobs[pending.rid] = job
        stream = self._open_stream(pending)
        self._owner.post(job)
        return stream

    def _owner_gone(self) -> None:
        """The owner died: no job of it will ever report done, and none can still be inside MLX."""
        self._owner.drain()
        for job in self._jobs.values():
            if not job.done.done():
                job.done.set_result(None)

    def _abort(self, rid: str) -> None:
        job = self._jobs.get(rid)
        if job is not None:
            job.stop.set()

    async def _close(self, stream: RequestStream) -> None:
        """Keep the slot until the owner reports the job done, through any number of cancellations."""
        job = self._jobs[stream.rid]
        self._phase[stream.rid] = "draining"
        try:
            await wait_through_cancellation(job.done)
        finally:
            self._release(stream)

    def _release(self, stream: RequestStream) -> None:
        rid = stream.rid
        if isinstance(stream.result, Failed) and stream.abort_acknowledged:
            log.warning("request %s failed while being cancelled: %s", rid, stream.result.message)
        del self._jobs[rid]
        self._forget(rid)
        self._generation_lock.release()
        self._admission.leave()
        reach(Point.SLOT_RELEASED, rid)  # after the place went to the next waiter: a fault here meets that grant
