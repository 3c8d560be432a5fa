"""Compute after every client has gone: the oracle and the step calibration on hand-built traces, then real
servers over HTTP, calibrated on a baseline as the runner does. The reference server (both engines) stops
decoding for a client that disconnected mid-request; a small server that keeps decoding for a gone
non-streaming client (as mlx_lm.server 0.32.2 does) is caught from the MLX calls its injected sentinel saw,
in decode steps, even though its step is many MLX calls and its HTTP front makes the wall pace slow."""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest

from mlx_invariants.fuzz.compute import GONE_STEPS, compute_stops_for_gone_clients, gone_clients
from mlx_invariants.fuzz.driver import DriverSettings
from mlx_invariants.fuzz.oracles import ORACLES, judge
from mlx_invariants.fuzz.pace import driver_settings, gone_budget, measure
from mlx_invariants.fuzz.scenario import At, FaultSpec, RequestSpec, Scenario
from mlx_invariants.fuzz.session import run_scenario
from mlx_invariants.fuzz.target import Target
from mlx_invariants.fuzz.trace import Event, Trace

# Disconnect a non-streaming request of a few dozen tokens once its body is sent, and a streaming one after
# its second chunk.
GONE = Scenario((RequestSpec("r0", 4, 30, False), RequestSpec("r1", 3, 30, True)),
                (FaultSpec("disconnect", At("r0", "ADMITTED")), FaultSpec("disconnect", At("r1", "CHUNK_SENT", 1))),
                followup=False)
# A longer non-streaming request alone: a server that serves one request at a time has nothing else to do
# first, and on a loaded machine, where the client may hear of its own disconnect late, enough of its 120
# steps are left after it goes (with 30, a busy box once saw fewer than the bound's 8 left).
GONE_ALONE = Scenario((RequestSpec("r0", 4, 120, False),), GONE.faults[:1], followup=False)
# Disconnect while the server is inside a step: it finishes the step (many MLX calls), then stops.
MID_STEP = Scenario((RequestSpec("r0", 4, 30, False),), (FaultSpec("disconnect", At("r0", "SERVER_STEP", 5)),),
                    followup=False)
SETTINGS = DriverSettings(quiet_ticks=50, stall_s=10.0, step_s=0.01)
GONE_SERVER = f"{sys.executable} tests/fuzz/gone_server.py {{port}} --evals-per-step 20"


def _ended(*outcomes: tuple[str, str]) -> Trace:
    trace = Trace()
    for rid, _ in outcomes:
        trace.record("request", "submit", rid)
    for rid, outcome in outcomes:
        trace.record("request", "end", rid, info={"outcome": outcome})
    return trace


def _checked(entries: int, per_step: float) -> Trace:
    trace = _ended(("r0", "disconnected"))
    trace.record("check", "compute-after-gone",
                 info={"rids": ["r0"], "entries": entries, "per_step": per_step, "mlx_s": 0.05, "busy_s": 0.3,
                       "quiet_s": 0.1})
    return trace


def test_mlx_past_the_bound_in_decode_steps_after_every_client_went_is_reported_naming_the_request():
    found = list(compute_stops_for_gone_clients(_checked(entries=40, per_step=4)))
    assert [(v.kind, v.rid) for v in found] == [("compute-after-disconnect", "r0")]
    assert "MLX ran 10.0 more decode steps (40 MLX calls at 4 per step" in found[0].message
    assert f"bound {GONE_STEPS} steps" in found[0].message
    assert compute_stops_for_gone_clients in ORACLES


def test_mlx_that_stops_within_the_bound_is_silent():
    assert list(compute_stops_for_gone_clients(_checked(entries=40, per_step=5))) == []  # 8 steps: the bound
    assert list(compute_stops_for_gone_clients(_checked(entries=8, per_step=0.25))) == []  # a flush, not compute
    assert list(compute_stops_for_gone_clients(_ended(("r0", "disconnected")))) == []


def _followup(tokens: int) -> tuple[Trace, Event, Event]:
    trace = Trace()
    submit = trace.record("request", "submit", "followup")
    return trace, submit, trace.record("request", "end", "followup", info={"tokens": tokens})


