"""Every oracle on a hand-built trace that makes it fire, and on the same trace made clean."""

from __future__ import annotations

import pytest

from mlx_invariants.fuzz.oracles import ORACLES, judge
from mlx_invariants.fuzz import oracles
from mlx_invariants.fuzz.trace import Event, Trace


def trace_of(*events: dict, meta: dict | None = None) -> Trace:
    """Events numbered in the order given; `end` may name a later position for spans."""
    trace = Trace()
    trace.meta.update(meta or {})
    for seq, fields in enumerate(events, 1):
        fields = {"thread": 1, "thread_name": "mlx-owner-x", **fields}
        trace.events.append(Event(seq=seq, **fields))
    return trace


def mlx(thread: int, end: int, **info) -> dict:
    return {"kind": "mlx", "name": "core.eval", "thread": thread, "thread_name": f"t{thread}", "end": end,
            "info": info, "stack": (f"file.py:{thread} in caller{thread}",)}


def point(name: str, rid: str = "r0", thread: int = 1, **info) -> dict:
    return {"kind": "point", "name": name, "rid": rid, "thread": thread, "info": info}


def request(name: str, rid: str = "r0", **info) -> dict:
    return {"kind": "request", "name": name, "rid": rid, "info": info}


def check(name: str, **info) -> dict:
    return {"kind": "check", "name": name, "info": info}


def kinds(oracle, trace: Trace) -> list[str]:
    return [v.kind for v in oracle(trace)]


def test_concurrent_mlx_entry_reports_both_stacks():
    overlapping = trace_of(mlx(1, end=3), mlx(2, end=4), {"kind": "point", "name": "x"}, {"kind": "point", "name": "y"})
    found = list(oracles.mlx_never_concurrent(overlapping))
    assert [v.kind for v in found] == ["mlx-concurrent"]
    assert found[0].stacks == (("file.py:1 in caller1",), ("file.py:2 in caller2",))
    one_after_other = trace_of(mlx(1, end=2), {"kind": "point", "name": "x"}, mlx(2, end=4), {"kind": "point", "name": "y"})
    assert kinds(oracles.mlx_never_concurrent, one_after_other) == []


def test_same_thread_reentry_is_not_concurrency():
    nested = trace_of(mlx(1, end=3), mlx(1, end=4), {"kind": "point", "name": "x"}, {"kind": "point", "name": "y"})
    assert kinds(oracles.mlx_never_concurrent, nested) == []


def test_off_owner_entry_is_reported_once_per_thread():
    off = trace_of(mlx(1, end=2), {"kind": "point", "name": "x"}, mlx(2, end=4, off_owner=True),
                   {"kind": "point", "name": "y"}, mlx(2, end=6, off_owner=True), {"kind": "point", "name": "z"})
    assert kinds(oracles.mlx_only_on_owner, off) == ["mlx-off-owner"]
    on = trace_of(mlx(1, end=2), {"kind": "point", "name": "x"})
    assert kinds(oracles.mlx_only_on_owner, on) == []


def test_no_stream_error_fires_only_when_recorded():
    error = {"kind": "mlx-error", "name": "no-stream", "info": {"target": "core.eval",
             "message": "There is no Stream(cpu, 1) in current thread."}}
    assert kinds(oracles.no_stream_errors, trace_of(error)) == ["mlx-no-stream"]
    assert kinds(oracles.no_stream_errors, trace_of(mlx(1, end=2), point("FINISHED"))) == []


def test_slot_released_before_worker_finished():
    early = trace_of(point("WORKER_STARTED"), point("SLOT_RELEASED", thread=2), point("FINISHED"))
    assert kinds(oracles.slot_kept_until_worker_done, early) == ["slot-freed-early"]
    never = trace_of(point("WORKER_STARTED"), point("SLOT_RELEASED", thread=2))
    assert kinds(oracles.slot_kept_until_worker_done, never) == ["slot-freed-early"]
    ordered = trace_of(point("WORKER_STARTED"), point("FINISHED"), point("SLOT_RELEASED", thread=2))
    assert kinds(oracles.slot_kept_until_worker_done, ordered) == []
    never_started = trace_of(point("SLOT_ACQUIRED"), point("SLOT_RELEASED"))
    assert kinds(oracles.slot_kept_until_worker_done, never_started) == []


def test_lock_reentry_carries_holder_and_second_stack():
    event = {"kind": "lock", "name": "reentered", "info": {"task": "t", "holder_stack": ["a.py:1 in hold"]},
             "stack": ("a.py:9 in again",)}
    found = list(oracles.lock_never_reentered(trace_of(event)))
    assert [v.kind for v in found] == ["lock-reentered"]
    assert found[0].stacks == (("a.py:1 in hold",), ("a.py:9 in again",))
    assert kinds(oracles.lock_never_reentered, trace_of(point("ADMITTED"))) == []


@pytest.mark.parametrize("events, expected", [
    ([request("submit")], ["request-unended"]),
    ([request("submit"), request("end", outcome="completed"), request("end", outcome="cancelled")],
     ["request-ended-twice"]),
    ([request("submit"), point("FINISHED"), point("FINISHED"), request("end", outcome="completed")],
     ["request-ended-twice"]),
    ([request("submit"), request("end", outcome="crashed", error="KeyError: 'r0'")], ["request-crashed"]),
    ([request("submit"), request("end", outcome="error", message="")], ["unclear-error"]),
    ([request("submit"), request("end", outcome="error", message="generation failed: boom")], []),
    ([request("submit"), request("end", outcome="cancelled")], []),
])
def test_every_request_ends_exactly_once(events, expected):
    assert kinds(oracles.every_request_ends_once, trace_of(*events)) == expected


