'''`CATALOGUE`: the known regressions of MLX serving engines, as mutants of the reference engine.

Each entry reproduces a bug that shipped (or nearly shipped) in a real engine,
mapped onto this engine's code. The edits are exact source replacements on a
copy; see `mutant.py`. `killers` lists the checks known to catch the mutant,
`must_kill` the layers the test suite holds it to. This is the one catalogue:
the fuzzer's seed bugs are entries too, each naming its minimal scenario in
`fuzz/corpus.py` as `seed` (docs/mutants.md says which merged with a mutant
and why the others stayed apart).
'''

from __future__ import annotations

from mlx_invariants.mutants.mutant import Edit, Mutant

SERIAL = "engine/serial.py"
BATCHED = "engine/batched.py"
OWNER = "engine/owner.py"
FRONTEND = "engine/frontend.py"
DRAIN = "engine/drain.py"
APP = "engine/http/app.py"

T_SERIAL = "test:tests/engine/test_serial.py::"
T_BATCHED = "test:tests/engine/test_batched.py::"
T_THREADS = "test:tests/engine/test_threads.py::"
T_HTTP = "test:tests/engine/test_http.py::"

# The submit tail of SimpleEngine: where the job is handed to whoever runs it.
_SERIAL_HANDOFF = """
    stream = self._open_stream(pending)
    self._owner.post(job)
    return stream
"""


def _serial_handoff(replacement: str) -> Edit:
    return Edit(SERIAL, _SERIAL_HANDOFF, f"""
        stream = self._open_stream(pending)
        {replacement}
        return stream
    """)