def test_a_step_is_calibrated_from_this_process_mlx_calls_during_the_followup():
    trace = Trace()
    trace.close_span(trace.record("mlx", "core.eval"))  # before the follow-up: not its
    submit = trace.record("request", "submit", "followup")
    spans = [trace.record("mlx", "core.eval") for _ in range(12)]
    for span in spans:
        trace.close_span(span)
    end = trace.record("request", "end", "followup", info={"tokens": 4})
    pace = measure(trace)
    assert pace.mlx_per_step == 3.0
    assert pace.mlx_step_s == pytest.approx((spans[-1].t_end - spans[0].t) / 4)
    assert pace.step_s == pytest.approx((end.t - submit.t) / 4)


def test_the_decode_pace_is_the_median_mlx_entry_not_one_spread_over_the_first_tokens():
    """A fresh server's first request spends most of its MLX time in one prefill entry (and first-use compiles):
    spread over a few tokens that read as a slow step, and a gone client's budget drew a tenth of a second of
    decoding where it meant a second (mlx-openai-server: 0.08 s a step measured so, 4 ms decoding)."""
    trace, submit, end = _followup(tokens=6)
    prefill = Event(2, "mlx", "generate", t=1.0, end=3, t_end=1.5)
    steps = [Event(4 + 2 * i, "mlx", "generate", t=1.5 + 0.004 * i, end=5 + 2 * i, t_end=1.504 + 0.004 * i)
             for i in range(5)]
    submit.t, end.t = 0.9, 1.6
    trace.merge([prefill, *steps])
    pace = measure(trace)
    assert pace.mlx_step_s == pytest.approx(0.52 / 6) and pace.decode_s == pytest.approx(0.004)
    assert gone_budget(pace) > 100 > gone_budget(replace(pace, decode_s=0.0)) == 12  # a second: 250, capped


def test_a_step_is_calibrated_from_a_server_spans_on_its_own_clock():
    trace, submit, end = _followup(tokens=4)
    submit.t, end.t = 1.0, 1.05  # the follow-up took 50 ms here, HTTP included
    startup = Event(1, "mlx", "core.eval", t=0.5, end=2, t_end=0.6)  # the server's model load, long before
    # Its follow-up: 10 MLX calls over 20 ms of the server's clock, i.e. 2.5 calls and 5 ms per step.
    steps = [Event(3 + 2 * i, "mlx", "core.eval", t=9.0 + 0.002 * i, end=4 + 2 * i, t_end=9.001 + 0.002 * i)
             for i in range(9)]
    steps.append(Event(30, "mlx", "core.eval", t=9.019, end=31, t_end=9.020))
    trace.merge([startup, *steps])
    pace = measure(trace)
    assert pace.mlx_per_step == 2.5 and pace.mlx_step_s == pytest.approx(0.005)
    settings, _ = driver_settings(SETTINGS, pace, remote=True)
    assert (settings.mlx_per_step, settings.mlx_step_s) == (pace.mlx_per_step, pace.mlx_step_s)


def test_only_a_scenario_whose_every_client_ended_and_one_went_is_watched():
    assert gone_clients(_ended(("r0", "disconnected"), ("r1", "completed"), ("r2", "cancelled"))) == ["r0", "r2"]
    assert gone_clients(_ended(("r0", "completed"), ("followup", "cancelled"))) == []
    unfinished = _ended(("r0", "disconnected"))
    unfinished.record("request", "submit", "r1")
    assert gone_clients(unfinished) == []


def test_after_a_worker_fault_the_gone_clients_compute_is_not_watched():
    """The lost-worker oracles judge an engine whose worker died or wedged: a wedged worker let go drains what
    it held in its own time (a GPU run: the released owner of a launched server ran 12 steps, 1 of 3 replays)."""
    scenario = Scenario((RequestSpec("r0", 4, 40, True), RequestSpec("r1", 4, 40, True)),
                        (FaultSpec("cancel", At("r0", "CHUNK_SENT", 1)),
                         FaultSpec("worker-dies", At("r1", "BEFORE_DECODE", 4))), followup=False)
    trace = run_scenario(Target.reference("simple").build(), scenario, settings=SETTINGS)
    assert trace.first("fault", "worker-dies") is not None and gone_clients(trace) == ["r0"], trace.of("request")
    assert not trace.of("check", "compute-after-gone")


