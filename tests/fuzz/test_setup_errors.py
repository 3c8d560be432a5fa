"""A target the fuzzer cannot judge is a setup error (exit 2, in the server's words), never a finding.

Before these checks, a server whose follow-up was refused failed every run with a "confirmed"
followup-differs: two refusals of the same request were compared with their timings, and a
server that never entered MLX was fuzzed for its whole budget.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mlx_invariants.fuzz.driver import DriverSettings
from mlx_invariants.fuzz.errors import SetupError, TargetError
from mlx_invariants.fuzz.followup import FollowupOutcome, reference_of
from mlx_invariants.fuzz.oracles import followup_matches_fresh, judge
from mlx_invariants.fuzz.pace import MAX_SCENARIO_TOKENS, STEP_FACTOR, Pace, driver_settings
from mlx_invariants.fuzz.runner import run_fuzz
from mlx_invariants.fuzz.scenario import Scenario
from mlx_invariants.fuzz.session import run_scenario
from mlx_invariants.fuzz.settings import FuzzSettings
from mlx_invariants.fuzz.target import Target
from mlx_invariants.fuzz.trace import Trace
from tests.fuzz.slow_start_engine import START_S

ROOT = Path(__file__).resolve().parents[2]
SLOW = f"{sys.executable} tests/fuzz/slow_server.py {{port}}"
QUICK = FuzzSettings(examples=2, explicit=(), debug_run=False, replays=1)


def _followup_check(got: dict, expected: dict) -> list[str]:
    trace = Trace()
    trace.record("check", "followup", info={"got": got, "expected": expected})
    return [v.kind for v in followup_matches_fresh(trace)]


def _refusal(**end) -> dict:
    return FollowupOutcome.of({"outcome": "refused", "code": "text_generation_busy", "message": "busy", **end},
                              []).to_json()


def test_two_refusals_of_the_follow_up_are_the_same_answer_whatever_they_took():
    assert _followup_check(_refusal(elapsed_s=0.0013), _refusal(elapsed_s=0.0021)) == []
    assert _followup_check(_refusal(message="said otherwise"), _refusal()) == []  # words are not compared


@pytest.mark.parametrize("got", [
    FollowupOutcome("completed", tokens=(1, 2, 4)).to_json(),    # other tokens
    FollowupOutcome("refused", code="model_not_found").to_json(),  # refused where a fresh engine served
    FollowupOutcome("error", code="internal_error").to_json(),
])
def test_a_follow_up_that_ends_otherwise_or_with_other_tokens_differs(got):
    expected = FollowupOutcome("completed", tokens=(1, 2, 3)).to_json()
    assert _followup_check(got, expected) == ["followup-differs"]


def _baseline(outcome: FollowupOutcome) -> Trace:
    trace = Trace()
    trace.meta["followup"] = outcome.to_json()
    return trace


@pytest.mark.parametrize("outcome", [FollowupOutcome("refused", "model_not_found"), FollowupOutcome("refused", "422")])
def test_a_follow_up_refused_for_what_it_is_is_a_setup_error(outcome):
    with pytest.raises(SetupError, match="name the model with --model"):
        reference_of(_baseline(outcome), "target")


@pytest.mark.parametrize("outcome", [
    FollowupOutcome("crashed", message="LockReentered: ..."),      # the engine's own bug, on every request
    FollowupOutcome("refused", "text_generation_busy"),            # busy with nothing running: a leak
    FollowupOutcome("refused", "500"), FollowupOutcome("error", "internal_error")])
def test_a_follow_up_the_engine_failed_is_the_oracles_to_judge_not_a_setup_error(outcome):
    assert reference_of(_baseline(outcome), "target") == outcome


def test_a_server_whose_baseline_follow_up_is_refused_is_a_setup_error_in_its_own_words():
    with pytest.raises(SetupError, match=r"follow-up request was refused invalid_temperature: .*greater than 0"):
        run_fuzz(Target.server(f"{SLOW} --rejects-greedy"), QUICK)


def test_the_request_body_lets_that_server_be_fuzzed():
    result = run_fuzz(Target.server(f"{SLOW} --rejects-greedy", request_body='{"temperature": 0.5}'), QUICK)
    assert result.examples == 2 and result.ok, [f.failure.headline for f in result.findings]


def test_a_launched_server_that_never_enters_mlx_is_a_setup_error():
    with pytest.raises(SetupError, match="saw no MLX call"):
        run_fuzz(Target.server(f"{sys.executable} tests/fuzz/cut_body_server.py {{port}}"), QUICK)


def test_an_engine_whose_first_request_waits_on_a_kernel_compile_gives_a_baseline():
    """Its first request waits 6.5 s on a busy thread that records nothing, as MLX's CUDA backend compiles
    kernels on first use: past the unpaced no-progress backstop, yet no stall and no setup error (on an H100
    with 8 fuzz processes compiling side by side, every in-process engine's baseline was cut as never
    ended)."""
    result = run_fuzz(Target.module_factory("tests.fuzz.slow_first_engine:make"),
                      FuzzSettings(examples=1, explicit=(), debug_run=False, replays=0))
    assert result.ok and result.examples == 1, [f.failure.headline for f in result.findings]


def test_an_engines_slow_first_start_is_timed_apart_from_its_baseline_scenario():
    """A first start longer than the scenario's backstop (imports, a model load) leaves the scenario, its
    follow-up included, the whole backstop once it returned, and its time is recorded. Before, the
    backstop ran from before the start, and vllm-mlx's in-process runs on a loaded box ended as "the
    baseline's follow-up request never ended"."""
    settings = DriverSettings(backstop_s=START_S - 1, start_s=10 * START_S)
    trace = run_scenario(Target.module_factory("tests.fuzz.slow_start_engine:make").build(), Scenario(()),
                         settings=settings)
    assert reference_of(trace, "slow start").kind == "completed"
    assert trace.meta["start_s"] >= START_S and not judge(trace)


