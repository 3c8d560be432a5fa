"""`ORACLES`: pure functions of a `Trace` that yield `Violation`s.

None of them sleeps or touches an engine: the driver records facts (points,
MLX spans, request outcomes, after-the-fact checks) and these decide what is
wrong, so every oracle is tested on hand-built traces.

Each oracle declares the kinds it yields (`@yields(ViolationKind(...))`, see
`fuzz.violation`): a one-line doc, whether it is exact, and why. `KINDS`
gathers the declarations; `EXACT_KINDS`, `invariants explain KIND` and
docs/fuzz-reference.md's oracle table are derived from them.
"""

from __future__ import annotations

from typing import Callable, Iterator

from mlx_invariants.fuzz.compute import compute_stops_for_gone_clients
from mlx_invariants.fuzz.differential import DIFFERENTIAL_ORACLES
from mlx_invariants.fuzz.followup import FollowupOutcome
from mlx_invariants.fuzz.lost_worker import LOST_WORKER_ORACLES
from mlx_invariants.fuzz.ownership import OWNERSHIP_ORACLES
from mlx_invariants.fuzz.rest import REST_ORACLES
from mlx_invariants.fuzz.stopping import STOPPING_ORACLES
from mlx_invariants.fuzz.surface import SURFACE_ORACLES
from mlx_invariants.fuzz.scenario import WORKER_FAULTS, FaultKind
from mlx_invariants.fuzz.trace import Event, Trace
from mlx_invariants.fuzz.transport import TRANSPORT_ORACLES
from mlx_invariants.fuzz.violation import Violation, ViolationKind, declared_by, yields

# After an acknowledged abort the owner may finish the step it is in and one more.
ABORT_SLACK_STEPS = 2
HTTP_NOTICE_S = 0.25  # and, for a request sent over HTTP, no step counts until this long after its client went
# A slot released within this many event-loop turns (each a 1 ms nap) of the last request's end is not a
# leak: a `finally` or a callback the last end scheduled is still on its way (the driver waits them out).
RELEASE_GRACE_TURNS = 50


def is_exact(kind: str) -> bool:
    """Whether a violation of `kind` is a bug however rarely it replays (see `EXACT_KINDS`)."""
    return kind in EXACT_KINDS


@yields(ViolationKind(
    "mlx-concurrent", "Two threads were inside MLX at the same time.", exact=True,
    why="Two MLX spans on different threads overlapped in the trace's sequence numbers, which order events "
        "exactly across threads: the engine let a second thread into MLX while one was inside, which no "
        "correct engine does however the threads were scheduled.",
    known_problems="Sees only MLX entered through a wrapped Python entry point (see the sentinel's blind "
                   "spots); CPU MLX does not crash on it, so the sentinel is the only witness on Linux."))
def mlx_never_concurrent(trace: Trace) -> Iterator[Violation]:
    """Two threads were inside MLX at the same time."""
    for first, second in trace.overlapping("mlx"):
        yield Violation("mlx-concurrent",
                        f"{second.who} entered {second.name} while {first.who} was inside {first.name}",
                        stacks=(first.stack, second.stack))


@yields(ViolationKind(
    "mlx-off-owner", "MLX was entered from a thread that is not the declared owner.", exact=True,
    why="The sentinel records the thread of every MLX entry against the owner the adapter declared; an "
        "engine that keeps MLX on its owner never enters it anywhere else, whatever the timing.",
    known_problems="Needs an owner declared (a thread-name glob, or `sticky`); without one, `mlx-off-loader` "
                   "judges instead."))
def mlx_only_on_owner(trace: Trace) -> Iterator[Violation]:
    """MLX was entered from a thread that is not the declared owner (reported once per thread)."""
    owner = next((e for e in trace.of("mlx") if not e.info.get("off_owner")), None)
    seen: set[int] = set()
    for span in trace.of("mlx"):
        if span.info.get("off_owner") and span.thread not in seen:
            seen.add(span.thread)
            where = f"; the owner is {owner.who}" if owner else ""
            yield Violation("mlx-off-owner", f"{span.who} entered {span.name} off the MLX owner thread{where}",
                            stacks=((owner.stack if owner else ()), span.stack))


