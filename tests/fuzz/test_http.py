"""The HTTP adapter on real servers over 127.0.0.1: mlx_lm.server with the tiny model passes, a racy
server is caught by the sentinel injected into its process, and only loopback URLs are accepted."""

from __future__ import annotations

import sys

import pytest

from mlx_invariants.fuzz.adapters.http import ServerError, check_loopback, http_engine
from mlx_invariants.fuzz.driver import run_scenario
from mlx_invariants.fuzz.oracles import judge
from mlx_invariants.fuzz.runner import run_fuzz
from mlx_invariants.fuzz.scenario import At, FaultSpec, RequestSpec, Scenario

STREAMS = Scenario((RequestSpec("r0", 4, 6, True), RequestSpec("r1", 3, 4, True)),
                   (FaultSpec("disconnect", At("r0", "CHUNK_SENT", 1)),))


@pytest.fixture(scope="module")
def mlx_lm_server():
    from mlx_invariants.engine.model import tiny_model_path

    factory = http_engine(server_cmd=f"{sys.executable} -m mlx_lm.server --model {tiny_model_path()} "
                                     "--host 127.0.0.1 --port {port}")
    yield factory
    factory.server.stop()


def test_mlx_lm_server_passes_and_its_mlx_calls_are_seen(mlx_lm_server):
    fresh = run_scenario(mlx_lm_server, Scenario(()))
    trace = run_scenario(mlx_lm_server, STREAMS, expected_followup=fresh.meta["followup"])
    assert judge(trace) == []
    disconnect = trace.first("fault", "disconnect", "r0")
    assert disconnect is not None and disconnect.info["delivered"]
    assert trace.first("request", "end", "r0").info["outcome"] == "disconnected"
    server_threads = {e.thread_name for e in trace.of("mlx")}
    assert server_threads and all("_run_generate" in name for name in server_threads)


def test_mlx_lm_server_survives_a_short_fuzz_run(mlx_lm_server):
    result = run_fuzz(mlx_lm_server, profile="ci", examples=15, budget=60, explicit=(), debug_run=False)
    assert result.ok, result.failure and result.failure.headline


def test_mlx_on_request_threads_is_caught_inside_the_server_process():
    factory = http_engine(server_cmd=f"{sys.executable} tests/fuzz/racy_server.py {{port}}")
    try:
        trace = run_scenario(factory, Scenario((RequestSpec("r0", 2, 3, False), RequestSpec("r1", 2, 3, True))))
    finally:
        factory.server.stop()
    kinds = {v.kind for v in judge(trace)}
    assert "mlx-off-owner" in kinds, kinds


@pytest.mark.parametrize("url", ["http://10.0.0.1:8080", "http://example.com", "http://0.0.0.0:1"])
def test_only_loopback_urls_are_fuzzed(url):
    with pytest.raises(ServerError, match="loopback"):
        check_loopback(url)
    assert check_loopback("http://127.0.0.1:8080/") == "http://127.0.0.1:8080"