CATALOGUE: tuple[Mutant, ...] = (
    Mutant(
        id="M01-slot-freed-on-cancel",
        title="slot released on cancellation while the worker still runs MLX",
        story="""A client disconnect cancels the request task. The engine waited for its worker with a
        plain await, so the first CancelledError left the `finally` that releases the generation
        lock while the worker thread was still inside MLX; the next request entered Metal beside
        it and the process aborted with "A command encoder is already encoding to this command
        buffer". Here `SimpleEngine._close` sets the job's stop flag and releases the slot at once
        instead of draining the worker with `wait_through_cancellation`.""",
        invariant="the serialized slot is held until the worker has made its last MLX call",
        killers=(T_SERIAL + "test_cancel_keeps_slot_until_worker_returns[1]", "fuzz:slot-freed-early"),
        must_kill=("tests", "fuzz"),
        seed="lock_freed_on_cancel",
        edits=(Edit(SERIAL, """
            try:
                await wait_through_cancellation(job.done)
            finally:
                self._release(stream)
        """, """
            try:
                job.stop.set()  # the worker stops at its next token
            finally:
                self._release(stream)
        """),),
    ),
    Mutant(
        id="M02-lock-reentered",
        title="a helper re-acquires the lock its caller holds (deadlock)",
        story="""A refactor moved the hand-off to the worker into a helper that takes the generation
        lock "to be safe". Its only caller already holds that lock, and asyncio.Lock is not
        reentrant: the first request waits on itself forever and every later one queues behind it.
        Here `SimpleEngine.submit` calls `_post_serialized`, which enters `async with
        self._generation_lock` after `submit` acquired it.""",
        invariant="no task acquires a lock it already holds",
        killers=("static:INV104", T_SERIAL + "test_generates_and_reports_usage", "fuzz:lock-reentered", "fuzz:stalled"),
        must_kill=("static", "tests", "fuzz"),
        seed="nested_lock_reacquire",
        edits=(
            _serial_handoff("await self._post_serialized(job)"),
            Edit(SERIAL, """
                def _abort(self, rid: str) -> None:
                    job = self._jobs.get(rid)
            """, '''
                async def _post_serialized(self, job: Job) -> None:
                    """Hand the job over under the generation lock, so nothing else touches MLX meanwhile."""
                    async with self._generation_lock:
                        self._owner.post(job)

                def _abort(self, rid: str) -> None:
                    job = self._jobs.get(rid)
            '''),
        ),
    ),
    Mutant(
        id="M03-worker-error-swallowed-on-cancel",
        title="worker error swallowed while draining after cancellation",
        story="""The drain after a cancellation awaited the worker inside `except Exception: pass`,
        reasoning that nobody listens to a cancelled request. A worker that died inside MLX during
        the drain left no log line and no error result: the request looked aborted, and the
        corrupted model state surfaced requests later with no trace of its cause. Here the owner
        reports a failing job whose stop flag is set as a plain abort and logs nothing.""",
        invariant="a worker error is reported (result and log) even when the request was cancelled",
        killers=(T_SERIAL + "test_worker_error_while_draining_after_cancel_is_logged",),
        must_kill=("tests",),
        edits=(Edit(SERIAL, """
            except Exception as exc:  # an MLX or model error: this request fails, the engine goes on
                log.error("request %s failed on the owner thread: %s", rid, exc, exc_info=True)
                self.emit([Failed(rid, f"generation failed: {type(exc).__name__}: {exc}")])
        """, """
            except Exception as exc:  # an MLX or model error: this request fails, the engine goes on
                if job.stop.is_set():  # the client is gone: nobody is left to tell
                    self.emit([Finished(rid, "abort", len(job.pending.prompt), 0)])
                else:
                    log.error("request %s failed on the owner thread: %s", rid, exc, exc_info=True)
                    self.emit([Failed(rid, f"generation failed: {type(exc).__name__}: {exc}")])
        """),),
    ),
    Mutant(
        id="M04-drain-catches-exception-only",
        title="`except Exception` around the drain: a second cancellation escapes",
        story="""The fix for M01 drained the worker after the first CancelledError, but wrapped the
        drain in `except Exception`. CancelledError is a BaseException, so a second cancellation
        during the drain (a server shutting down cancels handlers that a disconnect already
        cancelled) escaped the drain and released the lock early anyway. Here
        `wait_through_cancellation` survives one cancellation and not two.""",
        invariant="the slot outlives the worker through any number of cancellations",
        killers=("static:INV106",
                 T_SERIAL + "test_cancel_keeps_slot_until_worker_returns[3]"),
        must_kill=("static", "tests"),
        edits=(Edit(DRAIN, """
            cancelled = False
            while not done.done():
                try:
                    await asyncio.shield(done)
                except asyncio.CancelledError:
                    cancelled = True
            if cancelled:
                raise asyncio.CancelledError()
        """, """
            try:
                await asyncio.shield(done)
            except asyncio.CancelledError:
                try:
                    await asyncio.shield(done)  # drain the worker before letting go
                except Exception:
                    pass
                raise
        """),),
    ),
    Mutant(
        id="M05-generation-on-default-pool",
        title="generation dispatched to `asyncio.to_thread` instead of the owner thread",
        story="""To keep the event loop free, generation was sent to `asyncio.to_thread`. The
        default pool hands each call to whichever worker thread is free, but mlx-lm binds its
        generation stream per thread: arrays built on one thread and evaluated on another raise
        "There is no Stream(gpu, 1) in current thread" mid-request, and nothing keeps two pool
        threads out of MLX at once. Here `SimpleEngine.submit` runs the owner's job function on the
        default pool instead of posting it to the owner thread.""",
        invariant="every MLX call happens on the engine's one owner thread",
        killers=(T_THREADS + "test_every_mlx_call_is_on_the_owner_thread",
                 "fuzz:mlx-off-owner", "fuzz:mlx-concurrent", "fuzz:mlx-no-stream"),
        must_kill=("tests", "fuzz"),
        seed="worker_on_pool_thread",
        edits=(_serial_handoff("asyncio.ensure_future(asyncio.to_thread(self._owner._run, job))"),),
    ),
    Mutant(
        id="M06-generation-on-event-loop",
        title="generation run synchronously on the event loop",
        story="""The answer to the cross-thread stream error of M05 was to drop the thread and call
        the generator directly in the request handler. MLX ran on one thread again, but that thread
        was the event loop: health checks, other clients and the disconnect watcher all stalled for
        the whole generation, and a cancellation was only observed after the last token. Here
        `SimpleEngine.submit` runs the job inline instead of posting it.""",
        invariant="the event loop never runs MLX; it stays responsive while a request decodes",
        killers=(T_SERIAL + "test_event_loop_stays_responsive_while_decoding",
                 T_THREADS + "test_every_mlx_call_is_on_the_owner_thread", "fuzz:loop-lag"),
        must_kill=("tests",),
        edits=(_serial_handoff("self._owner._run(job)  # one thread touches MLX: this one"),),
    ),
    Mutant(
        id="M07-stop-flag-ignored",
        title="the per-token stop flag is never checked",
        story="""Cancellation set a stop flag that the generation loop was meant to check between
        tokens, but a rewrite of the loop dropped the check. A client that disconnected at the
        first token kept the only generation slot busy until `max_tokens`, and every other client
        got 503 for the duration. Here `SerialOwner._generate` no longer looks at `job.stop`.""",
        invariant="an acknowledged abort stops decode within one token",
        killers=(T_SERIAL + "test_cancel_stops_decode_within_one_token", "fuzz:abort-ignored"),
        must_kill=("tests",),
        edits=(Edit(SERIAL, """
            if job.stop.is_set():
                reason = "abort"
                break
            reach(Point.BEFORE_DECODE, rid, step=produced)
        """, """
            reach(Point.BEFORE_DECODE, rid, step=produced)
        """),),
    ),
    Mutant(
        id="M08-batch-generator-built-on-loop",
        title="`BatchGenerator` constructed on the event-loop thread, stepped on the owner thread",
        story="""The server built its BatchGenerator at startup on the asyncio main thread and
        handed it to the generation thread, which called insert/next on it. mlx-lm releases that
        bound the generation stream at construction failed mid-run with "There is no Stream(gpu,
        1) in current thread". Here `BatchedEngine.start` builds the generator on the loop once
        the owner has loaded the model, and the owner only steps it.""",
        invariant="the BatchGenerator is built, warmed, stepped and closed on the owner thread",
        equivalent="""With mlx-lm 0.32 the generation stream is thread-local and construction
        evaluates nothing, so the engine's output is the same; the sentinel still sees the
        constructor run off the owner thread, and the static checker sees it built in async code.""",
        killers=("static:INV108",
                 T_THREADS + "test_every_mlx_call_is_on_the_owner_thread[BatchedEngine]", "fuzz:mlx-off-owner"),
        must_kill=("static", "tests"),
        routes=("batched",),
        edits=(
            Edit(BATCHED, """
                    self._generator = self._build()
                    if self.warmup_enabled:
                        self._warmup()
            """, """
                    # the engine builds the generator once the model is loaded
            """),
            Edit(BATCHED, """
                name = "batched"
            """, """
                name = "batched"

                async def start(self) -> None:
                    await super().start()
                    from mlx_lm.generate import BatchGenerator

                    owner = self._owner
                    eos = sorted(owner.loaded.tokenizer.eos_token_ids)
                    owner._generator = BatchGenerator(owner.loaded.model, stop_tokens=[[t] for t in eos],
                                                      completion_batch_size=owner.max_batch,
                                                      prefill_batch_size=owner.max_batch)
            """),
        ),
    ),
    Mutant(
        id="M09-drain-and-batch-admission",
        title="drain-and-batch admission: new requests wait for the batch to empty",
        story="""To dodge a corruption that was really M08's threading bug, the scheduler stopped
        inserting while any request was decoding. Each arrival waited for the whole running batch
        to finish: chat at concurrency 4 went from a 354 ms to a 7 s median time to first token,
        with a bimodal tail. Here `BatchOwner._take_inbox` leaves new requests pending while the
        batch is non-empty.""",
        invariant="a request arriving mid-decode is inserted before the next step",
        killers=(T_BATCHED + "test_late_arrival_gets_first_token_within_one_step",),
        must_kill=("tests",),
        routes=("batched",),
        edits=(Edit(BATCHED, """
            with self.lock:
                new, self._pending = self._pending, []
                aborts, self._aborts = self._aborts, set()
        """, """
            with self.lock:
                if self._active:  # let the running batch drain first: inserts mid-decode corrupt offsets
                    new = []
                else:
                    new, self._pending = self._pending, []
                aborts, self._aborts = self._aborts, set()
        """),),
    ),
    Mutant(
        id="M10-startup-failure-swallowed",
        title="construction failure swallowed and readiness signalled anyway",
        story="""The generation thread caught any exception while building and warming its
        generator, logged it, and set the ready event anyway so the server would "come up and
        report the problem". The health probe flipped to SERVING, the load balancer sent traffic,
        and every request failed on a generator that did not exist. Here `OwnerThread._become_ready`
        logs a failing `_start` (load, build, warmup) and resolves `ready` regardless.""",
        invariant="the engine is ready only once load, construction and warmup succeeded",
        killers=(T_SERIAL + "test_startup_failure_is_reported_and_never_healthy",
                 T_BATCHED + "test_batched_startup_failure_is_reported", "fuzz:startup-failed"),
        must_kill=("tests",),
        routes=("simple", "batched"),
        edits=(Edit(OWNER, """
            try:
                self._start()
            except BaseException as exc:  # readiness must report every startup failure, then the thread ends
                log.error("engine startup failed on %s: %s", self.name, exc, exc_info=True)
                self._to_loop(self._fail_ready, StartupError(f"engine startup failed: {type(exc).__name__}: {exc}"))
                return False
        """, """
            try:
                self._start()
            except Exception as exc:  # stay up: the first request will say what is wrong
                log.error("engine startup failed on %s: %s", self.name, exc, exc_info=True)
        """),),
    ),
    Mutant(
        id="M11-readiness-ignored",
        title="the readiness result is ignored at startup",
        story="""The server waited for the generation thread's ready event with a timeout, then
        started serving whether the thread had reported success, failure or nothing at all. A model
        that failed to load left a server answering /health with 200 and every request with 500.
        Here `EngineFrontend.start` waits for `ready` to settle but never looks at its result.""",
        invariant="startup raises when the owner reports a failure",
        killers=("static:INV109", T_SERIAL + "test_startup_failure_is_reported_and_never_healthy",
                 T_BATCHED + "test_batched_startup_failure_is_reported", "fuzz:startup-failed"),
        must_kill=("static", "tests"),
        routes=("simple", "batched"),
        edits=(Edit(FRONTEND, """
            self._loaded = await asyncio.wait_for(asyncio.shield(owner.ready), self.config.startup_timeout_s)
        """, """
            await asyncio.wait({owner.ready}, timeout=self.config.startup_timeout_s)  # started, one way or another
            self._loaded = owner.loaded
        """),),
    ),
    Mutant(
        id="M12-warmup-probe-leaks",
        title="warmup leaks its probe request when a step fails (cleanup not in `finally`)",
        story="""Warmup inserted a probe into the batch generator and removed it after the loop;
        when a warmup step raised, the probe stayed in the batch and decoded beside the first real
        requests. Here `BatchOwner._probe` removes its probes after the loop instead of in a
        `finally`.""",
        invariant="a warmup probe never outlives warmup",
        equivalent="""In this engine a failing warmup step fails startup and the generator is thrown
        away with the owner thread, so no request can meet the leaked probe; only the static rule
        for a probe inserted without removal in `finally` sees it.""",
        killers=("static:INV111",),
        must_kill=("static",),
        routes=("batched",),
        edits=(Edit(BATCHED, """
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
        """, """
            left = set(uids)
            for _ in range(16):
                _, generated = self._generator.next()
                for response in generated:
                    read_logprobs(response.logprobs, response.token)
                left -= {r.uid for r in generated if r.finish_reason}
                if not left:
                    break
            self._generator.remove(uids)
        """),),
    ),
    Mutant(
        id="M13-shutdown-leaves-waiters",
        title="shutdown never wakes pending waiters and streams",
        story="""Shutdown stopped the generation thread and returned. Requests waiting for
        admission and streams whose request the thread no longer held were never told: their
        handlers hung until the process was killed, and a graceful restart turned into a timeout
        for every queued client. Here `EngineFrontend.shutdown` neither closes admission nor ends
        the streams the owner can no longer reach.""",
        invariant="after shutdown every waiter and every stream has ended",
        killers=(T_SERIAL + "test_shutdown_mid_stream_ends_every_client", "fuzz:shutdown-left-waiter"),
        must_kill=("tests",),
        routes=("simple", "batched"),
        edits=(
            Edit(FRONTEND, """
                self._shutting_down = True
                self._admission.close()
            """, """
                self._shutting_down = True
            """),
            Edit(FRONTEND, """
                for stream in list(self._streams.values()):
                    stream.push_terminal_if_open("the engine shut down")
            """, """
                log.info("engine %s stopped", self.name)
            """),
        ),
    ),
    Mutant(
        id="M14-abort-lost-before-insertion",
        title="abort lost between leaving the pending set and entering the batch",
        story="""The scheduler took new requests and aborts in two separate critical sections and
        applied aborts to the running batch only, dropping ids it did not know. An abort that
        arrived with its request, or while the request was between the pending list and the batch,
        named nobody and vanished: the request decoded to `max_tokens` for a client that had left.
        Here `BatchOwner` takes the inbox in two sections and `_apply_aborts` ignores new
        requests.""",
        invariant="an abort recorded before insertion keeps the request out of the batch",
        killers=(T_BATCHED + "test_abort_posted_with_its_request_never_enters_the_batch", "fuzz:abort-ignored"),
        must_kill=("tests",),
        routes=("batched",),
        edits=(
            Edit(BATCHED, """
                with self.lock:
                    new, self._pending = self._pending, []
                    aborts, self._aborts = self._aborts, set()
            """, """
                with self.lock:
                    aborts, self._aborts = self._aborts, set()
                with self.lock:
                    new, self._pending = self._pending, []
            """),
            Edit(BATCHED, """
                for pending in [*self._waiting, *new]:
                    if pending.rid in aborts:
                        self._end(pending, Finished(pending.rid, "abort", len(pending.prompt), 0), events)
                    else:
                        waiting.append(pending)
            """, """
                waiting.extend([*self._waiting, *new])  # aborts are for requests in the batch
            """),
        ),
    ),
    Mutant(
        id="M15-busy-waits-on-lock",
        title="a busy serialized route waits behind the lock with a 120 s `wait_for`",
        story="""A text-only route bypassed the scheduler and serialized on the generation lock,
        acquired under `asyncio.wait_for(..., timeout=120)`. Under agent traffic requests piled up
        behind the lock for minutes instead of getting a fast, retryable 503
        (`text_generation_busy`). Here `SimpleEngine.submit` skips `Admission` and waits on the
        lock.""",
        invariant="busy is decided at once by admission; nothing waits on the MLX lock",
        killers=("static:INV101",
                 T_SERIAL + "test_busy_is_refused_at_once_with_machine_readable_code", "fuzz:busy-slow"),
        must_kill=("static", "tests"),
        edits=(
            Edit(SERIAL, """
                await self._admission.enter()
                reach(Point.ADMITTED, pending.rid)
                try:
                    await self._generation_lock.acquire()
                except BaseException:
                    self._admission.leave()
                    raise
            """, """
                reach(Point.ADMITTED, pending.rid)
                await asyncio.wait_for(self._generation_lock.acquire(), timeout=120)  # queue behind the running request
            """),
            Edit(SERIAL, """
                self._admission.leave()
                reach(Point.SLOT_RELEASED, rid)  # after the place went to the next waiter: a fault here meets that grant
            """, """
                reach(Point.SLOT_RELEASED, rid)
            """),
        ),
    ),
    Mutant(
        id="M16-lock-documented-as-admission",
        title="the lock's Metal-only documentation is reworded into \"admission\"",
        story="""The comment on the generation lock said it serializes Metal command buffers and is
        not an admission gate. A later edit described it as the place requests wait their turn,
        and the next change, trusting the comment, gave it a long timeout and made it the queue of
        M15. Here the comment on `SimpleEngine._generation_lock` calls it admission.""",
        invariant="the MLX lock is documented as serializing MLX work only, never as admission",
        equivalent="""A comment changes no behaviour; only the static checker reads it.""",
        killers=("static:INV103",),
        must_kill=("static",),
        edits=(Edit(SERIAL, """
            # Serializes Metal command-buffer (MLX) work: one request's generation at a time, held
            # until its worker has finished. Not an admission gate: `Admission` decides busy before
            # anyone reaches this lock, so it is never waited on.
            self._generation_lock = asyncio.Lock()
        """, """
            # Admission: requests wait here for their turn to generate.
            self._generation_lock = asyncio.Lock()
        """),),
    ),
    Mutant(
        id="M17-busy-stream-empty-200",
        title="busy with `stream=true` answered 200 with an empty stream",
        story="""For streaming requests the server committed to `200 text/event-stream` before
        asking the engine for a slot; a busy engine then produced a stream with no chunks and a
        bare `[DONE]`. Clients saw a successful, empty completion instead of a retryable 503 and
        never retried. Here the chat route answers a refused streaming request with an empty
        200 SSE body.""",
        invariant="busy is a 503 with a machine-readable code, decided before the first byte",
        killers=(T_HTTP + "test_busy_is_503_before_any_byte_in_under_100ms",),
        must_kill=("tests",),
        routes=(),
        edits=(Edit(APP, """
            except EngineError as exc:
                raise from_engine_error(exc) from None
        """, r"""
            except EngineError as exc:
                if not req.stream:
                    raise from_engine_error(exc) from None
                # a streaming client expects an event stream, even an empty one
                await Response(b"data: [DONE]\n\n", media_type="text/event-stream")(scope, receive, send)
                return
        """),),
    ),
    Mutant(
        id="M18-step-failure-retried-forever",
        title="a step failure is logged and retried instead of failing its requests",
        story="""The batch loop caught an exception from a decode step, logged it and went round
        again with the same batch. A persistent MLX error became a hot loop of identical log lines
        with clients waiting forever; a transient one let requests continue on state the failed
        step had left half-updated. Here `BatchOwner._iteration` logs the error and keeps the
        batch.""",
        invariant="a failing step fails the requests in it, and the generator is rebuilt",
        killers=(T_BATCHED + "test_failing_step_fails_its_requests_and_engine_recovers",),
        must_kill=("tests",),
        routes=("batched",),
        edits=(Edit(BATCHED, """
            except Exception as exc:  # an MLX error: fail the requests in the step, rebuild, go on
                self._fail_batch(exc, events)
        """, """
            except Exception as exc:  # transient: log it and run the step again
                log.error("batch step failed, retrying: %s", exc)
        """),),
    ),
    Mutant(
        id="M19-drain-lets-go-on-first-cancel",
        title="the drain gives up on the first cancellation that reaches it",
        story="""The drain after a cancellation was simplified to a single shielded await of the
        worker. The request's consumer absorbs the first cancellation, so a single disconnect was
        fine; a second one (a shutdown cancelling a handler that a disconnect had already
        cancelled) reached the drain, escaped it, and released the slot while the worker was still
        inside MLX. Here `wait_through_cancellation` awaits the worker once and lets any
        cancellation through.""",
        invariant="the slot outlives the worker through any number of cancellations",
        killers=(T_SERIAL + "test_cancel_keeps_slot_until_worker_returns[2]", "fuzz:slot-freed-early"),
        must_kill=("tests", "fuzz"),
        seed="double_cancel_releases_slot",
        apart="""The same broken drain as M04, one cancellation earlier. M04 survives the first
        cancellation that reaches the drain and gives up on the second (three in all, counting the
        consumer's), so the fuzzer's `cancel-twice` never frees its slot and M04 is caught by the
        static rule and the three-cancel test only; this drain gives up on the first, which the
        fuzzer finds and the static rule does not (no `except Exception` to flag). So neither edit
        set keeps both kills.""",
        edits=(Edit(DRAIN, """
            cancelled = False
            while not done.done():
                try:
                    await asyncio.shield(done)
                except asyncio.CancelledError:
                    cancelled = True
            if cancelled:
                raise asyncio.CancelledError()
        """, """
            await asyncio.shield(done)  # a cancel during the drain escapes
        """),),
    ),
    Mutant(
        id="M20-shutdown-drops-the-batch",
        title="shutdown stops the batch owner without ending the requests in the batch",
        story="""Shutdown skipped the grace period and the abort of open streams and stopped the
        owner thread at once; the owner dropped the requests in its batch instead of ending each
        one, and nothing after it ended the streams left open. Clients streaming from the batch
        waited for a terminal event that never came. Here `EngineFrontend.shutdown` neither waits
        for nor aborts open streams nor ends what is left, and `BatchOwner._finish` ends none of
        the requests in the batch.""",
        invariant="after shutdown every waiter and every stream has ended",
        killers=(T_BATCHED + "test_shutdown_ends_every_open_stream", "fuzz:shutdown-left-waiter", "fuzz:stalled"),
        must_kill=("tests", "fuzz"),
        routes=("batched",),
        seed="shutdown_leaves_waiters",
        apart="""M13 breaks only the front end (admission stays open, no stream is ended after the
        owner stops); the owner's `_finish` still ends every request it holds. M13's edits pass
        this entry's seed scenario on either route, and generation alone found nothing in the
        fuzz-kill test's 150 examples on either (the ci profile's longer run does find M13 on the
        simple route). This entry also breaks the owner's side, which generation finds. Moving M13
        onto these edits, or joining both sets, would drop M13's narrower regression, which its
        engine test proves is caught.""",
        edits=(
            Edit(FRONTEND, """
                await self._wait_streams_ended(grace_s)
                for stream in list(self._streams.values()):
                    stream.abort()
                await self._wait_streams_ended(max(grace_s, 1.0))
            """, ""),
            Edit(FRONTEND, """
                for stream in list(self._streams.values()):
                    stream.push_terminal_if_open("the engine shut down")
            """, ""),
            Edit(BATCHED, """
                for active in list(self._active.values()):
                    pending = active.pending
            """, """
                for active in []:
                    pending = active.pending
            """),
        ),
    ),
    Mutant(
        id="M21-abort-dropped-before-first-step",
        title="an abort reaching a request before its first decode step is dropped",
        story="""The scheduler applied aborts only to requests that were already decoding. An abort
        for a request still waiting for a seat, or inserted into the batch but not yet stepped,
        named nobody it acted on and vanished: the request decoded to `max_tokens` for a client
        that had left. Here `BatchOwner._apply_aborts` ends no waiting request and removes an
        inserted one only once it has produced more than one token.""",
        invariant="an acknowledged abort keeps the request out of the batch, or takes it out within one step",
        killers=(T_BATCHED + "test_abort_before_insertion_is_not_lost",
                 T_BATCHED + "test_abort_posted_with_its_request_never_enters_the_batch",
                 "fuzz:abort-ignored", "fuzz:abort-completed"),
        must_kill=("tests", "fuzz"),
        routes=("batched",),
        seed="abort_lost_between_sections",
        apart="""M14 loses an abort that arrives together with its request (the inbox is taken in
        two critical sections); this entry loses one that arrives after insertion, before the
        first step. The fuzzer finds M14 by generation too, but this entry's seed scenario (a
        cancel as the worker starts) does not catch M14. These edits fail M14's engine test as
        well, but moving M14 onto them would drop M14's own regression (the inbox taken in two
        critical sections), so the two stay apart.""",
        edits=(
            Edit(BATCHED, """
                if pending.rid in aborts:
            """, """
                if False:  # aborts only look at requests already decoding (wrong)
            """),
            Edit(BATCHED, """
                if uid is not None:
                    self._generator.remove([uid])
            """, """
                if uid is not None and self._active[uid].produced > 1:  # not decoding yet: dropped
                    self._generator.remove([uid])
            """),
        ),
    ),
    Mutant(
        id="M22-array-crosses-threads",
        title="an MLX array built on the event loop, evaluated on the owner thread",
        story="""To start long prompts sooner, the request handler built part of the prompt as an
        `mx.array` while admitting it, and the generation thread evaluated that array later. An
        array belongs to the stream of the thread that made it, so the owner failed with "There is
        no Stream(gpu, 1) in current thread", and only for prompts long enough to take the
        shortcut. Here `SimpleEngine.submit` builds a prefix array for prompts over 14 tokens and
        the owner evaluates it when the job starts.""",
        invariant="every MLX array is made and evaluated on the engine's one owner thread",
        killers=(T_BATCHED + "test_padded_prefill_decodes_what_the_serialized_route_decodes", "fuzz:mlx-no-stream"),
        must_kill=("tests", "fuzz"),
        seed="array_crosses_threads",
        edits=(
            Edit(SERIAL, """
                job = Job(pending, asyncio.get_running_loop().create_future())
            """, """
                job = Job(pending, asyncio.get_running_loop().create_future())
                if len(pending.prompt) > 14:  # pre-build the long prompt's prefix on the loop (wrong thread)
                    import mlx.core as mx
                    job.prefix = mx.array(pending.prompt[:8]) * 1
            """),
            Edit(SERIAL, """
                reach(Point.WORKER_STARTED, rid)
            """, """
                reach(Point.WORKER_STARTED, rid)
                if getattr(job, 'prefix', None) is not None:
                    import mlx.core as mx
                    mx.eval(job.prefix)
            """),
        ),
    ),
    Mutant(
        id="M23-aborted-row-left-in-generator",
        title="an aborted request dropped from the owner's books but left in the batch generator",
        story="""SGLang's and llama.cpp's test suites check that the KV pool is empty and every slot idle
        once a workload with aborts has ended, because an abort that forgets the scheduler's own
        structure leaks quietly: the request is gone from every table the server reports, while
        its KV row stays in the batch, is decoded with every later step until its token budget
        runs out, and stays put for as long as nothing else decodes. Here
        `BatchOwner._apply_aborts` ends the aborted request and clears its books but never calls
        `BatchGenerator.remove`.""",
        invariant="once every request has ended, the batch generator holds no row",
        killers=("test:tests/engine/test_status_held.py::test_an_aborted_request_leaves_no_row_in_the_generator",
                 "fuzz:slot-leaked"),
        must_kill=("tests", "fuzz"),
        routes=("batched",),
        seed="aborted_row_left_in_generator",
        edits=(Edit(BATCHED, """
            if uid is not None:
                self._generator.remove([uid])
                self._retire(uid, "abort", events)
        """, """
            if uid is not None:  # the books forget it; the generator keeps its row (wrong)
                self._retire(uid, "abort", events)
        """),),
    ),
    Mutant(
        id="M24-token-to-wrong-request",
        title="a decode step's tokens handed to the wrong requests when two or more decode together",
        story="""Users of a batching MLX server reported that about 94 % of responses came back corrupted
        at two or more concurrent requests while a lone request was byte-identical every time
        (mlx-vlm #1668): the step's sampled tokens were matched to requests through a second list
        of rows kept in another order than the one the ids came in. Every request still ends with
        its own length and finish reason, nothing leaks and nothing crashes; only the text is
        another request's. Here `BatchOwner._step` takes each response's id and finish reason from
        the generator's order but its token from the rows sorted newest first.""",
        invariant="under greedy decoding a request's tokens with others in flight are its tokens alone",
        killers=("fuzz:output-differs-alone",),
        must_kill=("fuzz",),
        routes=("batched",),
        seed="tokens_decoded_together",
        edits=(Edit(BATCHED, """
            _, generated = self._generator.next()
            for response in generated:
                active = self._active.get(response.uid)
                if active is None:
                    continue
                reason = self._take_token(active, response.token, response.logprobs, response.finish_reason, events)
        """, """
            _, generated = self._generator.next()
            rows = sorted(generated, key=lambda r: -r.uid)  # newest first: not the order the ids came in (wrong)
            for response, row in zip(generated, rows):
                active = self._active.get(response.uid)
                if active is None:
                    continue
                reason = self._take_token(active, row.token, response.logprobs, response.finish_reason, events)
        """),),
    ),
)


def select(selectors: list[str] | None) -> list[Mutant]:
    """The mutants named by `--only` (all of them when none is given), in catalogue order."""
    from mlx_invariants.mutants.errors import UnknownMutant

    if not selectors:
        return list(CATALOGUE)
    unknown = [s for s in selectors if not any(m.matches(s) for m in CATALOGUE)]
    if unknown:
        known = ", ".join(m.id for m in CATALOGUE)
        raise UnknownMutant(f"no mutant {', '.join(map(repr, unknown))}; the catalogue has: {known}")
    return [m for m in CATALOGUE if any(m.matches(s) for s in selectors)]