@yields(ViolationKind(
    "mlx-no-stream", 'MLX raised "There is no Stream(...) in current thread": an array or stream crossed threads.',
    exact=True,
    why="The error is the record: MLX raised it because an array or stream made on one thread was used on "
        "another, which a correct engine never does."))
def no_stream_errors(trace: Trace) -> Iterator[Violation]:
    """MLX raised "There is no Stream(...) in current thread": an array or stream crossed threads."""
    for event in trace.of("mlx-error", "no-stream"):
        made = (f"; that stream was made on {event.info['made_by']} ({event.info['made_at']}), and a stream "
                f"belongs to the thread that made it (MLX >= 0.31.2)") if event.info.get("made_by") else ""
        yield Violation("mlx-no-stream", f"{event.who} in {event.info.get('target')}: "
                                         f"{str(event.info.get('message')).rstrip('.')}{made}", stacks=(event.stack,))


@yields(ViolationKind(
    "slot-freed-early", "A request's slot was released while its worker was still inside MLX (before FINISHED).",
    exact=False,
    why="Orders SLOT_RELEASED on the loop against FINISHED on the worker: whether the worker got there first "
        "depends on how the two threads interleaved, so it counts once it replays.",
    known_problems="Needs WORKER_STARTED, FINISHED and SLOT_RELEASED marked; an engine that marks none of them "
                   "is judged by `lock-released-early` instead. A release after a worker fault killed or wedged "
                   "the worker is not judged: the engine must end its requests without that worker "
                   "(fuzz/lost_worker.py), and the worker reaches FINISHED late or never. Nor is one after a "
                   "shutdown fault: admission has closed, so no request can take the seat, and an engine may give "
                   "up on a worker still inside one long MLX call once its grace ends (seen on a shared GPU: a "
                   "first prefill of a new shape outlasted the reference engine's 11 s); what the shutdown leaves "
                   "running is judged by `thread-leaked` and `executor-busy`."))
def slot_kept_until_worker_done(trace: Trace) -> Iterator[Violation]:
    """A request's slot was released while its worker was still inside MLX (before FINISHED)."""
    ends = [e for kind in WORKER_FAULTS for e in trace.of("fault", kind)]
    ends += [e for e in trace.of("fault", FaultKind.SHUTDOWN.value) if e.info.get("delivered", True)]
    lost = min((e.seq for e in ends), default=None)
    for rid in trace.rids():
        started = trace.first("point", "WORKER_STARTED", rid)
        released = trace.first("point", "SLOT_RELEASED", rid)
        if started is None or released is None or (lost is not None and lost < released.seq):
            continue
        finished = trace.first("point", "FINISHED", rid)
        if finished is None or finished.seq > released.seq:
            later = f"FINISHED came at #{finished.seq}" if finished else "FINISHED never came"
            yield Violation("slot-freed-early",
                            f"{rid}: SLOT_RELEASED at #{released.seq} while its worker was still running ({later})",
                            stacks=(started.stack, released.stack), rid=rid)


@yields(ViolationKind(
    "lock-reentered", "A task acquired an asyncio lock it already held.", exact=True,
    why="The owner-aware lock records the acquiring task against the holder: a task that re-acquires its own "
        "lock deadlocks on a plain asyncio.Lock whatever the timing.",
    known_problems="Sees only locks built as `asyncio.Lock` while the watch is installed, not ones bound by "
                   "`from asyncio import Lock` before it."))
def lock_never_reentered(trace: Trace) -> Iterator[Violation]:
    """A task acquired an asyncio lock it already held: without `OwnedLock` that deadlocks."""
    for event in trace.of("lock", "reentered"):
        yield Violation("lock-reentered", f"task {event.info.get('task')} re-acquired a lock it holds",
                        stacks=(tuple(event.info.get("holder_stack", ())), event.stack), rid=event.rid)


