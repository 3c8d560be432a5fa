"""Shrinking a confirmed failure through Hypothesis (`fuzz.runner`, `fuzz.shrinking`), on a stand-in engine
that answers at once: a scenario fails exactly when one of its faults is a cancel, every time. What is
reported is Hypothesis's minimal failure; where Hypothesis stops shrinking because it calls the failure flaky,
the smallest scenario shown to fail until then, never the one first met."""

from __future__ import annotations

from hypothesis import strategies as st

from mlx_invariants.fuzz.oracles import Violation
from mlx_invariants.fuzz.profiles import PROFILES
from mlx_invariants.fuzz.runner import _Fuzz
from mlx_invariants.fuzz.scenario import Scenario
from mlx_invariants.fuzz.settings import FuzzSettings
from mlx_invariants.fuzz.shrinking import size
from mlx_invariants.fuzz.strategies import scenarios
from mlx_invariants.fuzz.target import Target
from mlx_invariants.fuzz.trace import Trace
from tests.conftest import BACKSTOP_S

SHAPES = dict(max_requests=3, max_faults=2, kinds=("abort", "cancel"), surface=False, gone_tokens=0)


def stand_in(runs: list[Scenario]) -> _Fuzz:
    """A run whose engine is a function: the failure shows whenever a cancel is among the faults. Nothing
    starts; `runs` collects every scenario run (examples, confirmation, shrinking's re-runs)."""
    fuzz = _Fuzz(Target.reference("simple").build(), FuzzSettings(replays=1, shrink_s=BACKSTOP_S),
                 PROFILES["ci"], BACKSTOP_S, None, None, None)

    def run(scenario: Scenario, fresh: bool = False) -> tuple[Trace, list[Violation]]:
        runs.append(scenario)
        cancelled = any(f.kind == "cancel" for f in scenario.faults)
        return Trace(), [Violation("slot-freed-early", "the slot went first")] if cancelled else []

    fuzz.run = run
    return fuzz


def test_a_failure_is_shrunk_to_hypothesis_s_minimal_one_not_reported_as_met():
    """Hypothesis replays the failure it is about to shrink first; the runner told it again from another
    line than the one that first raised it, Hypothesis took the two for different failures of one example,
    called it flaky, and a seven-request, two-fault scenario was reported for M19 (a GPU run of the
    fuzz-kill test, every shrink since the runner told known failures again)."""
    runs: list[Scenario] = []
    fuzz = stand_in(runs)
    fuzz._round(scenarios(**SHAPES), [], 50, None, True, ("generate",))
    [finding] = fuzz.book.findings.values()
    failure = finding.failure
    met = next(s for s in runs if any(f.kind == "cancel" for f in s.faults))
    assert size(met) > size(failure.scenario), (met.describe(), failure.scenario.describe())
    assert len(failure.scenario.requests) == 1 and [f.kind for f in failure.scenario.faults] == ["cancel"], \
        failure.scenario.describe()
    assert finding.shrunk and "flaky" not in (failure.blob or ""), failure.blob


def test_where_hypothesis_calls_shrinking_flaky_the_smallest_failure_shown_is_reported():
    """A strategy that draws differently once shrinking has made progress (as one steered by what the
    engine showed would): Hypothesis stops at its next new example with a Flaky error that holds no
    failure of ours. The run reports the smallest scenario shown to fail by then, not shrunk, and says why."""
    runs: list[Scenario] = []
    fuzz = stand_in(runs)
    bound = [3]

    @st.composite
    def drifting(draw: st.DrawFn) -> Scenario:
        draw(st.integers(0, bound[0]))
        return draw(scenarios(**SHAPES))

    run = fuzz.run

    def shrinks_then_drifts(scenario: Scenario, fresh: bool = False) -> tuple[Trace, list[Violation]]:
        trace, violations = run(scenario, fresh)
        if violations and fuzz.shrinking is not None and size(scenario) < size(fuzz.shrinking.unshrunk[0]):
            bound[0] = 5  # a smaller failure was shown: the strategy changes under Hypothesis
        return trace, violations

    fuzz.run = shrinks_then_drifts
    fuzz._round(drifting(), [], 50, None, True, ("generate",))
    assert bound == [5], "shrinking never made progress: the test shows nothing"
    [finding] = fuzz.book.findings.values()
    failure = finding.failure
    failed = [s for s in runs if any(f.kind == "cancel" for f in s.faults)]
    assert failure.scenario.dumps() == min(failed, key=size).dumps(), failure.scenario.describe()
    assert size(failure.scenario) < size(failed[0]), (failed[0].describe(), failure.scenario.describe())
    assert not finding.shrunk
    assert "shrinking stopped where Hypothesis called it flaky" in (failure.blob or ""), failure.blob
    assert failure.reproduced == (1, 1), failure.reproduced  # replayed, as any shrunk scenario is
