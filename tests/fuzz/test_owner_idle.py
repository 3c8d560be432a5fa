"""`OWNER_IDLE`: the owner pauses between deciding to sleep and its wait while a request is posted, so a lost
wake-up leaves that request waiting and is found as a stall; the reference owners and a correct twin serve it."""

from __future__ import annotations

import pytest

from mlx_invariants.fuzz.oracles import judge
from mlx_invariants.fuzz.runner import run_fuzz
from mlx_invariants.fuzz.scenario import At, RequestSpec, Scenario
from mlx_invariants.fuzz.session import run_scenario
from mlx_invariants.fuzz.settings import FuzzSettings
from mlx_invariants.fuzz.target import Target

FORGETFUL = "tests.fuzz.lost_wakeup_engine:make_forgetful"
WATCHFUL = "tests.fuzz.lost_wakeup_engine:make_watchful"
# r1 is sent while the owner, done with r0, stands between its idle check and its wait.
POSTED_WHILE_GOING_IDLE = Scenario((RequestSpec("r0", 1, 2, False),
                                    RequestSpec("r1", 1, 2, False, arrival=At("r0", "OWNER_IDLE"))))


def _judged(target: Target, scenario: Scenario) -> tuple[list, list[str]]:
    trace = run_scenario(target.build(), scenario)
    points = [e.name for e in trace.of("point") if e.rid == "r0"]
    return judge(trace), points


def test_a_request_posted_while_the_owner_goes_idle_is_lost_by_an_owner_that_clears_its_wake_up_late():
    violations, points = _judged(Target.engine(FORGETFUL), POSTED_WHILE_GOING_IDLE)
    assert "OWNER_IDLE" in points, points
    assert any("r1" in v.message for v in violations if v.kind == "stalled"), violations


@pytest.mark.parametrize("target", [Target.engine(WATCHFUL), Target.reference("batched"), Target.reference("simple")],
                         ids=["watchful", "batched", "simple"])
def test_an_owner_that_clears_before_its_check_serves_the_request_posted_while_it_goes_idle(target: Target):
    violations, points = _judged(target, POSTED_WHILE_GOING_IDLE)
    assert "OWNER_IDLE" in points, points
    assert violations == []


def test_the_fuzzer_finds_the_lost_wake_up_among_its_first_examples():
    result = run_fuzz(Target.engine(FORGETFUL), FuzzSettings(profile="ci", examples=12, budget_s=600.0))
    assert result.findings and result.findings[0].kind == "stalled", result.findings