def test_acknowledged_abort_must_not_complete_or_keep_decoding():
    abort = {"kind": "fault", "name": "abort", "rid": "r0", "info": {"acknowledged": True}}
    completed = trace_of(abort, request("end", outcome="completed", reason="length"))
    assert kinds(oracles.acknowledged_abort_never_completes, completed) == ["abort-completed"]
    ignored = trace_of(abort, *[point("BEFORE_DECODE", step=k) for k in range(1, 5)],
                       request("end", outcome="aborted"))
    assert kinds(oracles.acknowledged_abort_never_completes, ignored) == ["abort-ignored"]
    honoured = trace_of(abort, point("BEFORE_DECODE", step=1), request("end", outcome="aborted"))
    assert kinds(oracles.acknowledged_abort_never_completes, honoured) == []
    unacknowledged = trace_of({**abort, "info": {"acknowledged": False}}, request("end", outcome="completed"))
    assert kinds(oracles.acknowledged_abort_never_completes, unacknowledged) == []


def test_leaks_after_the_scenario():
    leaked = trace_of(check("status", active=1, queued=0), check("stray-tasks", tasks=["<Task pending>"]),
                      check("executor-busy", busy=1), check("threads-alive", names=["mlx-owner-x"]))
    assert kinds(oracles.nothing_leaked, leaked) == ["slot-leaked", "stray-task", "executor-busy", "thread-leaked"]
    assert kinds(oracles.nothing_leaked, trace_of(check("status", active=0, queued=0))) == []


def test_waiter_left_after_shutdown():
    assert kinds(oracles.nothing_waits_after_shutdown,
                 trace_of(check("waiters-after-shutdown", rids=["r1"]))) == ["shutdown-left-waiter"]
    assert kinds(oracles.nothing_waits_after_shutdown, trace_of(check("status", active=0))) == []


def test_followup_must_match_a_fresh_engine():
    assert kinds(oracles.followup_matches_fresh,
                 trace_of(check("followup", got=[1, 2], expected=[1, 3]))) == ["followup-differs"]
    assert kinds(oracles.followup_matches_fresh, trace_of(check("followup", got=[1, 2], expected=[1, 2]))) == []


def test_stall_is_reported_with_stacks():
    found = list(oracles.stays_live(trace_of(check("stalled", rids=["r0"], stacks="--- thread x"))))
    assert [v.kind for v in found] == ["stalled"] and "thread x" in found[0].detail
    assert kinds(oracles.stays_live, trace_of(request("submit"))) == []


def test_busy_answer_must_be_fast():
    slow = trace_of(request("end", outcome="refused", elapsed_s=3.0), meta={"busy_bound_s": 1.0})
    assert kinds(oracles.busy_answers_fast, slow) == ["busy-slow"]
    fast = trace_of(request("end", outcome="refused", elapsed_s=0.001), meta={"busy_bound_s": 1.0})
    assert kinds(oracles.busy_answers_fast, fast) == []


def test_loop_lag_and_unhandled_loop_errors():
    laggy = trace_of(check("loop-lag", max_s=2.0), {"kind": "loop", "name": "error", "info": {"message": "boom"}},
                     meta={"lag_bound_s": 0.5})
    assert kinds(oracles.loop_stays_responsive, laggy) == ["loop-lag", "loop-error"]
    assert kinds(oracles.loop_stays_responsive, trace_of(check("loop-lag", max_s=0.01))) == []


def test_startup_failure_is_a_violation():
    assert kinds(oracles.engine_starts, trace_of(check("startup-failed", error="boom"))) == ["startup-failed"]
    assert kinds(oracles.engine_starts, trace_of(check("status"))) == []


def test_a_clean_trace_passes_every_oracle():
    clean = trace_of(
        request("submit"), point("ADMITTED", thread=2), point("SLOT_ACQUIRED", thread=2), point("WORKER_STARTED"),
        mlx(1, end=6), point("PREFILL_DONE"), point("FINISHED"), point("SLOT_RELEASED", thread=2),
        request("end", outcome="completed", reason="length", message=""), check("status", active=0, queued=0),
        check("loop-lag", max_s=0.01), check("followup", got=[5], expected=[5]))
    assert judge(clean) == []
    assert len(ORACLES) == 20  # 15 + fuzz/ownership.py's four + fuzz/compute.py's one


def test_a_cancelled_request_must_stop_decoding_too():
    cancel = {"kind": "fault", "name": "cancel", "rid": "r0", "info": {"delivered": True}}
    ignored = trace_of(cancel, *[point("BEFORE_DECODE", step=k) for k in range(1, 5)],
                       request("end", outcome="cancelled"))
    assert kinds(oracles.acknowledged_abort_never_completes, ignored) == ["abort-ignored"]
    undelivered = trace_of({**cancel, "info": {"delivered": False}}, *[point("BEFORE_DECODE", step=k) for k in range(1, 5)])
    assert kinds(oracles.acknowledged_abort_never_completes, undelivered) == []
