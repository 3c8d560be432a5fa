"""The "restart" fault: the engine is stopped and started again inside a scenario, and must then serve as
a fresh one does. What a stop leaves behind (a lock still held, a stale flag, a thread of the first run)
is found through it, and only through it."""

from __future__ import annotations

import asyncio
import queue
import threading
import time

import pytest

from mlx_invariants.fuzz.followup import FollowupOutcome
from mlx_invariants.fuzz.adapters.reference import ReferenceAdapter, reference_engine
from mlx_invariants.fuzz.errors import TargetError
from mlx_invariants.fuzz.oracles import judge
from mlx_invariants.fuzz.runner import run_fuzz
from mlx_invariants.fuzz.scenario import DEFAULT_KINDS, At, FaultSpec, RequestSpec, Scenario
from mlx_invariants.fuzz.session import run_scenario
from mlx_invariants.fuzz.settings import FuzzSettings
from mlx_invariants.fuzz.strategies import scenarios
from mlx_invariants.fuzz.target import Target
from mlx_invariants.fuzz.timeline import timeline_svg

from tests.conftest import BACKSTOP_S
from tests.fuzz import restart_engine

# r0 is stopped mid-decode; r1 arrives at a point of r0 that comes after the restart was delivered.
MID_DECODE = Scenario((RequestSpec("r0", 3, 4, True), RequestSpec("r1", 2, 3, False, arrival=At("r0", "FINISHED"))),
                      (FaultSpec("restart", At("r0", "BEFORE_DECODE", 1)),))


def _names(trace, *kinds):
    return [(e.kind, e.name, e.rid) for e in trace.events if e.kind in kinds]


def _followup(factory) -> FollowupOutcome:
    return FollowupOutcome.of_trace(run_scenario(factory, Scenario(())))


@pytest.mark.parametrize("route", ["simple", "batched"])
def test_a_reference_engine_serves_after_a_restart_as_a_fresh_one_does(route: str):
    factory = reference_engine(route)
    trace = run_scenario(factory, MID_DECODE, expected_followup=_followup(factory))
    assert judge(trace) == [], judge(trace)
    events = _names(trace, "request", "engine")
    stopped, restarted = events.index(("engine", "stopped", None)), events.index(("engine", "restarted", None))
    assert events.index(("request", "end", "r0")) < stopped < restarted < events.index(("request", "submit", "r1"))
    assert trace.first("fault", "arrive", "r1").info["after"] == "restart"
    assert trace.first("check", "followup").seq > restarted and trace.first("check", "status") is not None
    assert any(e.seq > restarted for e in trace.of("mlx")), "the second run's owner did the work"


@pytest.mark.parametrize("make, finds", [("make_held_lock", "stalled"), ("make_stale_flag", "followup-differs")])
def test_what_a_stop_leaves_behind_is_found_through_restart_and_no_other_fault(make: str, finds: str):
    factory = getattr(restart_engine, make)
    expected = _followup(factory)
    one = (RequestSpec("r0", 3, 4, True),)
    found = {kind: judge(run_scenario(factory, Scenario(one, (FaultSpec(kind, At("r0", "BEFORE_DECODE", 1)),)),
                                      expected_followup=expected))
             for kind in DEFAULT_KINDS}  # the opt-in kinds judge the worker's loss, another bar
    assert [v.kind for v in found.pop("restart")][:1] == [finds]
    # the whole violation on a failure, stacks included: a loaded CI box once found one no quiet run repeats
    assert all(violations == [] for violations in found.values()), {k: v for k, v in found.items() if v}


@pytest.mark.slow  # two searches with shrinking; the scenario test above finds the same lock in the default run
def test_the_fuzzer_finds_a_lock_a_stop_left_held_and_passes_the_fixed_engine():
    restart = scenarios(kinds=("restart",))
    broken = run_fuzz(Target.module_factory("tests.fuzz.restart_engine:make_held_lock"),
                      FuzzSettings(examples=20, budget_s=BACKSTOP_S, explicit=(), debug_run=False, replays=1,
                                   shrink_s=BACKSTOP_S), strategy=restart)  # shrunk to one fault, however slow
    assert broken.failure is not None and broken.failure.violations[0].kind == "stalled", broken.failure
    assert [f.kind for f in broken.failure.scenario.faults] == ["restart"]
    fixed = run_fuzz(Target.module_factory("tests.fuzz.restart_engine:make_fixed"),
                     FuzzSettings(examples=20, budget_s=BACKSTOP_S, explicit=(), debug_run=False, replays=1),
                     strategy=restart)
    assert fixed.ok, fixed.failure.headline


