"""Every oracle on a hand-built trace that makes it fire, and on the same trace made clean."""

from __future__ import annotations

import pytest

from mlx_invariants.fuzz.oracles import ORACLES, judge
from mlx_invariants.fuzz import lost_worker, oracles
from mlx_invariants.fuzz import differential, stopping, surface, transport
from mlx_invariants.fuzz.followup import FollowupOutcome
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


@pytest.mark.parametrize("fault", ["worker-wedges", "worker-dies"])
def test_a_slot_let_go_after_a_worker_fault_is_the_engine_ending_what_it_cannot_finish(fault):
    """A wedged worker reaches FINISHED only once the fuzzer lets it go; meanwhile the engine must end the
    request (seen on a 10-minute runner run: a stall declared at 3 s, the slot released, FINISHED 135 ms
    after the wedge was released)."""
    wedged = {"kind": "fault", "name": fault, "rid": "r0", "info": {"at": "r0@BEFORE_DECODE(1)"}}
    after = trace_of(point("WORKER_STARTED"), wedged, point("SLOT_RELEASED", thread=2), point("FINISHED"))
    assert kinds(oracles.slot_kept_until_worker_done, after) == []
    before = trace_of(point("WORKER_STARTED"), point("SLOT_RELEASED", thread=2), wedged, point("FINISHED"))
    assert kinds(oracles.slot_kept_until_worker_done, before) == ["slot-freed-early"]


def test_a_slot_let_go_during_a_shutdown_is_not_judged():
    """A shutdown closes admission, so no request can take the seat, and an engine gives up on a worker still in
    one long MLX call once its grace ends (a GPU run: a first prefill of a new shape outlasted 6 s); what is left
    running is `thread-leaked`'s. A shutdown fault that hit nobody changes nothing."""
    shutdown = {"kind": "fault", "name": "shutdown", "rid": "r0", "info": {"at": "r0@WORKER_STARTED"}}
    during = trace_of(point("WORKER_STARTED"), shutdown, point("SLOT_RELEASED", thread=2))
    assert kinds(oracles.slot_kept_until_worker_done, during) == []
    missed = dict(shutdown, info={"at": "r1@ADMITTED", "delivered": False, "client": "absent"})
    nobody = trace_of(point("WORKER_STARTED"), missed, point("SLOT_RELEASED", thread=2))
    assert kinds(oracles.slot_kept_until_worker_done, nobody) == ["slot-freed-early"]


def test_lock_reentry_carries_holder_and_second_stack():
    event = {"kind": "lock", "name": "reentered", "info": {"task": "t", "holder_stack": ["a.py:1 in hold"]},
             "stack": ("a.py:9 in again",)}
    found = list(oracles.lock_never_reentered(trace_of(event)))
    assert [v.kind for v in found] == ["lock-reentered"]
    assert found[0].stacks == (("a.py:1 in hold",), ("a.py:9 in again",))
    assert kinds(oracles.lock_never_reentered, trace_of(point("ADMITTED"))) == []


SHUTDOWN = {"kind": "fault", "name": "shutdown", "rid": "r1", "info": {}}


