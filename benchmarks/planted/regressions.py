'''`REGRESSIONS`: twenty concurrency regressions of the reference engine, planted by an outside helper.

Each is an edit a contributor could make while "improving" something, written as the mutant
machinery's exact source replacements (`Edit`) on a copy of `engine/`. They were written without
reading the fuzzer, the static rules or the catalogue's entries (README.md), so they measure how the
layers do on bugs nobody shaped for them. `killers` is empty: nobody has measured them yet.

Kept apart on purpose: they are not catalogue entries, and `invariants mutants` never lists or runs
them; benchmarks/planted/run.py runs the layers on them.

Each story says what the contributor meant to do, what breaks, and what a client sees; `invariant`
names the promise broken. `CLASSES` groups the ids by the kind of concurrency bug.
'''

from __future__ import annotations

from mlx_invariants.mutants import Edit, Mutant

SERIAL = "engine/serial.py"
BATCHED = "engine/batched.py"
OWNER = "engine/owner.py"
ADMISSION = "engine/admission.py"
APP = "engine/http/app.py"
PAYLOADS = "engine/http/payloads.py"

SIMPLE_ONLY = ("simple",)
BATCHED_ONLY = ("batched",)
BOTH = ("simple", "batched")

REGRESSIONS: tuple[Mutant, ...] = (
    Mutant(
        id="P01",
        title="serial: a cancelled request frees the generation slot without waiting for its job",
        story="""A contributor saw the next client wait behind a request its own client had cancelled, and
        reasoned that a stopped job ends within one token anyway, so `_close` skips the drain once the
        abort is acknowledged. The slot (lock and admission place) is free while the owner is still
        inside the cancelled job's prefill or decode step. A client sees its request admitted (no 503)
        and then wait behind a worker that no longer holds the slot; in wait mode, queued clients are
        let in at once and wait without their `max_wait_ms` bound.""",
        invariant="the serialized slot is held until the owner reports the job done, through any cancellation",
        killers=(),
        edits=(Edit(SERIAL, """
            job = self._jobs[stream.rid]
            self._phase[stream.rid] = "draining"
            try:
                await wait_through_cancellation(job.done)
            finally:
                self._release(stream)
            """, """
            job = self._jobs[stream.rid]
            self._phase[stream.rid] = "draining"
            try:
                if not stream.abort_acknowledged:  # a stopped job ends within one token: let the next client in now
                    await wait_through_cancellation(job.done)
            finally:
                self._release(stream)
            """),),
        routes=SIMPLE_ONLY,
    ),
    Mutant(
        id="P02",
        title="batched: the seat is held through one cancellation only",
        story="""A contributor replaced the drain helper with a plain `asyncio.shield` on the stream's end,
        believing a shield already keeps the request alive through a cancel. It does keep the request
        running, but the closer itself leaves at the first `CancelledError`: a client whose task is
        cancelled while closing (a timeout wrapper, a second Ctrl-C) frees its batch seat while its row
        is still in the batch. Admission then lets one request more in than `max_batch +
        max_batch_queue`, and `/v1/status` counts fewer active requests than the owner holds.""",
        invariant="a batch seat is released only after the owner sent the request's terminal event",
        killers=(),
        edits=(Edit(BATCHED, """
            try:
                await wait_through_cancellation(stream.ended_future)
                await wait_through_cancellation(self._owner_let_go(stream))
            """, """
            try:
                await asyncio.shield(stream.ended_future)  # shielded: a cancel cannot break the request itself
                await wait_through_cancellation(self._owner_let_go(stream))
            """),),
        routes=BATCHED_ONLY,
    ),
    Mutant(
        id="P03",
        title="batched: an abort that arrives with its request is dropped",
        story="""A contributor tidied `_apply_aborts` to filter only the requests already waiting for a seat,
        appending the newly posted ones afterwards, on the reasoning that a request posted this iteration
        cannot have been aborted yet. But the loop posts and aborts between two owner iterations: a
        client that disconnects while the owner is busy in a step has both its request and its abort
        taken together, the abort id is consumed against nothing, and the request then starts and decodes
        to `max_tokens`. The gone client's seat stays taken and its close waits for the whole generation.""",
        invariant="every abort taken from the inbox is applied to its request, wherever that request is",
        killers=(),
        edits=(Edit(BATCHED, """
            waiting = deque()
            for pending in [*self._waiting, *new]:
                if pending.rid in aborts:
                    self._end(pending, Finished(pending.rid, "abort", len(pending.prompt), 0), events)
                else:
                    waiting.append(pending)
            self._waiting = waiting
            """, """
            waiting = deque()
            for pending in self._waiting:
                if pending.rid in aborts:
                    self._end(pending, Finished(pending.rid, "abort", len(pending.prompt), 0), events)
                else:
                    waiting.append(pending)
            self._waiting = waiting + deque(new)  # just posted: nothing can have aborted them yet
            """),),
        routes=BATCHED_ONLY,
    ),
    Mutant(
        id="P04",
        title="admission: a waiter granted a place in the same turn it was cancelled keeps it forever",
        story="""A contributor simplified the cancel branch of `Admission.enter` to "a client that left gives
        its queue place up", dropping the case where `leave()` had already granted it the place in the
        same loop turn. The grant is never handed on: `holders` stays one too high for good. A client in
        wait mode that disconnects just as the slot frees leaves the serialized route answering 503
        `text_generation_busy` to everyone, for the life of the process.""",
        invariant="every admission place granted is given back exactly once, also by a cancelled waiter",
        killers=(),
        edits=(Edit(ADMISSION, """
            except asyncio.CancelledError:
                if grant.done() and not grant.cancelled() and grant.exception() is None:
                    self.leave()  # granted in the same turn we were cancelled: pass the place on
                elif grant in self._waiters:
                    self._waiters.remove(grant)
                raise
            """, """
            except asyncio.CancelledError:
                if grant in self._waiters:  # a client that left gives its place in the queue up
                    self._waiters.remove(grant)
                raise
            """),),
        routes=BOTH,
    ),
    Mutant(
        id="P05",
        title="batched: a cancel removes the request's row from the generator on the event loop",
        story="""A contributor wanted a cancelled request's KV memory back at once instead of after the decode
        step in flight, so `BatchedEngine._abort` removes the row from the `BatchGenerator` right there,
        on the event loop, before posting the abort. That filters the batch's caches (MLX arrays) on the
        loop thread while the owner may be inside `next()` on the same objects. Clients see other
        requests in the batch fail with a step error, or their streams continue from a corrupted batch,
        whenever someone cancels.""",
        invariant="only the owner thread touches the generator and its MLX arrays",
        killers=(),
        edits=(Edit(BATCHED, """
            def _abort(self, rid: str) -> None:
                self._owner.abort(rid)
            """, """
            def _abort(self, rid: str) -> None:
                owner = self._owner
                uid = owner._uid_of.get(rid)
                if uid is not None:  # give its KV memory back now, not after the decode step in flight
                    owner._generator.remove([uid])
                owner.abort(rid)
            """),),
        routes=BATCHED_ONLY,
    ),
    Mutant(
        id="P06",
        title="serial: a token's logprob crosses to the loop as an MLX array and is read there",
        story="""To keep a per-token `.item()` sync off the decode path, a contributor put the lazy scalar
        `response.logprobs[token]` into the `Token` and let the HTTP payload call `float()` on it when it
        renders the chunk. The array was made on the owner thread's stream and is now evaluated on the
        event loop thread. A client asking for `logprobs` gets a 500, or a stream cut off after its first
        chunk, with MLX's "There is no Stream(...) in current thread"; on a GPU the read may also race
        the owner's next step.""",
        invariant="only plain values cross from the owner thread to the loop; no MLX array is evaluated off it",
        killers=(),
        edits=(
            Edit(SERIAL, """
                logprob = logprob_of(response.logprobs, response.token) if params.logprobs else None
                """, """
                logprob = response.logprobs[response.token] if params.logprobs else None  # read off the decode path
                """),
            Edit(PAYLOADS, """
                return {"content": [{"token": t.text, "logprob": t.logprob, "bytes": list(t.text.encode()),
                """, """
                return {"content": [{"token": t.text, "logprob": float(t.logprob), "bytes": list(t.text.encode()),
                """),
            Edit(PAYLOADS, """
                return {"tokens": [t.text for t in tokens], "token_logprobs": [t.logprob for t in tokens],
                """, """
                return {"tokens": [t.text for t in tokens], "token_logprobs": [float(t.logprob) for t in tokens],
                """),
        ),
        routes=SIMPLE_ONLY,
    ),
    Mutant(
        id="P07",
        title="http: prompts are tokenized on the event loop",
        story="""Profiling short chat turns, a contributor found the `asyncio.to_thread` hop costing more than
        the tokenization itself and called `_tokenize` directly. A long prompt (a 4 MiB body, a big chat
        template) now runs the tokenizer on the event loop for seconds. Every other client's stream
        pauses mid-answer, `/health` stops answering, and disconnects go unnoticed for as long.""",
        invariant="no request's CPU-heavy work runs on the event loop",
        killers=(),
        edits=(Edit(APP, """
            prompt = await asyncio.to_thread(_tokenize, engine, req, vocab_size)
            """, """
            prompt = _tokenize(engine, req, vocab_size)  # a chat turn takes microseconds; the thread hop cost more
            """),),
        routes=BOTH,
    ),
    Mutant(
        id="P08",
        title="batched: the owner holds its inbox lock for the whole iteration",
        story="""Wanting `held()` to read one consistent snapshot and no post to land mid-admission, a
        contributor took `self.lock` around the whole owner iteration: inbox, aborts, prefills and the
        decode step. `post`, `abort` and `held` run on the event loop and now block it on a thread lock
        for as long as a prefill or a step takes; a fault hook that waits for the loop while the owner
        holds the lock deadlocks both. Clients see every stream stutter at each step, `/v1/status` and
        submissions stall, and under a long prefill the whole server freezes.""",
        invariant="the loop never waits on a lock the owner holds across MLX work",
        killers=(),
        edits=(Edit(BATCHED, """
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
            """, """
            def _iteration(self) -> None:
                self._wait_if_idle()
                # Held for the whole iteration: no post or abort lands between taking the inbox and the step,
                # and held() always reads one consistent snapshot.
                with self.lock:
                    new, self._pending = self._pending, []
                    aborts, self._aborts = self._aborts, set()
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
            """),),
        routes=BATCHED_ONLY,
    ),
    Mutant(
        id="P09",
        title="serial: one extra request is admitted to queue on the generation lock",
        story="""To spare back-to-back clients a 503 in the gap between two generations, a contributor gave
        the serialized route's admission two places for its one slot, so a second request waits on
        `_generation_lock` for its turn. That wait has no bound: the second client waits for the whole
        first generation (minutes for a long answer) instead of a 503 with `Retry-After` in one loop turn,
        and `wait` mode's `max_wait_ms` no longer bounds anything.""",
        invariant="busy is decided at once (or within max_wait_ms); nothing waits on the MLX lock",
        killers=(),
        edits=(Edit(SERIAL, """
            return Admission(1, c.admission, c.max_queue, c.max_wait_ms / 1000.0,
                             busy_code="text_generation_busy", retry_after=c.retry_after_s)
            """, """
            # One more than the slot: a client arriving while another finishes waits on the generation lock
            # for its turn instead of taking a 503 in the gap.
            return Admission(2, c.admission, c.max_queue, c.max_wait_ms / 1000.0,
                             busy_code="text_generation_busy", retry_after=c.retry_after_s)
            """),),
        routes=SIMPLE_ONLY,
    ),
    Mutant(
        id="P10",
        title="http: a busy engine is retried inside the server instead of answered 503",
        story="""Clients that ignore `Retry-After` showed up as errors on a dashboard, so a contributor made
        the route retry `engine.submit` after each `Busy`, sleeping the advertised `retry_after`. The
        request now waits with no bound in the server, invisible to admission. A client gets no fast
        503: under sustained load it hangs until a slot happens to be free when it retries, and the
        refusal counter counts every retry.""",
        invariant="a busy engine answers 503 with Retry-After before any byte, never an unbounded wait",
        killers=(),
        edits=(
            Edit(APP, """
                from mlx_invariants.engine.errors import EngineError, InvalidRequest
                """, """
                from mlx_invariants.engine.errors import Busy, EngineError, InvalidRequest
                """),
            Edit(APP, """
                async def _submit_unless_gone(engine: Engine, pending: Pending, receive: Receive) -> RequestStream | None:
                    \"""`engine.submit`, giving the admission place up if the client leaves while queued; None then.\"""
                    submitting = asyncio.ensure_future(engine.submit(pending))
                """, """
                async def _submit_when_free(engine: Engine, pending: Pending) -> RequestStream:
                    \"""`engine.submit`, retried while busy: a client that ignores Retry-After gets a slower answer, not a 503.\"""
                    while True:
                        try:
                            return await engine.submit(pending)
                        except Busy as busy:
                            await asyncio.sleep(busy.retry_after)


                async def _submit_unless_gone(engine: Engine, pending: Pending, receive: Receive) -> RequestStream | None:
                    \"""`engine.submit`, giving the admission place up if the client leaves while queued; None then.\"""
                    submitting = asyncio.ensure_future(_submit_when_free(engine, pending))
                """),
        ),
        routes=BOTH,
    ),
    Mutant(
        id="P11",
        title="batched: an aborted row is left in the generator",
        story="""A contributor dropped the `remove` from the abort path, believing the generator drops rows
        once they reach `max_tokens` and `_retire` is all the bookkeeping needed. The aborted row keeps
        decoding inside the `BatchGenerator`, invisible to the owner's books, and stays there at rest
        when the owner goes idle. Clients see later requests slowed by rows nobody reads (and, with
        `max_batch` such rows, new requests stuck after their first token), and `/v1/status` shows
        generator rows with no request running.""",
        invariant="an aborted request leaves no row in the generator; nothing is held at rest",
        killers=(),
        edits=(Edit(BATCHED, """
            for rid in aborts:
                uid = self._uid_of.get(rid)
                if uid is not None:
                    self._generator.remove([uid])
                    self._retire(uid, "abort", events)
            """, """
            for rid in aborts:
                uid = self._uid_of.get(rid)
                if uid is not None:  # its row runs out at max_tokens: the generator drops finished rows itself
                    self._retire(uid, "abort", events)
            """),),
        routes=BATCHED_ONLY,
    ),
    Mutant(
        id="P12",
        title="batched: a failed step rebuilds the generator but keeps the request-to-row map",
        story="""Folding the failed step's cleanup into one line, a contributor cleared `_active` and assumed
        `_uid_of` follows from it. After any failing step the map keeps ids of requests that already
        failed, pointing at row numbers the rebuilt generator hands out again from zero. `/v1/status`
        shows rows held at rest forever; a client that reuses its X-Request-Id and cancels aborts some
        other client's row (that client's stream ends "abort") or fails the whole batch.""",
        invariant="a generator rebuild resets every map of requests to its rows",
        killers=(),
        edits=(Edit(BATCHED, """
            self._active.clear()
            self._uid_of.clear()
            self._generator.close()
            self._generator = self._build()
            """, """
            self._active.clear()
            self._generator.close()
            self._generator = self._build()
            """),),
        routes=BATCHED_ONLY,
    ),
    Mutant(
        id="P13",
        title="batched: requests started together are inserted longest prompt first, but mapped in arrival order",
        story="""Hoping the merged cache would need less left padding, a contributor sorted the requests started
        in one iteration by prompt length before `BatchGenerator.insert`, and left the loop that pairs
        the returned row ids with the requests as it was, in arrival order. When two requests with
        different prompt lengths start in the same iteration (a burst, or arrivals during one decode
        step), each one's row is booked under the other: after its first token, a client receives the
        continuation of someone else's prompt, and each stream ends at the other's `max_tokens`.""",
        invariant="each token is delivered to the request whose row produced it",
        killers=(),
        edits=(Edit(BATCHED, """
            try:
                uids = self._generator.insert(
                    [[first.token] for _, first, _ in started],
                    max_tokens=[a.pending.params.max_tokens - a.produced for a, _, _ in started],
                    caches=[first.cache for _, first, _ in started],
                    all_tokens=[list(a.pending.prompt) for a, _, _ in started],
                    samplers=[sampler for _, _, sampler in started],
                )
            """, """
            longest_first = sorted(started, key=lambda s: -len(s[0].pending.prompt))  # the merged cache pads less
            try:
                uids = self._generator.insert(
                    [[first.token] for _, first, _ in longest_first],
                    max_tokens=[a.pending.params.max_tokens - a.produced for a, _, _ in longest_first],
                    caches=[first.cache for _, first, _ in longest_first],
                    all_tokens=[list(a.pending.prompt) for a, _, _ in longest_first],
                    samplers=[sampler for _, _, sampler in longest_first],
                )
            """),),
        routes=BATCHED_ONLY,
    ),
    Mutant(
        id="P14",
        title="batched: every request shares one streaming detokenizer",
        story="""`tokenizer.detokenizer` copies a detokenizer per call, which showed up in a profile, so a
        contributor made one at startup and gave it to every request. A streaming BPE detokenizer holds
        the bytes of an unfinished word until the next word starts: with two requests decoding together,
        one request's pending text is flushed into the other's token, and a request that ends on a stop
        string or abort leaves its tail for the next one. Clients see words of another conversation in
        their answer.""",
        invariant="each request's text is decoded from its own tokens only",
        killers=(),
        edits=(
            Edit(BATCHED, """
                super()._start()
                self._eos = frozenset(self.loaded.tokenizer.eos_token_ids)
                """, """
                super()._start()
                self._eos = frozenset(self.loaded.tokenizer.eos_token_ids)
                self._detokenizer = self.loaded.tokenizer.detokenizer  # made once: a copy per request showed in profiles
                """),
            Edit(BATCHED, """
                active = Active(pending, self.loaded.tokenizer.detokenizer, StopMatcher(pending.params.stop))
                """, """
                active = Active(pending, self._detokenizer, StopMatcher(pending.params.stop))
                """),
        ),
        routes=BATCHED_ONLY,
    ),
    Mutant(
        id="P15",
        title="owner: a heartbeat thread keeps the owner's progress fresh while it is wedged",
        story="""A 100k-token prefill made no progress for minutes and the engine declared itself stalled, so
        a contributor added a heartbeat thread that beats `progress_at` every 50 ms while the owner thread
        is alive. Progress now measures that a thread exists, not that it moves: an owner stuck inside an
        MLX call (a hung Metal command buffer) is never declared stalled. `/health` says ok and clients'
        requests hang forever instead of failing with `engine_stalled`.""",
        invariant="health and liveness follow the owner's real progress, not its existence",
        killers=(),
        edits=(
            Edit(OWNER, """
                def run(self) -> None:
                    try:
                        if self._become_ready():
                            self._serve()
                """, """
                def run(self) -> None:
                    # Long prefills were declared stalled: a heartbeat keeps progress_at fresh while this thread lives.
                    threading.Thread(target=self._heartbeat, name=f"{self.name}-heartbeat", daemon=True).start()
                    try:
                        if self._become_ready():
                            self._serve()
                """),
            Edit(OWNER, """
                def _become_ready(self) -> bool:
                """, """
                def _heartbeat(self) -> None:
                    while self.is_alive() and not self._stopping.wait(0.05):
                        self.beat()

                def _become_ready(self) -> bool:
                """),
        ),
        routes=BOTH,
    ),
    Mutant(
        id="P16",
        title="http: /health answers ok whenever the owner is not dead or stalled",
        story="""A contributor made `/health` read one property instead of two: `unavailable` already says
        whether the owner died or stalled. But `unavailable` is None by design while the engine is
        shutting down or stopped, which only `healthy` reports. During a drain (and after it) `/health`
        answers 200 while every generation request gets 503 `engine_shutting_down`; a load balancer keeps
        sending traffic to a server that refuses it.""",
        invariant="/health is 200 only while the engine is ready and admitting",
        killers=(),
        edits=(Edit(APP, """
            engine = request.app.state.engine
            if engine.healthy:
                return JSONResponse({"status": "ok"})
            down = engine.unavailable
            """, """
            engine = request.app.state.engine
            down = engine.unavailable
            if down is None:  # one property instead of two: `unavailable` already says dead or stalled
                return JSONResponse({"status": "ok"})
            """),),
        routes=BOTH,
    ),
    Mutant(
        id="P17",
        title="batched: the owner sleeps while requests still wait for a seat",
        story="""Simplifying the idle check to "nothing is decoding", a contributor let the owner sleep when
        `_active` is empty, forgetting requests that wait for a seat. When a burst larger than the batch
        arrives and the started requests all finish in the same step (short answers), the rest are left
        in `_waiting` while the owner sleeps for the next post (seen here: 7 two-token requests, batch of
        2). Those clients hang until some other request arrives, or until the stall watch fails them.""",
        invariant="the owner sleeps only when there is nothing to decode, nothing waiting and nothing posted",
        killers=(),
        edits=(Edit(BATCHED, """
            if self._active or self._waiting:
                return
            """, """
            if self._active:  # decoding: never sleep mid-batch
                return
            """),),
        routes=BATCHED_ONLY,
    ),
    Mutant(
        id="P18",
        title="serial: stop() no longer wakes an owner blocked on its inbox",
        story="""The stop marker showed in `held()` as a phantom inbox entry, and the base `stop()` already
        sets the stopping flag and wakes the owner, so a contributor dropped the `None` put into the
        inbox. But the serial owner sleeps in `inbox.get()`, not on the wake event: an idle owner never
        learns it should stop. Shutdown waits out its grace plus five seconds, the thread is abandoned
        still alive, and `start()` after it refuses to restart the engine.""",
        invariant="a stop wakes the owner wherever it sleeps; shutdown ends the thread",
        killers=(),
        edits=(Edit(SERIAL, """
            def stop(self) -> None:
                super().stop()
                self._inbox.put(None)
            """, """
            def stop(self) -> None:
                super().stop()  # sets the stopping flag and wakes the owner; no marker left for held() to count
            """),),
        routes=SIMPLE_ONLY,
    ),
    Mutant(
        id="P19",
        title="batched: a burst is started beyond the batch's seats",
        story="""Reading `len(self._active)` as "the seats taken", a contributor dropped the requests started
        earlier in the same iteration from the seat count. A burst arriving together is prefilled and
        inserted all at once, however large: the running streams stall for every prefill of the burst,
        and the generator holds more rows than `max_batch`, the extra ones stuck after their first
        token. `/v1/status` shows more requests running than the batch has seats.""",
        invariant="at most max_batch requests are started (prefilled, inserted) at any time",
        killers=(),
        edits=(Edit(BATCHED, """
            while self._waiting and len(self._active) + len(started) < self.max_batch:
            """, """
            while self._waiting and len(self._active) < self.max_batch:  # the seats held by rows already decoding
            """),),
        routes=BATCHED_ONLY,
    ),
    Mutant(
        id="P20",
        title="admission: the wait queue admits one waiter beyond its bound",
        story="""Reading `max_queue` as "this many may wait" and the check as refusing the last of them, a
        contributor changed `>=` to `>`. Every queue now takes one more than its bound, and fail-fast
        mode (a queue of 0) queues one request for `max_wait_ms` instead of refusing it at once. A burst
        on the serialized route gets a second client held for 250 ms instead of an immediate 503, and
        `/v1/status` shows one more queued than the capacity it reports.""",
        invariant="fail-fast refuses at once; a wait queue never holds more than max_queue",
        killers=(),
        edits=(Edit(ADMISSION, """
            if len(self._waiters) >= self.max_queue:
            """, """
            if len(self._waiters) > self.max_queue:  # max_queue may wait: refuse the one beyond them
            """),),
        routes=BOTH,
    ),
)

# The kinds of concurrency bug the set covers, two regressions each.
CLASSES: dict[str, tuple[str, ...]] = {
    "slot released before the worker is done": ("P01", "P02"),
    "cancellation lost between two critical sections": ("P03", "P04"),
    "MLX used off the owner thread": ("P05", "P06"),
    "blocking work on the event loop": ("P07", "P08"),
    "unbounded wait where a fast busy is expected": ("P09", "P10"),
    "state not reset on abort, failure or shutdown": ("P11", "P12"),
    "wrong output under concurrency": ("P13", "P14"),
    "lying health or readiness": ("P15", "P16"),
    "lost wake-up in the owner's idle wait": ("P17", "P18"),
    "burst overfilling a bound": ("P19", "P20"),
}
