"""`ORACLES`: pure functions of a `Trace` that yield `Violation`s.

None of them sleeps or touches an engine: the driver records facts (points,
MLX spans, request outcomes, after-the-fact checks) and these decide what is
wrong, so every oracle is tested on hand-built traces.
"""

from __future__ import annotations

from typing import Callable, Iterator

from mlx_invariants.fuzz.compute import compute_stops_for_gone_clients
from mlx_invariants.fuzz.ownership import OWNERSHIP_ORACLES
from mlx_invariants.fuzz.trace import Trace
from mlx_invariants.fuzz.violation import Violation

# After an acknowledged abort the owner may finish the step it is in and one more.
ABORT_SLACK_STEPS = 2
# A slot released within this many event-loop turns (each a 1 ms nap) of the last request's end is not a
# leak: a `finally` or a callback the last end scheduled is still on its way (the driver waits them out).
RELEASE_GRACE_TURNS = 50
# Oracles exact by construction: each judges a recorded fact no correct engine can produce (two threads
# inside MLX at once, MLX off its owner, a lock re-entered, a request ended twice, an abort acknowledged
# and then completed, an unexpected exception), so one sighting is a bug however rarely it replays. The
# others judge order across threads, timing, leftovers or outputs, and count only once they replay
# (`fuzz.findings`).
EXACT_KINDS = frozenset({"mlx-concurrent", "mlx-off-owner", "mlx-no-stream", "lock-reentered",
                         "request-ended-twice", "request-crashed", "unclear-error", "abort-completed",
                         "loop-error", "cancel-swallowed", "mlx-off-loader", "mlx-finalized-off-thread"})


def is_exact(kind: str) -> bool:
    """Whether a violation of `kind` is a bug however rarely it replays (see `EXACT_KINDS`)."""
    return kind in EXACT_KINDS


def mlx_never_concurrent(trace: Trace) -> Iterator[Violation]:
    """Two threads were inside MLX at the same time."""
    for first, second in trace.overlapping("mlx"):
        yield Violation("mlx-concurrent",
                        f"{second.who} entered {second.name} while {first.who} was inside {first.name}",
                        stacks=(first.stack, second.stack))


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


def no_stream_errors(trace: Trace) -> Iterator[Violation]:
    """MLX raised "There is no Stream(...) in current thread": an array or stream crossed threads."""
    for event in trace.of("mlx-error", "no-stream"):
        yield Violation("mlx-no-stream", f"{event.who} in {event.info.get('target')}: {event.info.get('message')}",
                        stacks=(event.stack,))


def slot_kept_until_worker_done(trace: Trace) -> Iterator[Violation]:
    """A request's slot was released while its worker was still inside MLX (before FINISHED)."""
    for rid in trace.rids():
        started = trace.first("point", "WORKER_STARTED", rid)
        released = trace.first("point", "SLOT_RELEASED", rid)
        if started is None or released is None:
            continue
        finished = trace.first("point", "FINISHED", rid)
        if finished is None or finished.seq > released.seq:
            later = f"FINISHED came at #{finished.seq}" if finished else "FINISHED never came"
            yield Violation("slot-freed-early",
                            f"{rid}: SLOT_RELEASED at #{released.seq} while its worker was still running ({later})",
                            stacks=(started.stack, released.stack), rid=rid)


def lock_never_reentered(trace: Trace) -> Iterator[Violation]:
    """A task acquired an asyncio lock it already held: without `OwnedLock` that deadlocks."""
    for event in trace.of("lock", "reentered"):
        yield Violation("lock-reentered", f"task {event.info.get('task')} re-acquired a lock it holds",
                        stacks=(tuple(event.info.get("holder_stack", ())), event.stack), rid=event.rid)


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
            if outcome == "crashed":
                yield Violation("request-crashed",
                                f"{rid} ended with an unexpected {end.info.get('error')}, not a clear engine error",
                                stacks=(end.stack,), rid=rid)
            elif outcome == "error" and not end.info.get("message"):
                yield Violation("unclear-error", f"{rid} failed without a message", rid=rid)


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
        steps = [p for p in trace.of("point", "BEFORE_DECODE", fault.rid) if p.seq > fault.seq]
        if len(steps) > ABORT_SLACK_STEPS:
            yield Violation("abort-ignored",
                            f"{fault.rid}: {fault.name} at #{fault.seq}, then {len(steps)} more decode steps",
                            stacks=(fault.stack, steps[-1].stack), rid=fault.rid)


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


def nothing_waits_after_shutdown(trace: Trace) -> Iterator[Violation]:
    """Once shutdown returned, every request has ended."""
    for check in trace.of("check", "waiters-after-shutdown"):
        rids = ", ".join(check.info["rids"])
        yield Violation("shutdown-left-waiter", f"after shutdown, still waiting: {rids}",
                        detail=check.info.get("stacks", ""))


def followup_matches_fresh(trace: Trace) -> Iterator[Violation]:
    """A greedy follow-up request returns what it returns on a fresh engine."""
    for check in trace.of("check", "followup"):
        if check.info.get("got") != check.info.get("expected"):
            yield Violation("followup-differs",
                            f"follow-up returned {check.info.get('got')}, a fresh engine {check.info.get('expected')}")


def stays_live(trace: Trace) -> Iterator[Violation]:
    """Nothing could run but requests were unfinished: a deadlock, reported with every stack."""
    basis = trace.meta.get("stall_basis")  # what the wait scaled with, as the runner measured it
    for check in trace.of("check", "stalled"):
        why = f" (no progress within {basis})" if basis else ""
        yield Violation("stalled", f"nothing can run but {', '.join(check.info['rids'])} are unfinished{why}",
                        detail=check.info.get("stacks", ""))


def busy_answers_fast(trace: Trace) -> Iterator[Violation]:
    """A refused request heard so within the admission bound."""
    bound = trace.meta.get("busy_bound_s", 1.0)
    for end in trace.of("request", "end"):
        if end.info.get("outcome") == "refused" and end.info.get("elapsed_s", 0.0) > bound:
            yield Violation("busy-slow", f"{end.rid} was refused ({end.info.get('code')}) after "
                                         f"{end.info['elapsed_s']:.2f}s (bound {bound}s)",
                            rid=end.rid)


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


def loop_stays_responsive(trace: Trace) -> Iterator[Violation]:
    """The event loop never stalled longer than a loose bound, and no callback died unnoticed."""
    bound = trace.meta.get("lag_bound_s", 2.0)
    for check in trace.of("check", "loop-lag"):
        if check.info.get("max_s", 0.0) > bound:
            yield Violation("loop-lag", f"event loop lagged {check.info['max_s']:.3f}s (bound {bound}s)")
    for event in trace.of("loop", "error"):
        yield Violation("loop-error", f"unhandled on the event loop: {event.info.get('message')}",
                        stacks=(event.stack,), detail=event.info.get("traceback", ""))


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
    stays_live,
    nothing_waits_after_shutdown,
    slot_kept_until_worker_done,
    acknowledged_abort_never_completes,
    every_request_ends_once,
    nothing_leaked,
    followup_matches_fresh,
    busy_answers_fast,
    cut_body_frees_server,
    loop_stays_responsive,
    compute_stops_for_gone_clients,  # MLX still busy after every client had gone (fuzz/compute.py)
)


def judge(trace: Trace) -> list[Violation]:
    """Every violation every oracle finds in `trace`, in oracle order."""
    return [v for oracle in ORACLES for v in oracle(trace)]