# How an HTTP client's request ends when the server closes its connection: the exception's type, first in
# the recorded error ("ReadError: ...").
CONNECTION_CLOSED = ("ReadError", "WriteError", "RemoteProtocolError", "ConnectError")


def closed_by_stopping_server(trace: Trace, rid: str, end: Event) -> bool:
    """A request the engine never admitted, cut off with its connection once the scenario's shutdown began: a
    server that stops closes the connections it has not begun to serve (uvicorn's exit closes one whose
    request came as it closed, and no server can refuse a request its kernel already took), which a client
    meets as a closed connection, not as an engine error (a GPU run of the served batched route: two requests
    sent during the shutdown ended with ReadError)."""
    shutdown = trace.first("fault", FaultKind.SHUTDOWN.value)
    error = str(end.info.get("error") or "")
    return (shutdown is not None and shutdown.seq < end.seq and error.split(":", 1)[0] in CONNECTION_CLOSED
            and not trace.of("point", "ADMITTED", rid))


@yields(
    ViolationKind(
        "request-unended", "A submitted request never ended.", exact=False,
        why="The scenario gave up waiting (stalled, or the backstop) before the request ended: when it gives "
            "up depends on timing, and the stall itself is reported as `stalled`."),
    ViolationKind(
        "request-ended-twice", "A request ended more than once, or reached FINISHED more than once.", exact=True,
        why="Each client records one end, and FINISHED is marked in a `finally`: two of either for one request "
            "are recorded facts no correct engine produces."),
    ViolationKind(
        "request-crashed", "A request ended with an unexpected exception, not a clear engine error.", exact=True,
        why="An exception escaped the request that the engine (or its adapter) did not turn into an outcome: "
            "the exception is the record, and a correct engine maps every failure to a clear error. A "
            "connection closed on a request the engine never admitted, once the scenario's shutdown began, is "
            "the server stopping, not a crash (`closed_by_stopping_server`)."),
    ViolationKind(
        "unclear-error", "A request failed without a message.", exact=True,
        why="The recorded outcome is an error with an empty message; a correct engine says what went wrong."),
)
def every_request_ends_once(trace: Trace) -> Iterator[Violation]:
    """Each submitted request ends exactly once: completed, cancelled, aborted, refused or a clear error."""
    for submit in trace.of("request", "submit"):
        rid = submit.rid
        ends = trace.of("request", "end", rid)
        if not ends:
            yield Violation("request-unended", f"{rid} never ended", rid=rid)
        elif len(ends) > 1:
            yield Violation("request-ended-twice", f"{rid} ended {len(ends)} times", rid=rid)
        finished = trace.of("point", "FINISHED", rid)
        if len(finished) > 1:
            yield Violation("request-ended-twice", f"{rid} reached FINISHED {len(finished)} times",
                            stacks=(finished[0].stack, finished[1].stack), rid=rid)
        for end in ends:
            outcome = end.info.get("outcome")
            if outcome == "crashed" and not closed_by_stopping_server(trace, rid, end):
                yield Violation("request-crashed",
                                f"{rid} ended with an unexpected {end.info.get('error')}, not a clear engine error",
                                stacks=(end.stack,), rid=rid)
            elif outcome == "error" and not end.info.get("message"):
                yield Violation("unclear-error", f"{rid} failed without a message", rid=rid)