class _StopsOnSecondCall(ReferenceAdapter):
    """Its first shutdown returns with the engine still running: the first run's owner thread lives on."""

    calls = 0

    async def shutdown(self) -> None:
        self.calls += 1
        if self.calls > 1:
            await super().shutdown()


def test_a_thread_of_the_first_run_still_alive_when_shutdown_returned_is_a_leak():
    factory = lambda: _StopsOnSecondCall(reference_engine("simple")().factory)  # noqa: E731
    scenario = Scenario((RequestSpec("r0", 3, 2, True),), (FaultSpec("restart", At("r0", "SLOT_RELEASED")),))
    kinds = [v.kind for v in judge(run_scenario(factory, scenario))]
    assert "thread-leaked" in kinds and "startup-failed" in kinds, kinds  # and the engine refused to start twice


def test_the_restart_is_in_the_timeline():
    factory = reference_engine("simple")
    svg = timeline_svg(run_scenario(factory, MID_DECODE, expected_followup=_followup(factory)))
    run_lane = svg.split('data-kind="run"', 1)[1].split("</g>", 1)[0]
    request_lane = svg.split('data-name="request r0"', 1)[1].split("</g>", 1)[0]
    assert "engine stopped" in run_lane and "engine restarted" in run_lane, run_lane
    assert "fault restart r0" in request_lane


def test_a_server_is_never_restarted():
    assert "restart" not in Target.url("http://127.0.0.1:8000").fault_kinds
    with pytest.raises(TargetError, match="cannot be restarted"):
        Target.from_dict({"kind": "url", "name": "http://127.0.0.1:8000", "fault_kinds": ["cancel", "restart"]})


def test_an_engine_with_no_declared_owner_may_enter_mlx_from_its_new_thread_after_a_restart():
    from tests.fuzz.toy_adapter import make_drain  # owner None: the first thread into MLX is the loader

    scenario = Scenario((RequestSpec("r0", 3, 3, True), RequestSpec("r1", 3, 3, True, arrival=At("r0", "CHUNK_SENT", 1))),
                        (FaultSpec("restart", At("r0", "CHUNK_SENT", 1)),))
    trace = run_scenario(make_drain, scenario)
    assert trace.first("engine", "restarted") is not None
    assert judge(trace) == [], judge(trace)


class _LateLastPoints(ReferenceAdapter):
    """Its engine reports a request's last points (FINISHED, then SLOT_RELEASED) a while after the answer
    went out, in order, from a thread of its own, as a loaded box can make it: a fault placed there is
    delivered once the follow-up is on its way."""

    def set_point_hook(self, hook) -> None:
        def late(point, rid, info):
            if getattr(point, "name", "") in ("FINISHED", "SLOT_RELEASED") and not rid.startswith("followup"):
                self._late.put(lambda: hook(point, rid, info))
            else:
                hook(point, rid, info)
        super().set_point_hook(late if hook is not None else None)

    async def start(self) -> None:
        self._late: "queue.SimpleQueue" = queue.SimpleQueue()
        self._reporter = threading.Thread(target=self._report_late, name="late-points", daemon=True)
        self._reporter.start()
        await super().start()

    def _report_late(self) -> None:
        for report in iter(self._late.get, None):
            time.sleep(0.3)
            report()

    async def shutdown(self) -> None:
        await super().shutdown()
        self._late.put(None)
        while self._reporter.is_alive():  # it may wait for this loop to deliver the fault it reports
            await asyncio.sleep(0.02)


@pytest.mark.parametrize("kind", ["shutdown", "restart"])
def test_a_fault_delivered_after_its_client_ended_never_fails_the_follow_up(kind: str):
    factory = lambda: _LateLastPoints(reference_engine("simple")().factory)  # noqa: E731
    scenario = Scenario((RequestSpec("r0", 3, 2, True),), (FaultSpec(kind, At("r0", "FINISHED")),))
    trace = run_scenario(factory, scenario, expected_followup=_followup(factory))
    assert trace.first("fault", kind) is not None
    assert judge(trace) == [], judge(trace)
