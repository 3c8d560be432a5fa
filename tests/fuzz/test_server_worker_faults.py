"""Worker faults in a launched server: at a point of a server scenario the fuzzer arms "the server's next MLX
call dies / wedges" in the sentinel injected into it (fuzz/worker_switch.py), and the lost-worker oracles
judge what the server does then. The reference server (`invariants serve`) ends or refuses everything and
says so at /health; a server whose requests wait with no bound on a generation thread that died, and whose
/health says 200 whatever happens (mlx-lm's server before it caught its generation thread's errors), is
found."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings

from mlx_invariants.fuzz.adapters.http import HttpAdapter
from mlx_invariants.fuzz.driver import DriverSettings
from mlx_invariants.fuzz.errors import WorkerKilled
from mlx_invariants.fuzz.followup import FollowupOutcome
from mlx_invariants.fuzz.oracles import judge
from mlx_invariants.fuzz.scenario import SERVER_POINTS, WORKER_FAULTS, At, FaultSpec, RequestSpec, Scenario
from mlx_invariants.fuzz.session import run_scenario
from mlx_invariants.fuzz.strategies import scenarios
from mlx_invariants.fuzz.target import Target
from mlx_invariants.fuzz.trace import Trace
from mlx_invariants.fuzz.worker_switch import ArmedFault, WorkerSwitch, switch_port
from tests.conftest import WAIT_S

REFERENCE_SERVER = (f"{sys.executable} -m mlx_invariants serve --engine simple --stall-timeout 3 "
                    f"--host 127.0.0.1 --port {{port}}")
DEAD_WORKER_SERVER = f"{sys.executable} tests/fuzz/dead_worker_server.py {{port}}"
# A server over HTTP is watched in another process: "stalled" counts only after stall_s. A hang is certain in
# the planted server, so a short bound only finds it sooner; the reference server gets room to end a wedged
# owner's requests (its --stall-timeout, 3 s) on a loaded box, which costs nothing while it passes.
REMOTE = DriverSettings(quiet_ticks=50, stall_s=5.0, step_s=0.01)
ROOMY = DriverSettings(quiet_ticks=50, stall_s=15.0, step_s=0.01)
# r0 streams; at its second chunk its server's next MLX call dies or wedges; r1 arrives at its third.
LOSES_WORKER = {kind: Scenario((RequestSpec("r0", 3, 8, True), RequestSpec("r1", 2, 3, False, arrival=At("r0", "CHUNK_SENT", 2))),
                               (FaultSpec(kind, At("r0", "CHUNK_SENT", 1)),)) for kind in WORKER_FAULTS}


def _served(command: str, scenario: Scenario, model: str = "default_model",
            settings_: DriverSettings = REMOTE) -> Trace:
    """`scenario` on the server `command` (its /health declared), with the follow-up a fresh server returned."""
    target = Target.server(command, model=model, routes=("completions",), health="/health")
    engines = dataclasses.replace(target, fault_kinds=("cancel",) + WORKER_FAULTS).build()
    try:
        fresh = run_scenario(engines, Scenario(()), settings=settings_)
        return run_scenario(engines, scenario, expected_followup=FollowupOutcome.of_trace(fresh), settings=settings_)
    finally:
        engines.close()


def _ends(trace: Trace) -> dict[str, dict]:
    return {e.rid: e.info for e in trace.of("request", "end")}


def test_the_reference_server_ends_refuses_and_stops_saying_healthy_once_its_owner_died():
    trace = _served(REFERENCE_SERVER, LOSES_WORKER["worker-dies"], model="mlx-invariants-tiny", settings_=ROOMY)
    assert judge(trace) == [], judge(trace)
    fault = trace.first("fault", "worker-dies")
    assert fault is not None and fault.info["server_thread"].startswith("mlx-owner"), fault
    assert [c.info for c in trace.of("check", "health")] == [{"healthy": False, "fault": "worker-dies"}]
    ends = _ends(trace)
    assert ends["followup"]["outcome"] == "refused" and ends["followup"]["code"] == "engine_dead", ends


def test_the_reference_server_ends_what_its_wedged_owner_held_within_its_stall_bound():
    trace = _served(REFERENCE_SERVER, LOSES_WORKER["worker-wedges"], model="mlx-invariants-tiny", settings_=ROOMY)
    assert judge(trace) == [], judge(trace)
    assert trace.first("fault", "worker-wedges") is not None
    assert [c.info for c in trace.of("check", "health")] == [{"healthy": False, "fault": "worker-wedges"}]
    ends = _ends(trace)
    # The server runs ahead of its client's reads: on a loaded box r0 may be made whole before the wedge is
    # armed at its client's second chunk, and the wedge then holds r1. Whichever it held ends, as stalled.
    # Refused as busy meanwhile, or ended by the stall: each ends, and the stall is said to one of them at least.
    held = {rid: end for rid, end in ends.items() if rid != "followup" and end["outcome"] != "completed"}
    assert held and all(end["outcome"] in ("error", "refused") for end in held.values()), ends
    assert any("engine_stalled" in json.dumps(end) for end in held.values()), ends
    # Let go, the owner moves again; the server sees it at its next look, so a follow-up sent at once may still
    # be refused as stalled (a fresh clone's suite beside other work: refused engine_stalled, 25 ms after), or as
    # busy while the owner finishes the step the wedge held (a fresh clone's suite beside a corpus run: refused
    # text_generation_busy, 4 ms after): a fast refusal either way, never an error or a wait.
    followup = ends["followup"]
    assert followup["outcome"] == "completed" or (
        followup["outcome"] == "refused" and followup.get("code") in ("engine_stalled", "text_generation_busy")), ends


@pytest.mark.parametrize("kind, hang", [("worker-dies", "hang-after-worker-death"),
                                        ("worker-wedges", "hang-after-worker-wedge")])
def test_a_server_deaf_to_its_lost_generation_thread_is_found(kind: str, hang: str):
    trace = _served(DEAD_WORKER_SERVER, LOSES_WORKER[kind])
    kinds = [v.kind for v in judge(trace)]
    # what was armed, fired or disarmed, and how each request ended: a miss here must say which (a fresh clone's
    # suite beside two benchmarks at load 5 found nothing once, not seen again in 5 runs at load 3)
    assert kinds[:2] == [hang, "health-lies"], (kinds, [(f.name, f.info) for f in trace.of("fault")], _ends(trace))
    assert trace.first("fault", kind).info["server_thread"] == "generation"


def test_a_client_waits_for_its_arming_so_a_slow_switch_still_meets_the_request_it_lets_arrive(monkeypatch):
    """The switch answers an arming 0.5 s late (as a loaded box may): r0's client waits for it at the point it
    reached, so r1, let in by r0's next chunk, is served after the arming and meets the fault. Without the
    wait r1 was answered first and nothing fired (a fresh clone's CI, both kinds)."""
    arm = HttpAdapter.arm_worker_fault

    async def slowly(self: HttpAdapter, kind: str, at: str) -> ArmedFault:
        await asyncio.sleep(0.5)
        return await arm(self, kind, at)

    monkeypatch.setattr(HttpAdapter, "arm_worker_fault", slowly)
    trace = _served(DEAD_WORKER_SERVER, LOSES_WORKER["worker-dies"])
    kinds = [v.kind for v in judge(trace)]
    assert kinds[:2] == ["hang-after-worker-death", "health-lies"], (kinds, [(f.name, f.info) for f in trace.of("fault")])
    armed, arrived = trace.first("fault", "armed"), trace.first("fault", "arrive")
    assert armed.t < arrived.t, (armed, arrived)


def test_a_fault_armed_after_the_servers_last_mlx_call_is_disarmed_and_leaves_it_serving():
    """r0's tokens are all made before its client reads its last chunk: nothing fires, the follow-up is
    not the fault's victim and is answered as on a fresh server."""
    late = Scenario((RequestSpec("r0", 3, 4, True),), (FaultSpec("worker-dies", At("r0", "CHUNK_SENT", 3)),))
    trace = _served(DEAD_WORKER_SERVER, late)
    assert judge(trace) == [], judge(trace)
    assert [e.name for e in trace.of("fault")] == ["armed", "disarmed"]
    assert _ends(trace)["followup"]["outcome"] == "completed"


# -- the switch itself, in this process -----------------------------------------------------------------------
def _call(switch: WorkerSwitch, outcomes: list[str]) -> threading.Thread:
    """One MLX entry on a thread of its own, as the sentinel counts it: what became of it goes to `outcomes`."""
    def enter() -> None:
        try:
            switch.on_call("core.eval")
            outcomes.append("returned")
        except WorkerKilled:
            outcomes.append("killed")
    thread = threading.Thread(target=enter, name="generation")
    thread.start()
    return thread


def test_the_switch_fires_at_the_nth_call_from_arming_and_a_wedge_lasts_until_its_connection_closes(tmp_path: Path):
    switch = WorkerSwitch()
    switch.start(str(tmp_path / "switch.port"))
    port = switch_port(tmp_path / "switch.port")
    outcomes: list[str] = []

    async def main() -> None:
        dies = await ArmedFault.arm(port, "worker-dies", "r0@ADMITTED", nth=2)
        _call(switch, outcomes).join(WAIT_S)
        _call(switch, outcomes).join(WAIT_S)
        assert await dies.fired() == {"fired": "worker-dies", "thread": "generation", "call": "core.eval"}
        dies.release()
        wedges = await ArmedFault.arm(port, "worker-wedges", "r0@ADMITTED")
        wedged = _call(switch, outcomes)
        assert (await wedges.fired())["fired"] == "worker-wedges"
        wedged.join(0.2)
        assert wedged.is_alive()  # still inside its call
        wedges.release()
        await asyncio.get_running_loop().run_in_executor(None, wedged.join, WAIT_S)
        disarmed = await ArmedFault.arm(port, "worker-dies", "r0@ADMITTED")
        disarmed.disarm()
        assert await disarmed.fired() is None and not disarmed.hit
        _call(switch, outcomes).join(WAIT_S)
    asyncio.run(main())
    assert outcomes == ["returned", "killed", "returned", "returned"]


@settings(max_examples=60, deadline=None, database=None)
@given(scenarios(kinds=WORKER_FAULTS, points=Target.server("cmd {port}").points, armed=True))
def test_a_launched_server_draws_worker_faults_at_its_own_points(scenario: Scenario):
    assert scenario.faults and all(f.at.point in SERVER_POINTS for f in scenario.faults)
    Scenario.loads(scenario.dumps())  # and they validate


def test_only_a_launched_server_asked_for_them_arms_worker_faults():
    server = Target.server("cmd {port}")
    assert not server.arms_worker_faults and set(WORKER_FAULTS).isdisjoint(server.fault_kinds)
    assert dataclasses.replace(server, fault_kinds=("worker-wedges",)).arms_worker_faults
    with pytest.raises(ValueError, match="a raise fault needs one of"):
        Scenario((RequestSpec("r0"),), (FaultSpec("raise", At("r0", "SERVER_STEP", 1)),)).validate()