@pytest.mark.parametrize("events, expected", [
    ([request("submit")], ["request-unended"]),
    ([request("submit"), request("end", outcome="completed"), request("end", outcome="cancelled")],
     ["request-ended-twice"]),
    ([request("submit"), point("FINISHED"), point("FINISHED"), request("end", outcome="completed")],
     ["request-ended-twice"]),
    ([request("submit"), request("end", outcome="crashed", error="KeyError: 'r0'")], ["request-crashed"]),
    # a connection the stopping server closed before the engine took its request: no engine error
    ([SHUTDOWN, request("submit"), request("end", outcome="crashed", error="ReadError: ")], []),
    ([request("submit"), request("end", outcome="crashed", error="ReadError: ")], ["request-crashed"]),
    ([SHUTDOWN, request("submit"), point("ADMITTED"), request("end", outcome="crashed", error="ReadError: ")],
     ["request-crashed"]),  # admitted: the engine owed it an answer
    ([SHUTDOWN, request("submit"), request("end", outcome="crashed", error="KeyError: 'r0'")], ["request-crashed"]),
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


def completed(*tokens: int) -> dict:
    return FollowupOutcome("completed", tokens=tokens).to_json()


def test_followup_must_match_a_fresh_engine():
    assert kinds(oracles.followup_matches_fresh,
                 trace_of(check("followup", got=completed(1, 2), expected=completed(1, 3)))) == ["followup-differs"]
    assert kinds(oracles.followup_matches_fresh,
                 trace_of(check("followup", got=completed(1, 2), expected=completed(1, 2)))) == []


def alone(got: list, lone: list, leads: list, outcome: str = "completed", by: str = "token") -> dict:
    """A request's tokens in the scenario beside its tokens alone, with the lone run's leads."""
    return {"kind": "check", "name": "alone", "rid": "r0",
            "info": {"outcome": outcome, "got": got, "alone": lone, "leads": leads, "by": by}}


@pytest.mark.parametrize("check_, found", [
    (alone([5, 7, 9], [5, 8, 9], [3.0, 2.5, 4.0]), True),             # another token where alone it led by 2.5 nats
    (alone([5, 7, 9], [5, 8, 9], [3.0, 0.4, 4.0]), False),            # a near-tie: another batch shape may flip it
    (alone([5, 7, 9], [5, 8, 9], [3.0, None, 4.0]), False),           # no lead reported: not judged
    (alone([5, 8], [5, 8, 9], [3.0, 2.5, 4.0], "cancelled"), False),  # a stopped request returns a prefix
    (alone([5, 8], [5, 8, 9], [3.0, 2.5, 4.0]), True),                # a completed one all of it
    (alone([5, 8, 9, 2], [5, 8, 9], [3.0, 2.5, 4.0], "aborted"), True),  # past the lone answer's end
    (alone([5, 8, 9], [5, 8, 9], [0.1, 0.1, 0.1]), False),
    (alone(["a", "bc"], ["a", "bd"], [2.0, 1.5], by="text"), True),   # over HTTP: every chunk led clearly
    (alone(["a", "bc"], ["a", "bd"], [2.0, 0.5], by="text"), False),  # one near-tie: the text is not judged
    (alone(["ab"], ["a", "bd"], [2.0, 1.5], "cancelled", by="text"), False),  # chunks may split differently
])
def test_a_request_with_others_in_flight_returns_its_lone_answer_where_decided(check_, found):
    assert kinds(differential.outputs_match_alone, trace_of(check_)) == (["output-differs-alone"] if found else [])


def answered(asked: dict, text: str = "", logprobs: tuple = (), alternatives: tuple = (), rid: str = "r0",
             unit: str = "token") -> list[dict]:
    """One request that asked for `asked` and saw `text` in pieces with (or without) log-probabilities."""
    return [request("submit", rid, stream=True, **asked),
            request("end", rid, outcome="completed", text=text, logprobs=list(logprobs),
                    alternatives=list(alternatives or [0] * len(logprobs)), unit=unit)]


LOGPROBS = {"logprobs": True, "top_logprobs": 0, "route": "chat"}


@pytest.mark.parametrize("events, found", [
    (answered({"stop": ["e", "th"]}, "abc the"), ["stop-string-returned"]),
    (answered({"stop": ["e", "th"]}, "abc t"), []),
    (answered({}, "the end"), []),
    (answered({}, "text", logprobs=(False, False)), []),
    (answered({}, "text", logprobs=(False, True)), ["logprobs-not-as-asked"]),
    (answered(LOGPROBS, "text", logprobs=(True, True)), []),
    (answered(LOGPROBS, "text", logprobs=(True, False)), ["logprobs-not-as-asked"]),
    (answered({**LOGPROBS, "top_logprobs": 3}, "text", logprobs=(True, True), alternatives=(3, 3)), []),
    (answered({**LOGPROBS, "top_logprobs": 3}, "text", logprobs=(True, True), alternatives=(3, 2)),
     ["logprobs-not-as-asked"]),
    # over HTTP: a server that ignores stop strings is no finding; one that stopped at one and returned it is
    (answered({"stop": ["e"]}, "the end", unit="chunk"), []),
    ([request("submit", stop=["th"]), request("end", outcome="completed", reason="stop", text="a th", unit="chunk")],
     ["stop-string-returned"]),
    ([request("submit", stop=["th"]), request("end", outcome="completed", reason="stop", text="the", unit="chunk")],
     []),
    # over HTTP: a server that offers none is no finding; one that gave them to a request asked alike is
    (answered(LOGPROBS, "text", logprobs=(False, False), unit="chunk"), []),
    (answered(LOGPROBS, "text", logprobs=(False, True), unit="chunk")
     + answered(LOGPROBS, "text", logprobs=(True,), rid="r1", unit="chunk"), ["logprobs-not-as-asked"]),
    (answered(LOGPROBS, "text", logprobs=(False,), unit="chunk")
     + answered({**LOGPROBS, "route": "completions"}, "text", logprobs=(True,), rid="r1", unit="chunk"), []),
])
def test_a_request_sees_its_stop_strings_and_logprobs_honoured(events, found):
    trace = trace_of(*events)
    assert [v.kind for oracle in surface.SURFACE_ORACLES for v in oracle(trace)] == found


def test_a_hang_after_the_worker_died_is_reported_and_one_before_it_or_without_it_is_not():
    death = {"kind": "fault", "name": "worker-dies", "rid": "r0", "info": {"at": "r0@BEFORE_DECODE#1"}}
    stall = check("stalled", rids=["r0", "followup"], stacks="--- thread x")
    found = list(lost_worker.work_ends_after_worker_death(
        trace_of(request("submit"), death, request("submit", "followup"), stall)))
    assert [v.kind for v in found] == ["hang-after-worker-death"] and "thread x" in found[0].detail
    assert "followup submitted after it and taken" in found[0].message
    after_shutdown = check("waiters-after-shutdown", rids=["r1"])
    assert kinds(lost_worker.work_ends_after_worker_death, trace_of(death, after_shutdown)) == ["hang-after-worker-death"]
    assert kinds(lost_worker.work_ends_after_worker_death, trace_of(stall, death)) == []  # the stall came first
    assert kinds(lost_worker.work_ends_after_worker_death, trace_of(request("submit"), stall)) == []
    assert kinds(lost_worker.work_ends_after_worker_death,
                 trace_of(death, request("end", outcome="error", message="owner died"))) == []


def test_a_hang_after_the_worker_wedged_names_the_engines_stall_bound():
    wedge = {"kind": "fault", "name": "worker-wedges", "rid": "r0", "info": {"at": "r0@PREFILL_DONE"}}
    stall = check("stalled", rids=["r0"], stacks="--- thread owner")
    trace = trace_of(request("submit"), wedge, stall)
    trace.meta["stall_timeout_s"] = 3.0
    found = list(lost_worker.work_ends_after_worker_wedge(trace))
    assert [v.kind for v in found] == ["hang-after-worker-wedge"] and "its stall bound: 3 s" in found[0].message
    assert kinds(lost_worker.work_ends_after_worker_wedge, trace_of(wedge, request("end", outcome="error"))) == []
    assert kinds(lost_worker.work_ends_after_worker_death, trace) == []  # a wedge is not a death


def test_health_that_still_says_healthy_after_the_worker_was_lost_is_reported():
    for name in ("worker-dies", "worker-wedges"):
        lost = {"kind": "fault", "name": name, "rid": "r0", "info": {"at": "r0@BEFORE_DECODE#1"}}
        assert kinds(lost_worker.health_tells_lost_worker, trace_of(lost, check("health", healthy=True))) == ["health-lies"]
        assert kinds(lost_worker.health_tells_lost_worker, trace_of(lost, check("health", healthy=False))) == []
    assert kinds(lost_worker.health_tells_lost_worker, trace_of(check("health", healthy=True))) == []


def test_health_that_says_healthy_while_the_engine_drains_or_after_it_stopped_is_reported():
    for during in ("drain", "stopped"):
        lying = trace_of(check("stopping-health", during=during, healthy=True))
        assert kinds(stopping.health_says_stopping, lying) == ["health-while-stopping"]
        told = trace_of(check("stopping-health", during=during, healthy=False))
        assert kinds(stopping.health_says_stopping, told) == []
    assert kinds(stopping.health_says_stopping, trace_of(check("stopping-health", during="drain", healthy=None))) == []


def test_a_launched_server_still_serving_after_the_thread_hit_is_not_said_to_lie_about_its_health():
    """Armed in a server, the fault hits whichever thread makes the next MLX call: in a server with a thread
    per request that is no worker the server rests on, and a request sent afterwards is answered in full."""
    dies = {"kind": "fault", "name": "worker-dies", "rid": "r0", "info": {"at": "r0@ADMITTED", "server_thread": "h"}}
    healthy = check("health", healthy=True)
    served = (request("submit", "followup"), request("end", "followup", outcome="completed"))
    oracle = lost_worker.health_tells_lost_worker
    assert kinds(oracle, trace_of(request("submit"), dies, healthy, *served)) == []
    assert kinds(oracle, trace_of(request("submit"), dies, healthy, served[0],
                                  request("end", "followup", outcome="refused"))) == ["health-lies"]
    assert kinds(oracle, trace_of(request("submit", "followup"), dies, served[1], healthy)) == ["health-lies"]
    in_process = {**dies, "info": {"at": "r0@PREFILL_DONE"}}
    assert kinds(oracle, trace_of(in_process, healthy, *served)) == ["health-lies"]
    wedge = {**dies, "name": "worker-wedges"}
    assert kinds(oracle, trace_of(wedge, *served, healthy)) == []  # served while the thread hit was blocked
    assert kinds(oracle, trace_of(wedge, healthy, *served)) == ["health-lies"]  # only once it was let go


def test_stall_is_reported_with_stacks():
    found = list(oracles.stays_live(trace_of(check("stalled", rids=["r0"], stacks="--- thread x"))))
    assert [v.kind for v in found] == ["stalled"] and "thread x" in found[0].detail
    assert kinds(oracles.stays_live, trace_of(request("submit"))) == []


def test_busy_answer_must_be_fast():
    slow = trace_of(request("end", outcome="refused", elapsed_s=3.0), meta={"busy_bound_s": 1.0})
    assert kinds(oracles.busy_answers_fast, slow) == ["busy-slow"]
    fast = trace_of(request("end", outcome="refused", elapsed_s=0.001), meta={"busy_bound_s": 1.0})
    assert kinds(oracles.busy_answers_fast, fast) == []


def _lag(max_s: float, *, loop_in_mlx_s: float, in_process: bool = True) -> Trace:
    """A worst lag of `max_s` from t=1.0, during which the loop's thread (7) spent `loop_in_mlx_s` inside MLX."""
    span = {**mlx(7, end=3), "t": 1.0, "t_end": 1.0 + loop_in_mlx_s}
    return trace_of(span, check("loop-lag", max_s=max_s, window=[1.0, 1.0 + max_s], loop_thread=7,
                                in_process=in_process),
                    {"kind": "loop", "name": "error", "info": {"message": "boom"}}, meta={"lag_bound_s": 0.5})


def test_loop_lag_counts_when_the_loop_itself_was_inside_mlx_and_unhandled_errors_always():
    assert kinds(oracles.loop_stays_responsive, _lag(2.0, loop_in_mlx_s=1.8)) == ["loop-lag", "loop-error"]
    # A loaded machine that did not schedule the loop, or a server's lag seen from the client: not the engine.
    assert kinds(oracles.loop_stays_responsive, _lag(2.0, loop_in_mlx_s=0.1)) == ["loop-error"]
    assert kinds(oracles.loop_stays_responsive, _lag(2.0, loop_in_mlx_s=1.8, in_process=False)) == ["loop-error"]
    assert kinds(oracles.loop_stays_responsive, trace_of(check("loop-lag", max_s=0.01))) == []


def test_startup_failure_is_a_violation():
    assert kinds(oracles.engine_starts, trace_of(check("startup-failed", error="boom"))) == ["startup-failed"]
    assert kinds(oracles.engine_starts, trace_of(check("status"))) == []


def test_a_clean_trace_passes_every_oracle():
    clean = trace_of(
        request("submit"), point("ADMITTED", thread=2), point("SLOT_ACQUIRED", thread=2), point("WORKER_STARTED"),
        mlx(1, end=6), point("PREFILL_DONE"), point("FINISHED"), point("SLOT_RELEASED", thread=2),
        request("end", outcome="completed", reason="length", message=""), check("status", active=0, queued=0),
        check("loop-lag", max_s=0.01), check("followup", got=completed(5), expected=completed(5)))
    assert judge(clean) == []
    assert len(ORACLES) == 32  # 16 + ownership.py's six + compute.py's one + transport.py's one + lost_worker.py's three
    # + rest.py's one + differential.py's one + surface.py's two + stopping.py's one


BUSY = {"code": "text_generation_busy", "type": "server_busy", "message": "busy"}
INTERNAL = {"code": 500, "type": "InternalServerError", "message": "Internal server error"}


def refused(rid: str, status: int, carrier: str = "status", before: int = 0, **error) -> dict:
    """A failed request's end over HTTP, with how it was answered (`fuzz.transport.Answer`)."""
    answer = transport.Answer.read(status, carrier, error, before)
    return request("end", rid, outcome="error", message=answer.message, answer=answer.to_json())


def while_held(plain: dict, stream: dict, gone: bool = False) -> Trace:
    """r1 (plain) and r2 (streaming) sent while r0 is in flight (or, `gone`, just after its client went)."""
    r0_end = request("end", "r0", outcome="cancelled" if gone else "completed")
    return trace_of(request("submit", "r0", stream=True), *([r0_end] if gone else []),
                    request("submit", "r1", stream=False), request("submit", "r2", stream=True),
                    {**plain, "rid": "r1"}, {**stream, "rid": "r2"}, *([] if gone else [r0_end]))


@pytest.mark.parametrize("plain, stream, gone, found, headline", [
    # vllm-mlx 0.6.0 while busy: 503 to a plain request, 200 and a generic error frame to a stream
    (refused("r1", 503, **BUSY), refused("r2", 200, "frame", **INTERNAL), False, ["busy-differs-by-transport"],
     "busy: non-streaming r1 answered 503 text_generation_busy, streaming r2 answered 200 with only an error frame "
     "(InternalServerError: Internal server error)"),
    (refused("r1", 503, **BUSY), refused("r2", 200, "frame", **INTERNAL), True, ["busy-differs-by-transport"], ""),
    (refused("r1", 503, **BUSY), refused("r2", 200, "frame", **BUSY), False, ["refusal-differs-by-transport"], ""),
    # the other way round: the plain request hid it in a 200 body, the stream was refused with a status
    (refused("r1", 200, "body", message="busy"), refused("r2", 429, message="busy"), False,
     ["busy-differs-by-transport"], "busy: non-streaming r1 answered 200 with only an error in its JSON body (busy), "
                                    "streaming r2 answered 429"),
    (refused("r1", 400, code="invalid_prompt"), refused("r2", 200, "frame", code="invalid_prompt"), False,
     ["refusal-differs-by-transport"], "refused as invalid_prompt: non-streaming r1 answered 400 invalid_prompt, "
                                       "streaming r2 answered 200 with only an error frame (invalid_prompt)"),
    # consistent: error statuses on both (even different ones), or 200s on both
    (refused("r1", 503, **BUSY), refused("r2", 503, **BUSY), False, [], ""),
    (refused("r1", 503, **BUSY), refused("r2", 429, code="busy"), False, [], ""),
    (refused("r1", 200, "body", **INTERNAL), refused("r2", 200, "frame", **INTERNAL), False, [], ""),
    # the stream had begun before its error: its status went out with its first frame
    (refused("r1", 503, **BUSY), refused("r2", 200, "frame", before=1, **INTERNAL), False, [], ""),
    # an engine failure is no refusal: a 500, or a 503 naming something else than busy
    (refused("r1", 500, code="engine_error"), refused("r2", 200, "frame", code="engine_error"), False, [], ""),
    (refused("r1", 503, code="engine_dead"), refused("r2", 200, "frame", code="engine_dead"), False, [], ""),
    (refused("r1", 503, code="engine_dead"), refused("r2", 200, "frame", **INTERNAL), False, [], ""),
    # a hidden error with a name of its own is another situation
    (refused("r1", 503, **BUSY), refused("r2", 200, "frame", code="engine_error"), False, [], ""),
])
def test_a_refusal_answered_200_on_one_transport_and_an_error_status_on_the_other(plain, stream, gone, found,
                                                                                  headline):
    got = list(transport.refusals_agree_across_transports(while_held(plain, stream, gone)))
    assert [v.kind for v in got] == found, got
    assert not headline or got[0].message == headline, got[0].message


def test_an_unnamed_error_in_a_200_is_busy_only_while_another_request_held_the_server():
    plain, stream = refused("r1", 503, **BUSY), refused("r2", 200, "frame", **INTERNAL)
    one_after_another = trace_of(request("submit", "r1", stream=False), plain,
                                 request("submit", "r2", stream=True), stream)
    assert kinds(transport.refusals_agree_across_transports, one_after_another) == []
    completed_since = trace_of(request("submit", "r0", stream=True), request("end", "r0", outcome="cancelled"),
                               request("submit", "r3"), request("end", "r3", outcome="completed"),
                               request("submit", "r1", stream=False), {**plain, "rid": "r1"},
                               request("submit", "r2", stream=True), {**stream, "rid": "r2"})
    assert kinds(transport.refusals_agree_across_transports, completed_since) == []
    # The same code on both needs no concurrency: the server named the situation itself.
    named = trace_of(request("submit", "r1", stream=False), plain, request("submit", "r2", stream=True),
                     refused("r2", 200, "frame", **BUSY))
    assert kinds(transport.refusals_agree_across_transports, named) == ["refusal-differs-by-transport"]


def test_a_cancelled_request_must_stop_decoding_too():
    cancel = {"kind": "fault", "name": "cancel", "rid": "r0", "info": {"delivered": True}}
    ignored = trace_of(cancel, *[point("BEFORE_DECODE", step=k) for k in range(1, 5)],
                       request("end", outcome="cancelled"))
    assert kinds(oracles.acknowledged_abort_never_completes, ignored) == ["abort-ignored"]
    undelivered = trace_of({**cancel, "info": {"delivered": False}}, *[point("BEFORE_DECODE", step=k) for k in range(1, 5)])
    assert kinds(oracles.acknowledged_abort_never_completes, undelivered) == []


def test_over_http_the_steps_before_the_server_can_hear_of_the_close_are_not_counted():
    """A GPU run of the served route: 3 steps of 4.4 ms after the client went, before the server had read the
    closed socket. Steps past the notice time still count."""
    sent = point("BODY_PART", thread=1)
    cancel = {"kind": "fault", "name": "cancel", "rid": "r0", "t": 1.0, "info": {"delivered": True}}
    fast = [{**point("BEFORE_DECODE", step=k), "t": 1.0 + 0.0044 * k} for k in range(1, 4)]
    assert kinds(oracles.acknowledged_abort_never_completes, trace_of(sent, cancel, *fast)) == []
    assert kinds(oracles.acknowledged_abort_never_completes, trace_of(cancel, *fast)) == ["abort-ignored"]
    late = [{**point("BEFORE_DECODE", step=k), "t": 1.0 + oracles.HTTP_NOTICE_S + 0.01 * k} for k in range(1, 4)]
    assert kinds(oracles.acknowledged_abort_never_completes, trace_of(sent, cancel, *late)) == ["abort-ignored"]
