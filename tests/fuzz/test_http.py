"""The HTTP adapter on real servers over 127.0.0.1: mlx_lm.server with the tiny model passes, a racy
server is caught by the sentinel injected into its process, only loopback URLs are accepted, and a
server or URL target replays from its scenario file alone. The client's own moments: an error frame in
a 200 stream is an error, SERVER_STEP disconnects a non-streaming client mid-generation (launched servers
only), BODY_PART goes with half a body sent."""

from __future__ import annotations

import asyncio
import sys

import httpx
import pytest

from mlx_invariants.cli import main
from mlx_invariants.fuzz.followup import FollowupOutcome
from mlx_invariants.fuzz.adapters.http import HTTP_POINTS, HttpAdapter, HttpHandle, ServerProcess, check_loopback
from mlx_invariants.fuzz.case import dumps_case
from mlx_invariants.fuzz.driver import DriverSettings
from mlx_invariants.fuzz.errors import ServerError, TargetError
from mlx_invariants.fuzz.oracles import judge
from mlx_invariants.fuzz.report import cause_of
from mlx_invariants.fuzz.runner import run_fuzz
from mlx_invariants.fuzz.scenario import At, FaultSpec, RequestSpec, Scenario
from mlx_invariants.fuzz.session import run_scenario
from mlx_invariants.fuzz.settings import FuzzSettings
from mlx_invariants.fuzz.target import Engines, Target
from mlx_invariants.fuzz.trace import Trace
from tests.conftest import BACKSTOP_S

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
    trace = run_scenario(mlx_lm_server, STREAMS, expected_followup=FollowupOutcome.of_trace(fresh))
    assert judge(trace) == []
    disconnect = trace.first("fault", "disconnect", "r0")
    assert disconnect is not None and disconnect.info["delivered"]
    assert trace.first("request", "end", "r0").info["outcome"] == "disconnected"
    server_threads = {e.thread_name for e in trace.of("mlx")}
    assert server_threads and all("_run_generate" in name for name in server_threads)


def test_mlx_lm_server_survives_a_short_fuzz_run(mlx_lm_server):
    # Its one known bug may show: it keeps decoding for a gone non-streaming client (docs/zoo.md).
    result = run_fuzz(mlx_lm_server, FuzzSettings(examples=15, budget_s=BACKSTOP_S, explicit=(), debug_run=False,
                                                  keep_going=True, shrink=False))
    assert {f.kind for f in result.new_findings} <= {"compute-after-disconnect"}, \
        [f.failure.headline for f in result.new_findings]


def test_mlx_on_request_threads_is_caught_inside_the_server_process():
    engines = Target.server(f"{sys.executable} tests/fuzz/racy_server.py {{port}}", owner="generation").build()
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
    target = Target.server(f"{sys.executable} tests/fuzz/racy_server.py {{port}}", owner="generation")
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
        server.close()
    assert "violations in 0/1 run(s)" in capsys.readouterr().out


# -- the client's moments and what it reads ---------------------------------------------------------------
# A server over HTTP is watched in another process: "stalled" counts only after stall_s (fuzz.pace does so).
REMOTE = DriverSettings(quiet_ticks=50, stall_s=10.0, step_s=0.01)


def _served(command: str, scenario: Scenario, busy_bound_s: float = 0.0) -> Trace:
    """`scenario` on the server `command` started for it, with the follow-up a fresh run of it returned."""
    target, server = Target.server(command), ServerProcess(command)

    def make() -> HttpAdapter:
        adapter = HttpAdapter("", server, target.model, target.routes)
        adapter.busy_bound_s = busy_bound_s or adapter.busy_bound_s
        return adapter
    engines = Engines(target, make, server)
    try:
        fresh = run_scenario(engines, Scenario(()), settings=REMOTE)
        trace = run_scenario(engines, scenario, expected_followup=FollowupOutcome.of_trace(fresh), settings=REMOTE)
        trace.meta["server_log"] = server.log_tail()
        return trace
    finally:
        engines.close()


async def _read_stream(body: bytes) -> tuple[list[str], HttpHandle]:
    reply = httpx.Response(200, content=body, headers={"Content-Type": "text/event-stream"})
    async with httpx.AsyncClient(transport=httpx.MockTransport(lambda request: reply),
                                 base_url="http://127.0.0.1:1") as client:
        response = await client.send(client.build_request("POST", "/v1/completions"), stream=True)
        handle = HttpHandle(HttpAdapter("http://127.0.0.1:1", None, "m"), "r0", response=response)
        tokens = [token async for token in handle]
        await handle.close()
    return tokens, handle