def test_a_first_start_that_never_returns_is_named_as_the_start():
    trace = run_scenario(Target.module_factory("tests.fuzz.slow_start_engine:make_hung").build(), Scenario(()),
                         settings=DriverSettings(start_s=1.0))
    with pytest.raises(SetupError, match="the engine's first start did not return within 1s"):
        reference_of(trace, "hung start")
    assert [v.message for v in judge(trace)] == ["the engine's start did not return within 1s"]


def test_a_run_counts_an_in_process_engines_first_start_as_its_start_up():
    """As a launched server's: reported as the pace's start-up, outside the budget."""
    result = run_fuzz(Target.module_factory("tests.fuzz.slow_start_engine:make"),
                      FuzzSettings(examples=1, explicit=(), debug_run=False, replays=0))
    assert result.ok and result.pace.startup_s >= START_S, [f.failure.headline for f in result.findings]


def test_an_in_process_engines_no_progress_backstop_scales_with_its_pace():
    """One long MLX call records nothing until it returns: a slower engine gets a longer backstop."""
    base = DriverSettings()
    quick, _ = driver_settings(base, Pace(step_s=0.001), remote=False)
    slow, _ = driver_settings(base, Pace(step_s=0.05), remote=False)
    assert quick.stall_s == base.stall_s < slow.stall_s == pytest.approx(STEP_FACTOR * MAX_SCENARIO_TOKENS * 0.05)


@pytest.mark.parametrize("body", ["[1, 2]", "{temperature: 1}"])
def test_a_request_body_that_is_not_a_json_object_is_refused(body):
    with pytest.raises(TargetError, match="must be a JSON object"):
        Target.server(SLOW, request_body=body)


def test_a_request_body_travels_with_the_target_into_replay_files():
    target = Target.server(SLOW, request_body='{"top_p": 0.9}')
    assert Target.from_dict(target.to_dict()) == target


def test_the_cli_exits_2_naming_the_model_it_was_not_served(tmp_path):
    """The reference server without --model: every request names a model it does not serve."""
    command = f"{sys.executable} -m mlx_invariants serve --port {{port}}"
    done = subprocess.run([sys.executable, "-m", "mlx_invariants", "fuzz", "--server-cmd", command, "--jobs", "0",
                           "--examples", "2", "--report", str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "model_not_found" in done.stderr and "--model" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("past_budget, runs", [(False, 3), (True, 0)])
def test_past_the_budget_a_finding_is_not_replayed(monkeypatch, past_budget, runs):
    """The budget is a wall-clock promise: once past it (and its grace), no fresh re-run starts (a server's
    stalled scenario takes its whole stall bound), and the finding says how many it had. An exact kind
    counts all the same."""
    from mlx_invariants.fuzz import runner

    monkeypatch.setattr(runner._Fuzz, "_past_grace", lambda self: past_budget)
    result = run_fuzz(Target.module_factory("tests.fuzz.fastpath_engine:make"),
                      FuzzSettings(examples=3, replays=3, debug_run=False, shrink=False))
    finding = result.findings[0]
    assert finding.kind == "mlx-off-owner" and finding.confirmation[1] == runs, finding.confirmation
    assert finding.new  # exact: one sighting counts without a replay
    assert ("the budget ended after 0 of its 3 re-runs" in (finding.failure.blob or "")) is past_budget