def _calibrated(engines) -> DriverSettings:
    """The settings the runner would use: its pace measured on a request-free baseline of these engines."""
    baseline = run_scenario(engines, Scenario(()), settings=SETTINGS)
    return driver_settings(SETTINGS, measure(baseline), remote=True)[0]


def _runs(command: str, scenario: Scenario, times: int = 1, model: str = "default_model") -> list[Trace]:
    engines = Target.server(command, model=model).build()
    try:
        settings = _calibrated(engines)
        return [run_scenario(engines, scenario, settings=settings) for _ in range(times)]
    finally:
        engines.close()


@pytest.mark.parametrize("engine", ["simple", "batched"])
def test_the_reference_server_stops_decoding_for_clients_that_went(engine):
    trace, = _runs(f"{sys.executable} -m mlx_invariants serve --engine {engine} --admission wait "
                   "--max-wait-ms 20000 --host 127.0.0.1 --port {port}", GONE, model="mlx-invariants-tiny")
    assert [e.info["outcome"] for e in trace.of("request", "end")] == ["disconnected", "disconnected"]
    assert trace.of("check", "compute-after-gone"), "the scenario was not watched"
    assert judge(trace) == []


def test_a_server_that_keeps_decoding_for_a_gone_client_is_caught_in_decode_steps_every_time():
    # A step of this server is 20 MLX calls: counted in calls, a step in flight would already be a finding.
    traces = _runs(f"{GONE_SERVER} --keeps-decoding", GONE_ALONE, times=3)
    found = [[v for v in judge(trace) if v.kind == "compute-after-disconnect"] for trace in traces]
    assert [bool(f) and f[0].rid == "r0" for f in found] == [True, True, True], [judge(t) for t in traces]
    check = traces[0].of("check", "compute-after-gone")[0].info
    assert 15 <= check["per_step"] <= 25 and check["entries"] / check["per_step"] > GONE_STEPS, check


def test_the_same_server_that_checks_for_its_client_is_clean_even_finishing_a_step_in_flight():
    for trace in _runs(GONE_SERVER, MID_STEP, times=2) + _runs(GONE_SERVER, GONE_ALONE):
        fault = trace.first("fault", "disconnect", "r0")
        assert fault.info["delivered"] and trace.of("check", "compute-after-gone"), fault
        assert judge(trace) == [], trace.of("check", "compute-after-gone")[0].info


@pytest.mark.slow
def test_the_fuzzer_finds_mlx_lm_server_decoding_for_a_gone_non_streaming_client():
    """mlx_lm.server (mlx-lm 0.32.2, this venv's) keeps decoding every token of a non-streaming request
    whose client disconnected: docs/zoo.md, zoo/reproducers/gone_client_keeps_decoding.py. Counted in
    its decode steps (about 2 ms each here), 40 tokens are enough, though over HTTP a token takes 10-16 ms."""
    from mlx_invariants.engine.model import tiny_model_path
    from mlx_invariants.fuzz.runner import run_fuzz
    from mlx_invariants.fuzz.settings import FuzzSettings
    from tests.conftest import BACKSTOP_S

    gone = Scenario((RequestSpec("r0", 4, 40, False),), (FaultSpec("disconnect", At("r0", "ADMITTED")),))
    engines = Target.server(f"{sys.executable} -m mlx_lm.server --model {tiny_model_path()} "
                            "--host 127.0.0.1 --port {port}").build()
    try:
        result = run_fuzz(engines, FuzzSettings(examples=1, budget_s=BACKSTOP_S, explicit=(gone,), debug_run=False))
    finally:
        engines.close()
    assert not result.ok and result.failure.headline.startswith("compute-after-disconnect"), \
        result.failure and result.failure.headline
    hits, runs = result.new_findings[0].confirmation
    assert hits == runs == 3, (hits, runs)  # a request of a few dozen tokens: every replay shows it