@pytest.mark.parametrize("body, message", [
    (b'data: {"choices": [{"text": "a"}]}\n\ndata: {"error": {"message": "boom"}}\n\n'
     b'data: {"choices": [{"text": "b"}]}\n\n', 'error frame inside an HTTP 200 stream: {"message": "boom"}'),
    (b'data: {"choices": [{"text": "a"}]}\n\ndata: Internal Server Error\n\n',
     "data line that is not JSON: 'Internal Server Error'"),
    (b'data: {"choices": [{"text": "a"}]}\n\ndata: [1, 2]\n\n', "not a JSON object: '[1, 2]'"),
])
def test_an_error_frame_or_an_unreadable_line_in_a_200_stream_ends_the_request_as_an_error(body, message):
    tokens, handle = asyncio.run(_read_stream(body))
    assert tokens == ["a"]
    outcome = handle.outcome()
    assert outcome.kind == "error" and message in outcome.message, outcome


def test_a_stream_without_error_frames_completes():
    tokens, handle = asyncio.run(_read_stream(
        b'data: {"choices": [{"text": "a", "finish_reason": null}]}\n\n'
        b'data: {"choices": [{"text": "b", "finish_reason": "length"}]}\n\ndata: [DONE]\n\n'))
    assert tokens == ["a", "b"] and handle.outcome().kind == "completed" and handle.outcome().reason == "length"


CANCELLED_STREAM = Scenario((RequestSpec("r0", 3, 8, True),), (FaultSpec("cancel", At("r0", "CHUNK_SENT", 0)),))


@pytest.mark.parametrize("flags, followup, cause", [
    ("", "completed", None),
    ("--leaks-cancelled", "error",
     'cause: the follow-up ended error: an error frame inside an HTTP 200 stream: {"message": "Internal server error"'),
    ("--leaks-cancelled --refuses", "refused",
     'cause: the follow-up was refused as busy (busy): {"error": {"message": "server busy"'),
])
def test_a_follow_up_answered_with_an_error_frame_after_a_cancelled_stream_is_a_finding(flags, followup, cause):
    """vllm-mlx 0.6.0 answers the request after a cancelled stream HTTP 200 with an "Internal server error"
    frame: an error, so the follow-up differs; a refusal with an error status is judged as a refusal."""
    trace = _served(f"{sys.executable} tests/fuzz/error_frame_server.py {{port}} {flags}", CANCELLED_STREAM)
    assert trace.first("fault", "cancel", "r0").info["delivered"]
    assert trace.of("request", "end", "followup")[-1].info["outcome"] == followup
    found = judge(trace)
    if cause is None:
        assert found == []
    else:
        assert [v.kind for v in found] == ["followup-differs"], found
        assert cause_of(trace, found[0].kind).startswith(cause), cause_of(trace, found[0].kind)


def test_a_server_a_violating_scenario_left_wedged_is_restarted_before_each_confirming_re_run():
    """The leaking server keeps the cancelled stream's slot for good, so every later request on it fails
    whatever it is sent: re-runs on it would confirm anything. Each violating run retires the server, so
    each re-run meets a new process."""
    command = f"{sys.executable} tests/fuzz/error_frame_server.py {{port}} --leaks-cancelled --mlx"
    target, server = Target.server(command), ServerProcess(command)
    engines = Engines(target, lambda: HttpAdapter("", server, target.model, target.routes), server)
    try:
        result = run_fuzz(engines, FuzzSettings(examples=1, budget_s=BACKSTOP_S, explicit=(CANCELLED_STREAM,),
                                                debug_run=False, replays=2, shrink=False))
    finally:
        engines.close()
    assert not result.ok and result.failure.headline.startswith("followup-differs"), result.failure
    hits, runs = result.new_findings[0].confirmation
    assert hits == runs == 2, (hits, runs)
    # the baseline's server also runs the scenario (the baseline was clean); then one server per re-run
    assert (server.starts, result.scenario_runs) == (1 + runs, 2 + runs), (server.starts, result.scenario_runs)


GONE_MID_GENERATION = Scenario((RequestSpec("r0", 4, 120, False),),
                               (FaultSpec("disconnect", At("r0", "SERVER_STEP", 3)),), followup=False)


def test_server_step_disconnects_a_non_streaming_client_while_the_server_decodes():
    """SERVER_STEP(3) comes once the server's sentinel recorded 3 more MLX entries after the body was sent:
    the server has begun the request when its client goes, so one run finds a server that keeps decoding
    (mlx_lm.server 0.32.2's bug), where a disconnect at ADMITTED may land before it began."""
    trace = _served(f"{sys.executable} tests/fuzz/gone_server.py {{port}} --keeps-decoding", GONE_MID_GENERATION)
    steps = [p.info["index"] for p in trace.of("point", "SERVER_STEP", "r0")]
    fault = trace.first("fault", "disconnect", "r0")
    # the server goes on decoding while the disconnect is delivered: on a loaded box more steps come before it
    assert steps[:4] == [0, 1, 2, 3] and fault.info == {"at": "r0@SERVER_STEP(3)", "delivered": True}, (steps, fault)
    assert fault.seq > trace.first("point", "ADMITTED", "r0").seq
    assert trace.of("request", "end", "r0")[-1].info["outcome"] == "disconnected"
    assert [v.kind for v in judge(trace)] == ["compute-after-disconnect"]
    clean = _served(f"{sys.executable} tests/fuzz/gone_server.py {{port}}", GONE_MID_GENERATION)
    assert clean.first("fault", "disconnect", "r0").info["delivered"] and judge(clean) == []


