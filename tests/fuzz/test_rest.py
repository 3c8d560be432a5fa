"""The rest-state oracles (`fuzz/rest.py`): on hand-built traces, and on engines that leak a thread or MLX
memory per request (tests/fuzz/leaky_engine.py) behind a clean `status()`, against the engine without the leak."""

from __future__ import annotations

import pytest

from mlx_invariants.fuzz import rest
from mlx_invariants.fuzz.oracles import judge
from mlx_invariants.fuzz.rest import (DRIFT_SCENARIOS, REST_NOISE_BYTES, RestSample, RestSeries, held_counts,
                                      server_floor, stays_at_rest)
from mlx_invariants.fuzz.scenario import At, FaultSpec, RequestSpec, Scenario
from mlx_invariants.fuzz.sentinel import Sentinel
from mlx_invariants.fuzz.session import EngineSession, run_scenario
from mlx_invariants.fuzz.target import Target
from mlx_invariants.fuzz.trace import Trace

MIB = 1024 * 1024
# One request that completes (the engine is warm before the follow-up), then the follow-up.
SERVED = Scenario((RequestSpec("r0", prompt_len=3, max_tokens=3, stream=True),))
# A request cancelled mid-decode: what an abort may leave.
CANCELLED = Scenario((RequestSpec("r0", prompt_len=3, max_tokens=8, stream=True),),
                     (FaultSpec("cancel", At("r0", "BEFORE_DECODE", 2)),))


def _rest(before: RestSample, after: RestSample, warm: bool = True, left: tuple[str, ...] = (),
          series: tuple[RestSample, ...] = (), where: str = "in-process") -> Trace:
    trace = Trace()
    trace.record("check", "rest", info={"before": before.to_json(), "after": after.to_json(), "warm": warm,
                                        "threads_left": list(left), "series": [s.to_json() for s in series],
                                        "where": where})
    return trace


def _kinds(trace: Trace) -> list[str]:
    return [v.kind for v in stays_at_rest(trace)]


def test_a_thread_or_memory_left_by_one_request_on_a_warm_engine_is_reported():
    at_rest = RestSample(2, 10 * MIB)
    assert _kinds(_rest(at_rest, RestSample(3, 10 * MIB), left=("watch-followup",))) == ["thread-left-at-rest"]
    assert _kinds(_rest(at_rest, RestSample(2, 11 * MIB))) == ["memory-left-at-rest"]


def test_noise_a_cold_engine_and_memory_given_back_are_not_reported():
    at_rest = RestSample(2, 10 * MIB)
    assert _kinds(_rest(at_rest, RestSample(2, 10 * MIB + REST_NOISE_BYTES))) == []   # within the noise
    assert _kinds(_rest(at_rest, RestSample(3, 11 * MIB), warm=False, left=("pool-0",))) == []  # first use
    assert _kinds(_rest(at_rest, RestSample(2, 9 * MIB))) == []


def test_memory_climbing_over_scenarios_is_a_drift_and_a_cache_that_fills_up_is_not():
    at_rest = RestSample(2, 10 * MIB)
    leak = tuple(RestSample(2, 10 * MIB + k * 200 * 1024) for k in range(DRIFT_SCENARIOS + 1))
    assert _kinds(_rest(at_rest, at_rest, series=leak)) == ["rest-drift"]
    filled = tuple(RestSample(2, 10 * MIB + min(k, 2) * MIB) for k in range(DRIFT_SCENARIOS + 1))
    assert _kinds(_rest(at_rest, at_rest, series=filled)) == []
    noisy = tuple(RestSample(2, 10 * MIB + (k % 2) * 56 * 1024) for k in range(DRIFT_SCENARIOS + 1))
    assert _kinds(_rest(at_rest, at_rest, series=noisy)) == []
    assert _kinds(_rest(at_rest, at_rest, series=leak[:-1])) == []  # too few scenarios to tell


def test_a_servers_threads_climbing_over_scenarios_is_a_drift():
    trace = Trace()
    climbing = [RestSample(4 + k, None).to_json() for k in range(DRIFT_SCENARIOS + 1)]
    trace.record("check", "rest", info={"series": climbing, "where": "server"})
    assert _kinds(trace) == ["rest-drift"]
    # The reference server on a GPU run: its tokenizing pool grew from 4 to 14 threads as scenarios of up to
    # 10 requests came (one thread per request at once, kept): no leak. Past that allowance, one.
    grown = [RestSample(t, None).to_json() for t in (4, 5, 6, 8, 9, 10, 12, 13, 14)]
    trace = Trace()
    trace.record("check", "rest", info={"series": grown, "where": "server", "pool_bound": 4 + 11})
    assert _kinds(trace) == []
    trace = Trace()
    trace.record("check", "rest", info={"series": grown, "where": "server", "pool_bound": 4 + 6})
    assert _kinds(trace) == ["rest-drift"]
    pool = [RestSample(4 + min(k, 4), None).to_json() for k in range(DRIFT_SCENARIOS + 1)]
    trace = Trace()
    trace.record("check", "rest", info={"series": pool, "where": "server"})
    assert _kinds(trace) == []


