"""The reference engine behind its own HTTP app, served inside the fuzzing process (`--engine http-simple`).

Requests go over a real 127.0.0.1 socket through the app while the engine's points, threads and MLX stay in
the fuzzer's sight. The plant here is ours, in a copy of the app: a health route that caches its last
healthy answer for 30 s (so a storm of probes never reaches the engine) keeps answering 200 through a
drain, which only a fuzzer that stops the engine behind its HTTP app can see.
"""

from __future__ import annotations

import pytest

from mlx_invariants.fuzz.oracles import judge
from mlx_invariants.fuzz.runner import run_fuzz
from mlx_invariants.fuzz.scenario import At, FaultSpec, RequestSpec, Scenario
from mlx_invariants.fuzz.session import run_scenario
from mlx_invariants.fuzz.settings import FuzzSettings
from mlx_invariants.fuzz.target import Target
from mlx_invariants.mutants import Edit, Mutant
from mlx_invariants.mutants.copies import import_copy
from tests.conftest import BACKSTOP_S

HEALTH_CACHED = Mutant(
    id="T25-health-cached-through-a-drain",
    title="/health answers from a 30 s cache of its last healthy answer",
    story="To keep a storm of readiness probes off the engine, the health route remembers a healthy answer "
          "for 30 s; a drain that begins meanwhile is not heard of, and the load balancer keeps sending "
          "requests to a server that refuses them all.",
    invariant="health stops answering healthy from the first step of a shutdown",
    killers=("fuzz:health-while-stopping",),
    edits=(Edit("engine/http/app.py", """
        engine = request.app.state.engine
        if engine.healthy:
            return JSONResponse({"status": "ok"})
    """, """
        engine = request.app.state.engine
        if time.monotonic() < getattr(request.app.state, "healthy_until", 0.0):
            return JSONResponse({"status": "ok"})
        if engine.healthy:
            request.app.state.healthy_until = time.monotonic() + 30.0
            return JSONResponse({"status": "ok"})
    """),),
)

# A stream stopped mid-decode: the engine drains it while its app still listens.
DRAINED = Scenario((RequestSpec("r0", max_tokens=6), RequestSpec("r1", max_tokens=3, stream=False, route="chat")),
                   (FaultSpec("shutdown", At("r0", "BEFORE_DECODE", 2)),))


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> str:
    return import_copy(HEALTH_CACHED, tmp_path_factory.mktemp("plants"))


@pytest.mark.parametrize("route", ["simple", "batched"])
def test_the_served_app_is_fuzzed_over_http_with_the_engines_points_under_the_scenarios_ids(route: str):
    # r1 once r0's seat is free: sent at once, the simple route's one seat may still be r0's on a loaded box, and
    # r1 is then rightly refused busy before the engine marks a point for it (a fresh clone's suite saw that).
    scenario = Scenario((RequestSpec("r0", max_tokens=5),
                         RequestSpec("r1", max_tokens=3, stream=False, arrival=At("r0", "SLOT_RELEASED"))),
                        (FaultSpec("cancel", At("r0", "BEFORE_DECODE", 2)),))
    trace = run_scenario(Target.engine(f"http-{route}").build(), scenario)
    assert judge(trace) == []
    assert trace.first("fault", "cancel", "r0").info["delivered"]
    # The engine's own points, named as the scenario names its requests (X-Request-Id), and the client's.
    for rid in ("r0", "r1"):
        assert {"ADMITTED", "WORKER_STARTED", "FINISHED", "SLOT_RELEASED", "BODY_PART"} <= \
               {e.name for e in trace.of("point") if e.rid == rid}
    # Over HTTP: the answer came in chunks of text, and the engine's MLX was seen in this process.
    assert trace.first("request", "end", "r1").info["unit"] == "chunk" and trace.of("mlx")
    assert trace.first("check", "loop-lag").info["in_process"]


def test_health_cached_through_a_drain_is_found_behind_the_app_and_the_real_app_tells_the_drain(planted: str):
    caught = judge(run_scenario(Target.served("simple", package=planted).build(), DRAINED))
    assert {v.kind for v in caught} == {"health-while-stopping"}, [v.kind for v in caught]  # drained and stopped
    trace = run_scenario(Target.engine("http-simple").build(), DRAINED)
    assert judge(trace) == []
    assert [e.info for e in trace.of("check", "stopping-health")] == [
        {"during": "drain", "healthy": False}, {"during": "stopped", "healthy": False}]


@pytest.mark.slow
def test_the_fuzzer_finds_the_cached_health_by_generation_behind_the_served_app(planted: str, tmp_path):
    result = run_fuzz(Target.served("simple", package=planted),
                      FuzzSettings(profile="ci", examples=80, budget_s=BACKSTOP_S, replays=0,
                                   report_dir=str(tmp_path)))
    assert result.failure is not None and result.failure.violations[0].kind == "health-while-stopping"