@yields(
    ViolationKind(
        "abort-completed", "An abort was acknowledged, and the request then completed.", exact=True,
        why="The engine said yes to the abort (`abort()` returned True) and later reported the request "
            "completed: both are recorded, and no correct engine does both, whatever the timing."),
    ViolationKind(
        "abort-ignored", "Decoding went on for more than two steps after a delivered cancel, disconnect or "
                         "acknowledged abort.", exact=False,
        why="Counts BEFORE_DECODE points after the stop: how many steps the worker takes before it sees the "
            "stop depends on thread timing.",
        known_problems="Needs BEFORE_DECODE marked; an engine that marks nothing is judged by "
                       "`compute-after-disconnect`. Over HTTP (a served route) the steps of the first 0.25 s after "
                       "the client went are not counted: the server hears of a closed socket only when it next "
                       "reads or writes, so an engine that decodes faster than that is not judged on them."),
)
def acknowledged_abort_never_completes(trace: Trace) -> Iterator[Violation]:
    """An acknowledged abort (or the abort a cancelled client's close sends) stops decoding within a
    step or two, and an acknowledged abort never ends as completed."""
    for fault in trace.of("fault"):
        if fault.name == "abort" and fault.info.get("acknowledged"):
            for end in trace.of("request", "end", fault.rid):
                if end.info.get("outcome") == "completed":
                    yield Violation("abort-completed",
                                    f"{fault.rid}: abort acknowledged at #{fault.seq}, request completed "
                                    f"({end.info.get('reason')})", rid=fault.rid)
        elif not (fault.name in ("cancel", "disconnect") and fault.info.get("delivered")):
            continue
        # Over a socket the stop reaches the engine only once the server has read the close and cancelled its
        # handler: the steps it decodes meanwhile are the transport's (a GPU run: 3 steps of 4.4 ms).
        heard = fault.t + (HTTP_NOTICE_S if trace.first("point", "BODY_PART", fault.rid) else 0.0)
        steps = [p for p in trace.of("point", "BEFORE_DECODE", fault.rid) if p.seq > fault.seq and p.t >= heard]
        if len(steps) > ABORT_SLACK_STEPS:
            yield Violation("abort-ignored",
                            f"{fault.rid}: {fault.name} at #{fault.seq}, then {len(steps)} more decode steps",
                            stacks=(fault.stack, steps[-1].stack), rid=fault.rid)


@yields(
    ViolationKind(
        "slot-leaked", "The engine's status still showed something held after every request ended.",
        exact=False,
        why="Leftovers: read after a grace of event-loop turns, so a release still on its way late on a loaded "
            "machine looks like a leak; it counts once it replays.",
        known_problems="Only what the adapter's `status()` reports is seen (`{}` reports nothing)."),
    ViolationKind(
        "stray-task", "Asyncio tasks the engine started were still pending after the scenario.", exact=False,
        why="Leftovers: a task on its way out when the check ran depends on how many loop turns it needed."),
    ViolationKind(
        "executor-busy", "Executor jobs were still running after shutdown returned.", exact=False,
        why="Leftovers: a job finishing just after shutdown returned depends on thread timing."),
    ViolationKind(
        "thread-leaked", "Threads the engine started were still alive after shutdown (a 2 s join allowed).",
        exact=False,
        why="Leftovers: a thread still exiting when the join gave up depends on timing and load. One MLX call "
            "cannot be cut short, so a thread still inside one is waited for until it returns (60 s at most) "
            "before the join begins."),
)
def nothing_leaked(trace: Trace) -> Iterator[Violation]:
    """After the scenario the engine holds no slot, queue entry, stray task or busy executor."""
    for check in trace.of("check", "status"):
        held = {k: v for k, v in check.info.items() if isinstance(v, int) and v}
        if held:
            yield Violation("slot-leaked", f"engine status after every request ended and {RELEASE_GRACE_TURNS} "
                                           f"event-loop turns of grace: {held}")
    for check in trace.of("check", "stray-tasks"):
        yield Violation("stray-task", f"{len(check.info['tasks'])} task(s) still pending after the scenario",
                        detail="\n".join(check.info["tasks"]))
    for check in trace.of("check", "executor-busy"):
        yield Violation("executor-busy", f"{check.info['busy']} executor job(s) still running after shutdown")
    for check in trace.of("check", "threads-alive"):
        yield Violation("thread-leaked", f"thread(s) still alive after shutdown: {', '.join(check.info['names'])}",
                        detail=check.info.get("stacks", ""))


