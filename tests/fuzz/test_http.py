"""The HTTP adapter on real servers over 127.0.0.1: mlx_lm.server with the tiny model passes, a racy
server is caught by the sentinel injected into its process, only loopback URLs are accepted, and a
server or URL target replays from its scenario file alone."""

from __future__ import annotations

import sys

import pytest

from mlx_invariants.cli import main
from mlx_invariants.fuzz.adapters.http import ServerProcess, check_loopback
from mlx_invariants.fuzz.case import dumps_case
from mlx_invariants.fuzz.errors import ServerError
from mlx_invariants.fuzz.oracles import judge
from mlx_invariants.fuzz.runner import run_fuzz
from mlx_invariants.fuzz.scenario import At, FaultSpec, RequestSpec, Scenario
from mlx_invariants.fuzz.session import run_scenario
from mlx_invariants.fuzz.settings import FuzzSettings
from mlx_invariants.fuzz.target import Target

STREAMS = Scenario((RequestSpec("r0", 4, 6, True), RequestSpec("r1", 3, 4, True)),
                   (FaultSpec("disconnect", At("r0", "CHUNK_SENT", 1)),))


@pytest.fixture(scope="module")
def mlx_lm_server():
    from mlx_invariants.engine.model import tiny_model_path

    engines = Target.server(f"{sys.executable} -m mlx_lm.server --model {tiny_model_path()} "
                            "--host 127.0.0.1 --port {port}").build()
    yield engines
    engines.close()


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
    result = run_fuzz(mlx_lm_server, FuzzSettings(examples=15, budget_s=60, explicit=(), debug_run=False))
    assert result.ok, result.failure and result.failure.headline


def test_mlx_on_request_threads_is_caught_inside_the_server_process():
    engines = Target.server(f"{sys.executable} tests/fuzz/racy_server.py {{port}}").build()
    try:
        trace = run_scenario(engines, Scenario((RequestSpec("r0", 2, 3, False), RequestSpec("r1", 2, 3, True))))
    finally:
        engines.close()
    kinds = {v.kind for v in judge(trace)}
    assert "mlx-off-owner" in kinds, kinds


@pytest.mark.parametrize("url", ["http://10.0.0.1:8080", "http://example.com", "http://0.0.0.0:1"])
def test_only_loopback_urls_are_fuzzed(url):
    with pytest.raises(ServerError, match="loopback"):
        check_loopback(url)
    assert check_loopback("http://127.0.0.1:8080/") == "http://127.0.0.1:8080"


def test_a_server_target_replays_from_its_scenario_file_alone(tmp_path, capsys):
    target = Target.server(f"{sys.executable} tests/fuzz/racy_server.py {{port}}")
    case = tmp_path / "scenario.json"
    case.write_text(dumps_case(Scenario((RequestSpec("r0", 2, 3, False), RequestSpec("r1", 2, 3, True))), target))
    assert main(["fuzz", "--replay", str(case), "--replays", "1", "--report", str(tmp_path / "reports")]) == 1
    assert "mlx-off-owner" in capsys.readouterr().out


def test_a_url_target_replays_from_its_scenario_file_alone(tmp_path, capsys):
    server = ServerProcess(f"{sys.executable} tests/fuzz/racy_server.py {{port}}")
    try:
        case = tmp_path / "scenario.json"
        case.write_text(dumps_case(Scenario((RequestSpec("r0", 2, 3, True),)), Target.url(server.ensure())))
        # Nothing is injected into a server found by URL, so its race goes unseen; the request still runs.
        assert main(["fuzz", "--replay", str(case), "--replays", "1"]) == 0
    finally:
        server.stop()
    assert "violations in 0/1 run(s)" in capsys.readouterr().out