def test_the_servers_floor_is_the_least_its_sentinel_saw_at_an_mlx_entry():
    trace = Trace()
    for threads, memory in ((6, 5 * MIB), (4, 7 * MIB), (5, 6 * MIB)):
        trace.record("mlx", "eval", info={"rest": {"threads": threads, "mlx_active": memory}})
    assert server_floor(trace) == RestSample(4, 5 * MIB)
    assert server_floor(Trace()) is None


def test_an_injected_sentinel_samples_threads_and_memory_at_each_mlx_entry():
    import mlx.core as mx

    trace = Trace()
    with Sentinel(sample_rest=True, trace=trace, observe=False):
        mx.eval(mx.zeros((4,)))
    assert [set(e.info["rest"]) for e in trace.of("mlx")] == [{"threads", "mlx_active"}]
    plain = Trace()
    with Sentinel(trace=plain, observe=False):
        mx.eval(mx.zeros((4,)))
    assert all("rest" not in e.info for e in plain.of("mlx"))


def test_a_status_in_the_reference_schema_is_read_by_kind():
    status = {"active": 0, "queued": 0, "healthy": True, "requests": {"a": "draining"},
              "held": {"streams": 1, "generator": 1, "flag": True}}
    assert held_counts(status) == {"active": 0, "queued": 0, "requests": 1, "streams": 1, "generator": 1}


@pytest.mark.parametrize("factory,kind", [("make_thread_leak", "thread-left-at-rest"),
                                          ("make_memory_leak", "memory-left-at-rest")])
def test_a_per_request_leak_behind_a_clean_status_is_found_and_the_engine_without_it_is_clean(factory, kind):
    found = judge(run_scenario(Target.engine(f"tests.fuzz.leaky_engine:{factory}").build(), SERVED))
    assert [v.kind for v in found] == [kind], [v.message for v in found]
    clean = judge(run_scenario(Target.engine("tests.fuzz.leaky_engine:make_clean").build(), SERVED))
    assert clean == [], [v.message for v in clean]


def _drift_over_scenarios(factory: str) -> list[list[str]]:
    sentinel = Sentinel().install()
    session = EngineSession(Target.engine(f"tests.fuzz.leaky_engine:{factory}").build(), sentinel)
    try:
        session.run(SERVED)
        # the served scenario and DRIFT_SCENARIOS cancelled ones: the window is full at the last
        return [[v.kind for v in judge(session.run(CANCELLED))] for _ in range(DRIFT_SCENARIOS)]
    finally:
        session.close()
        sentinel.uninstall()


def test_a_small_leak_per_aborted_request_is_a_drift_over_scenarios_on_one_engine():
    kinds = _drift_over_scenarios("make_abort_leak")
    assert kinds[-1] == ["rest-drift"] and all(k == [] for k in kinds[:-1]), kinds
    assert all(k == [] for k in _drift_over_scenarios("make_clean"))


def test_a_launched_servers_status_is_read_where_it_speaks_the_reference_schema(http_server, tmp_path):
    import functools
    import http.server
    import threading

    from mlx_invariants.fuzz.adapters.http import HttpAdapter, ServerProcess

    ours = HttpAdapter(http_server.url, ServerProcess("never started"), http_server.model_id)
    held = ours.status()
    assert {"active", "queued", "requests", "streams", "jobs"} <= set(held) and not any(held.values()), held
    assert HttpAdapter(http_server.url, None, http_server.model_id).status() == {}  # a URL target: not read
    files = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), files)  # /v1/status: 404
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        theirs = HttpAdapter(f"http://127.0.0.1:{other.server_port}", ServerProcess("never started"), "m")
        assert theirs.status() == {} and not theirs._speaks_status
    finally:
        other.shutdown()
        other.server_close()


def test_a_series_allows_a_pool_one_thread_per_request_at_once_over_its_first_sample(monkeypatch):
    monkeypatch.setattr(rest, "DEFAULT_POOL_THREADS", 6)  # a 2-core machine's default executor
    series = RestSeries()
    series.add(RestSample(4, None), requests=3)
    assert series.pool_bound == 4 + 6
    series.add(RestSample(9, None), requests=11)
    series.add(RestSample(9, None), requests=2)
    assert series.pool_bound == 4 + 11


def test_a_series_allows_the_default_executor_its_size_on_a_big_machine(monkeypatch):
    """A GPU run on 16 cores: the reference server's threads at rest went 6 6 6 8 11 14 19 20 23 under scenarios
    of at most 11 requests, its `to_thread` pool filling toward Python's bound there, min(32, 16 + 4)."""
    monkeypatch.setattr(rest, "DEFAULT_POOL_THREADS", 20)
    series = RestSeries()
    grown = [series.add(RestSample(n, None), requests=11) for n in (6, 6, 6, 8, 11, 14, 19, 20, 23)][-1]
    trace = Trace()
    trace.record("check", "rest", info={"series": grown, "where": "server", "pool_bound": series.pool_bound})
    assert series.pool_bound == 26 and _kinds(trace) == []
    monkeypatch.setattr(rest, "DEFAULT_POOL_THREADS", 6)
    trace.events[-1].info["pool_bound"] = series.pool_bound
    assert _kinds(trace) == ["rest-drift"]