@yields(ViolationKind(
    "shutdown-left-waiter", "A request was still waiting after shutdown returned.", exact=False,
    why="Judged once shutdown returned and the loop went idle: whether a waiter had been woken by then "
        "depends on the order the loop ran them and where the shutdown caught each request."))
def nothing_waits_after_shutdown(trace: Trace) -> Iterator[Violation]:
    """Once shutdown returned, every request has ended."""
    for check in trace.of("check", "waiters-after-shutdown"):
        rids = ", ".join(check.info["rids"])
        yield Violation("shutdown-left-waiter", f"after shutdown, still waiting: {rids}",
                        detail=check.info.get("stacks", ""))


@yields(ViolationKind(
    "followup-differs", "A greedy follow-up request returned something else than on a fresh engine.",
    exact=False,
    why="Outputs: compared with the baseline's follow-up; a race that corrupts state (or a refusal while "
        "something is still held) shows only when it lands, so it counts once it replays."))
def followup_matches_fresh(trace: Trace) -> Iterator[Violation]:
    """A greedy follow-up request returns what it returns on a fresh engine."""
    for check in trace.of("check", "followup"):
        got, expected = FollowupOutcome.from_json(check.info["got"]), FollowupOutcome.from_json(check.info["expected"])
        if not got.same_as(expected):
            yield Violation("followup-differs",
                            f"follow-up returned {got.describe()}, a fresh engine {expected.describe()}")


@yields(ViolationKind(
    "engine-invariant-broken", "An invariant the engine declares (its adapter's `broken_invariants`) did not "
                               "hold at a point it reached.", exact=False,
    why="State at a point: whether a schedule reaches it depends on which requests arrived together and shared "
        "a step, so it counts once it replays.",
    known_problems="Only as strong as what the engine declares, and judged only at its points, where it says its "
                   "books are consistent (the batched reference engine: on its owner thread)."))
def declared_invariants_hold(trace: Trace) -> Iterator[Violation]:
    """Every invariant the engine declares holds at each point it reaches."""
    for check in trace.of("check", "invariant"):
        yield Violation("engine-invariant-broken", f"at {check.info['at']}: {check.info['broken']}", rid=check.rid)


@yields(ViolationKind(
    "stalled", "Nothing could run but requests were unfinished: a deadlock, reported with every stack.",
    exact=False,
    why="Timing: judged by quiet ticks (every thread parked and none runnable, the loop idle) and a "
        "wall-clock bound scaled to the target's measured pace, which an MLX call still running extends up to "
        "60 s; a loaded machine can look quiet for too long.",
    known_problems="A server's threads cannot be seen, so over HTTP only \"no progress at all\" counts."))
def stays_live(trace: Trace) -> Iterator[Violation]:
    """Nothing could run but requests were unfinished: a deadlock, reported with every stack."""
    basis = trace.meta.get("stall_basis")  # what the wait scaled with, as the runner measured it
    for check in trace.of("check", "stalled"):
        if check.info.get("why") == "start":  # timed apart from the scenario (fuzz/driver.py: `_start_in_time`)
            yield Violation("stalled", f"the engine's start did not return within {check.info['bound_s']:g}s",
                            detail=check.info.get("stacks", ""))
            continue
        why = f" (no progress within {basis})" if basis else ""
        yield Violation("stalled", f"nothing can run but {', '.join(check.info['rids'])} are unfinished{why}",
                        detail=check.info.get("stacks", ""))


@yields(ViolationKind(
    "busy-slow", "A refused request heard so after more than the admission bound.", exact=False,
    why="Timing: the refusal's wall-clock delay against the adapter's `busy_bound_s`."))
def busy_answers_fast(trace: Trace) -> Iterator[Violation]:
    """A refused request heard so within the admission bound."""
    bound = trace.meta.get("busy_bound_s", 1.0)
    for end in trace.of("request", "end"):
        if end.info.get("outcome") == "refused" and end.info.get("elapsed_s", 0.0) > bound:
            yield Violation("busy-slow", f"{end.rid} was refused ({end.info.get('code')}) after "
                                         f"{end.info['elapsed_s']:.2f}s (bound {bound}s)",
                            rid=end.rid)


