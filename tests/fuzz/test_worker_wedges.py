"""The "worker-wedges" fault: the engine's owner thread blocks inside an MLX call and never returns. Within
the engine's own stall bound every request in flight must end, new ones be refused and health stop saying
healthy; an engine that only watches whether its thread is alive hangs them (`hang-after-worker-wedge`) and
keeps calling itself healthy (`health-lies`)."""

from __future__ import annotations

import pytest

from mlx_invariants.fuzz.adapters.reference import reference_engine
from mlx_invariants.fuzz.followup import FollowupOutcome
from mlx_invariants.fuzz.oracles import judge
from mlx_invariants.fuzz.scenario import OPT_IN_KINDS, At, FaultSpec, RequestSpec, Scenario
from mlx_invariants.fuzz.session import run_scenario
from mlx_invariants.fuzz.target import WEDGE_STALL_TIMEOUT_S, Target

from tests.fuzz import dead_owner_engine


# r0 streams and its worker wedges at a drawn worker-side point; r1 arrives while it is wedged.
def _wedges_at(point: str, index: int = 0) -> Scenario:
    return Scenario((RequestSpec("r0", 3, 6, True), RequestSpec("r1", 2, 3, False, arrival=At("r0", point, index))),
                    (FaultSpec("worker-wedges", At("r0", point, index)),))


AIMS = [("WORKER_STARTED", 0), ("BEFORE_DECODE", 2)]


@pytest.mark.parametrize("route", ["simple", "batched"])
@pytest.mark.parametrize("point, index", AIMS)
def test_a_reference_engine_ends_refuses_and_says_unhealthy_while_its_worker_is_wedged(route, point, index):
    factory = reference_engine(route, stall_timeout_s=WEDGE_STALL_TIMEOUT_S)
    followup = FollowupOutcome.of_trace(run_scenario(factory, Scenario(())))
    trace = run_scenario(factory, _wedges_at(point, index), expected_followup=followup)
    assert judge(trace) == [], judge(trace)
    assert trace.first("fault", "worker-wedges") is not None
    assert [c.info for c in trace.of("check", "health")] == [{"healthy": False, "fault": "worker-wedges"}]
    ends = {e.rid: e.info for e in trace.of("request", "end")}
    assert ends["r0"]["outcome"] == "error" and "no progress" in ends["r0"]["message"], ends
    assert ends["followup"]["outcome"] == "completed", ends  # the worker let go, the engine serves again
    assert not trace.of("check", "status")  # a lost worker's books are not read: it drains them in its own time


@pytest.mark.parametrize("point, index", AIMS)
def test_an_engine_that_only_watches_its_thread_is_alive_is_found(point, index):
    found = judge(run_scenario(dead_owner_engine.make_stall_deaf, _wedges_at(point, index)))
    kinds = [v.kind for v in found]
    assert kinds[:1] == ["hang-after-worker-wedge"] and "health-lies" in kinds, kinds
    # The stall report says what the engine was doing before the stacks: where the wedged request stopped.
    at = point + (f"#{index}" if index else "")
    report = found[0].detail.split("--- task")[0]
    assert report.startswith("--- what the engine was doing\nr0: ") and f"last at {at} on mlx-owner" in report, report


def test_wedging_is_drawn_only_when_asked_for_and_then_the_reference_engine_gets_a_short_stall_bound():
    assert "worker-wedges" in OPT_IN_KINDS
    assert "worker-wedges" not in Target.reference("batched").fault_kinds
    asked = Target(Target.reference("batched").kind, "batched", fault_kinds=("worker-wedges", "cancel"))
    adapter = asked.build()()
    assert adapter.stall_timeout_s is None  # built at start: the config is the factory's
    import asyncio

    async def built() -> float:
        await adapter.start()
        try:
            return adapter.stall_timeout_s
        finally:
            await adapter.shutdown()
    assert asyncio.run(built()) == WEDGE_STALL_TIMEOUT_S


@pytest.mark.parametrize("route", ["simple", "batched"])
def test_a_restart_at_the_wedge_lets_the_worker_go_and_judges_nothing_the_stuck_thread_caused(route):
    """Found on the H100 (runner profile, batched): a restart delivered where the worker wedged. A stuck thread
    outlives any shutdown, and what that leaves behind (the thread, the seats it held, a refused restart) is
    the fault's doing, so the restart lets the worker go; the engine's health is then the restarted one's."""
    at = At("r1", "BEFORE_DECODE", 3)
    scenario = Scenario((RequestSpec("r0", 5, 40, False), RequestSpec("r1", 6, 10, True, route="chat")),
                        (FaultSpec("restart", at), FaultSpec("worker-wedges", at)))
    trace = run_scenario(reference_engine(route, stall_timeout_s=WEDGE_STALL_TIMEOUT_S), scenario)
    assert judge(trace) == [], judge(trace)
    assert trace.of("check", "health") == []


@pytest.mark.parametrize("kind, route", [("cancel-in-call", "simple"), ("disconnect", "batched")])
def test_a_client_gone_while_its_worker_is_wedged_is_no_hang_and_health_waits_for_the_stall_bound(kind, route):
    """Found on the H100 (runner profile, simple): a cancel and a wedge at one point. The gone client's handler
    rightly drains the wedged worker, which is no hang; and the engine is asked about its health only once its
    own stall bound has passed since the wedge (it was asked at once, and was still healthy)."""
    at = At("r0", "PREFILL_DONE", 0)
    scenario = Scenario((RequestSpec("r0", 12, 3, False, route="chat"),),
                        (FaultSpec(kind, at), FaultSpec("worker-wedges", at)), "pool")
    trace = run_scenario(reference_engine(route, stall_timeout_s=WEDGE_STALL_TIMEOUT_S), scenario)
    assert judge(trace) == [], judge(trace)
    assert [c.info for c in trace.of("check", "health")] == [{"healthy": False, "fault": "worker-wedges"}]
    deaf = [v.kind for v in judge(run_scenario(dead_owner_engine.make_stall_deaf, scenario))]
    assert deaf == ["health-lies"], deaf