def test_a_launched_server_leaves_nothing_behind_once_its_engines_close():
    """Its log and sentinel records are copied into a report before the run closes; then the folder goes, or a
    runner's temporary folder would fill with one per fuzz run."""
    engines = Target.server(f"{sys.executable} tests/fuzz/gone_server.py {{port}}").build()
    engines.prepare()
    folder = engines.server_log.parent
    assert engines.server_log.is_file()
    engines.close()
    assert not folder.exists()


def test_server_step_never_comes_on_a_url_target_so_its_fault_is_not_delivered():
    server = ServerProcess(f"{sys.executable} tests/fuzz/gone_server.py {{port}}")
    try:
        trace = run_scenario(Target.url(server.ensure()).build(), GONE_MID_GENERATION, settings=REMOTE)
    finally:
        server.close()
    assert not trace.of("point", "SERVER_STEP") and not trace.of("fault", "disconnect")
    assert trace.of("request", "end", "r0")[-1].info["outcome"] == "completed"


HALF_A_BODY = Scenario((RequestSpec("r0", 3, 4, False),), (FaultSpec("disconnect", At("r0", "BODY_PART")),))


@pytest.mark.parametrize("flags, found", [("", []), ("--waits-for-cut-body", ["cut-body-blocks"])])
def test_a_client_gone_with_half_its_body_sent_must_not_hold_the_server(flags, found):
    """The server is sent the full Content-Length and half the body, then the client goes. One that keeps its
    slot waiting for the rest (5 s) makes the follow-up wait past the admission bound (1 s here)."""
    command = f"{sys.executable} tests/fuzz/cut_body_server.py {{port}} {flags}"
    trace = _served(command, HALF_A_BODY, busy_bound_s=1.0)
    assert trace.first("fault", "disconnect", "r0").info == {"at": "r0@BODY_PART", "delivered": True}
    assert not trace.of("point", "ADMITTED", "r0")  # the rest of the body was never sent
    assert "cut body: " in trace.meta["server_log"]  # the server got the headers and part of the body
    assert [v.kind for v in judge(trace)] == found
    if found:
        assert "after r0 went with half a request body sent (bound 1.0s)" in judge(trace)[0].message


def test_http_targets_aim_at_the_client_points_simplest_first_and_scenarios_name_them():
    assert HTTP_POINTS[:2] == ("ADMITTED", "CHUNK_SENT") and set(HTTP_POINTS) >= {"SERVER_STEP", "BODY_PART"}
    assert Target.server("serve --port {port}").points == HTTP_POINTS
    scenario = Scenario.loads(Scenario((RequestSpec("r0"),), (FaultSpec("cancel", At("r0", "SERVER_STEP", 2)),
                                                                FaultSpec("disconnect", At("r0", "BODY_PART")))).dumps())
    assert scenario.describe().endswith("cancel at r0@SERVER_STEP(2); disconnect at r0@BODY_PART executor=owner")
    with pytest.raises(TargetError, match="points must be some of"):
        Target(Target.reference("simple").kind, "simple", points=("BODY_PART",))


def test_a_server_closing_an_idle_kept_alive_connection_as_a_request_comes_is_no_finding():
    # Each of this server's connections answers once, then closes unanswered when its next request arrives: a
    # keep-alive timer firing in flight. A client reusing connections saw the follow-up die with ReadError.
    trace = _served(f"{sys.executable} tests/fuzz/idle_close_server.py {{port}}",
                    Scenario((RequestSpec("r0", 3, 4, False), RequestSpec("r1", 3, 4, False))))
    assert judge(trace) == [], judge(trace)
    assert {e.rid: e.info["outcome"] for e in trace.of("request", "end")} == {
        "r0": "completed", "r1": "completed", "followup": "completed"}


def test_a_launched_server_is_named_in_the_trace_so_a_report_says_which_process_answered():
    """A connection refused mid-scenario must say which process was gone: the trace names the server's pid, URL
    and start, and whether it still ran when the scenario ended (its exit status once it has one)."""
    trace = _served(f"{sys.executable} tests/fuzz/racy_server.py {{port}}", Scenario((RequestSpec("r0", 2, 3, True),)))
    server = trace.meta["server"]
    assert server["pid"] > 0 and server["url"].startswith("http://127.0.0.1:") and server["start"] == 1, server
    assert server["exit"] is None, server