@yields(ViolationKind(
    "cut-body-blocks", "After a client went with half its request body sent (BODY_PART), the follow-up's answer "
                       "did not begin within the admission bound.", exact=False,
    why="Timing: the follow-up's wall-clock wait against the admission bound (5 s over HTTP)."))
def cut_body_frees_server(trace: Trace) -> Iterator[Violation]:
    """After a client went with half its request body sent (BODY_PART), the follow-up's answer began within
    the admission bound: a server holds no handler or slot waiting for a body that will never come."""
    cut = sorted({f.rid for f in trace.of("fault") if f.info.get("delivered")
                  and str(f.info.get("at", "")).endswith("@BODY_PART")})
    submit = trace.first("request", "submit", "followup")
    began = trace.first("point", "ADMITTED", "followup")
    if not cut or submit is None or began is None:
        return  # a follow-up that never began is stalled, refused or different: other oracles say so
    bound, waited = trace.meta.get("busy_bound_s", 1.0), began.t - submit.t
    if waited > bound:
        yield Violation("cut-body-blocks", f"the follow-up waited {waited:.2f}s for its answer to begin after "
                                           f"{', '.join(cut)} went with half a request body sent (bound {bound}s)",
                        rid=cut[0])


@yields(
    ViolationKind(
        "loop-lag", "The event loop stalled for longer than the lag bound (2 s), at least half of it inside MLX on "
                    "the loop's own thread.", exact=False,
        why="Timing: measured by the fuzzer's lag watcher in wall-clock time. A lag the loop did not spend in MLX "
            "(a loaded machine that did not schedule it) is not counted, nor any lag of a server's loop, which "
            "the fuzzer's client cannot see.",
        known_problems="A loop blocked outside MLX (a thread lock taken on the loop, a blocking read) is not "
                       "reported here; `stalled` and the static INV114 see those."),
    ViolationKind(
        "loop-error", "A callback or task died on the event loop with an exception nobody handled.", exact=True,
        why="The loop's exception handler was called: an exception was lost on the loop (an unretrieved "
            "future, a failing callback), which a correct engine never leaves, whatever the timing.",
        known_problems="\"Future exception was never retrieved\" is reported when the future is collected, "
                       "which may be in a later scenario on a reused engine."),
)
def loop_stays_responsive(trace: Trace) -> Iterator[Violation]:
    """The event loop never stalled longer than a loose bound, and no callback died unnoticed."""
    bound = trace.meta.get("lag_bound_s", 2.0)
    for check in trace.of("check", "loop-lag"):
        lag = check.info.get("max_s", 0.0)
        if lag <= bound or not check.info.get("in_process"):
            continue  # a server's event loop is not this one: its lag is the fuzzer's own
        start, end = check.info.get("window", (0.0, 0.0))
        inside = [(span, min(end, span.t_end) - max(start, span.t)) for span in trace.of("mlx")
                  if span.thread == check.info.get("loop_thread") and span.t_end is not None
                  and span.t < end and span.t_end > start]
        busy = sum(overlap for _, overlap in inside)
        if busy >= lag / 2:  # the loop was inside MLX, not waiting for a loaded machine to schedule it
            longest = max(inside, key=lambda pair: pair[1])[0]
            yield Violation("loop-lag", f"event loop lagged {lag:.3f}s (bound {bound}s), {busy:.3f}s of it inside "
                                        f"MLX on the loop's own thread ({longest.name})", stacks=(longest.stack,))
    for event in trace.of("loop", "error"):
        yield Violation("loop-error", f"unhandled on the event loop: {event.info.get('message')}",
                        stacks=(event.stack,), detail=event.info.get("traceback", ""))


@yields(ViolationKind(
    "startup-failed", "The engine under test did not start (its `start()` raised).", exact=True,
    why="The start's exception is recorded: a correct engine starts again after a shutdown, or says why "
        "through its own clear error. A run's first start failing is a setup error (exit 2), not a finding.",
    known_problems="A machine out of memory or a missing model also fails a start."))
def engine_starts(trace: Trace) -> Iterator[Violation]:
    """The engine under test started; nothing else means anything if it did not."""
    for check in trace.of("check", "startup-failed"):
        yield Violation("startup-failed", f"engine did not start: {check.info.get('error')}")


Oracle = Callable[[Trace], Iterator[Violation]]
# Root causes first: the first violation found is the report's headline and what shrinking keeps.
ORACLES: tuple[Oracle, ...] = (
    engine_starts,
    mlx_never_concurrent,
    mlx_only_on_owner,
    no_stream_errors,
    lock_never_reentered,
    *OWNERSHIP_ORACLES,  # drop-in observation: an engine that marks nothing (fuzz/ownership.py)
    *LOST_WORKER_ORACLES,  # a stall after the worker died or wedged, before plain `stalled` (fuzz/lost_worker.py)
    stays_live,
    nothing_waits_after_shutdown,
    *STOPPING_ORACLES,  # health while draining or stopped (fuzz/stopping.py)
    slot_kept_until_worker_done,
    acknowledged_abort_never_completes,
    every_request_ends_once,
    declared_invariants_hold,
    nothing_leaked,
    *REST_ORACLES,  # threads and MLX memory back at rest, no climb over scenarios (fuzz/rest.py)
    *TRANSPORT_ORACLES,  # a refusal answered 200 on one transport, an error status on the other (fuzz/transport.py)
    *SURFACE_ORACLES,  # stop strings and log-probabilities as the request asked (fuzz/surface.py)
    followup_matches_fresh,
    *DIFFERENTIAL_ORACLES,  # a request's output with others in flight against its output alone (fuzz/differential.py)
    busy_answers_fast,
    cut_body_frees_server,
    loop_stays_responsive,
    compute_stops_for_gone_clients,  # MLX still busy after every client had gone (fuzz/compute.py)
)


# Not an oracle's: the parent of a `--jobs` child reports it when the child died mid-scenario (fuzz/jobs.py).
PROCESS_CRASHED = ViolationKind(
    "process-crashed", "The fuzz process died (a signal, an exit) while running the scenario.", exact=False,
    why="Leftovers: the engine it died on may have run earlier scenarios, so the crash may come from their "
        "state; it counts once a replay crashes (`--fresh-engine` pins it to one scenario).",
    oracle="jobs (the parent of a --jobs child)")


def declared_kinds() -> list[ViolationKind]:
    """Every declaration, in oracle order (a kind declared twice appears twice: the vocabulary test says so)."""
    return [kind for oracle in ORACLES for kind in declared_by(oracle)] + [PROCESS_CRASHED]


# Every violation kind by name: what `invariants explain KIND` prints and docs/fuzz-reference.md's table lists.
KINDS: dict[str, ViolationKind] = {kind.name: kind for kind in declared_kinds()}
# Kinds exact by construction: each judges a recorded fact no correct engine can produce, so one sighting
# is a bug however rarely it replays. The others judge order across threads, timing, leftovers or outputs,
# and count only once they replay (`fuzz.findings`). Each declaration says which, and why.
EXACT_KINDS: frozenset[str] = frozenset(name for name, kind in KINDS.items() if kind.exact)


def oracle_of(kind: ViolationKind) -> Oracle | None:
    """The oracle function that declared `kind` (None for one no oracle yields, e.g. `process-crashed`)."""
    return next((oracle for oracle in ORACLES if kind in declared_by(oracle)), None)


def judge(trace: Trace) -> list[Violation]:
    """Every violation every oracle finds in `trace`, in oracle order."""
    return [v for oracle in ORACLES for v in oracle(trace)]

