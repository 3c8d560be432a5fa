"""Engine reuse: scenarios share one started engine while they leave it clean, and everything an engine
does wrong is still judged against the scenario that did it, on a fresh engine before it is believed."""

from __future__ import annotations

import argparse

import pytest

from mlx_invariants.commands import fuzz as command
from mlx_invariants.fuzz.followup import FollowupOutcome
from mlx_invariants.fuzz.adapters.reference import ReferenceAdapter, StreamHandle, reference_engine
from mlx_invariants.fuzz.oracles import judge
from mlx_invariants.fuzz.runner import run_fuzz
from mlx_invariants.fuzz.scenario import At, FaultSpec, RequestSpec, Scenario
from mlx_invariants.fuzz.sentinel import Sentinel
from mlx_invariants.fuzz.session import EngineSession
from mlx_invariants.fuzz.settings import FuzzSettings
from mlx_invariants.fuzz.strategies import scenarios
from mlx_invariants.fuzz.target import Target
from tests.conftest import BACKSTOP_S

CLEAN = Scenario((RequestSpec("r0", 3, 3, True),))
SHUTDOWN = Scenario((RequestSpec("r0", 3, 4, True),), (FaultSpec("shutdown", At("r0", "BEFORE_DECODE", 1)),))


@pytest.fixture
def sentinel():
    installed = Sentinel().install()
    yield installed
    installed.uninstall()


@pytest.fixture
def session(sentinel):
    opened = EngineSession(reference_engine("simple"), sentinel)
    yield opened
    opened.close()


def _expected(session: EngineSession) -> FollowupOutcome:
    return FollowupOutcome.of_trace(session.run(Scenario(())))


def test_clean_scenarios_run_one_after_another_on_one_engine(session):
    expected = _expected(session)
    traces = [session.run(CLEAN, expected) for _ in range(3)]
    assert [t.meta["reused"] for t in traces] == [1, 2, 3]
    assert session.starts == 1
    assert all(judge(t) == [] for t in traces), [judge(t) for t in traces]
    assert all(t.first("check", "followup") is not None for t in traces)  # every one still gets its follow-up


class _LeakyHandle(StreamHandle):
    async def close(self) -> None:
        pass  # never closes the stream: the engine keeps the slot and the request


class _LeakyAdapter(ReferenceAdapter):
    """Leaks the slot of any request whose id starts with "leak"."""

    async def submit(self, spec):
        handle = await super().submit(spec)
        return _LeakyHandle(handle.stream) if spec.rid.startswith("leak") else handle


def test_a_leak_is_judged_against_the_scenario_that_leaked_and_the_next_one_starts_fresh(sentinel):
    session = EngineSession(lambda: _LeakyAdapter(reference_engine("simple")().factory), sentinel)
    try:
        expected = _expected(session)
        before = session.run(CLEAN, expected)
        leaky = session.run(Scenario((RequestSpec("leak0", 3, 2, True),)), expected)
        after = session.run(CLEAN, expected)
    finally:
        session.close()
    assert judge(before) == [] and before.meta["reused"] == 1
    assert leaky.meta["reused"] == 2
    assert "slot-leaked" in [v.kind for v in judge(leaky)], judge(leaky)
    assert after.meta["reused"] == 0 and judge(after) == [], judge(after)
    assert session.starts == 2


def test_a_shutdown_fault_ends_the_engine_and_the_next_scenario_starts_a_fresh_one(session):
    expected = _expected(session)
    shut = session.run(SHUTDOWN, expected)
    after = session.run(CLEAN, expected)
    assert shut.first("fault", "shutdown") is not None and judge(shut) == []
    assert shut.first("check", "loop-lag") is not None
    assert after.meta["reused"] == 0 and judge(after) == []


def test_closing_a_kept_engine_runs_the_after_shutdown_checks(session):
    expected = _expected(session)
    session.run(CLEAN, expected)
    teardown = session.close()
    assert teardown is not None and teardown.meta["after"] == CLEAN.to_json()
    assert judge(teardown) == [] and teardown.first("check", "status") is not None
    assert session.close() is None  # nothing kept any more


class NeverStops(ReferenceAdapter):
    """An engine whose shutdown returns without stopping it: its owner thread outlives it."""

    left: list = []

    async def shutdown(self) -> None:
        NeverStops.left.append(self)


def never_stops() -> NeverStops:
    """The module factory the next test fuzzes, as `--engine tests.fuzz.test_session:never_stops` would."""
    return NeverStops(reference_engine("simple")().factory)


def test_a_leak_only_shutdown_shows_is_reported_against_the_last_scenario():
    try:
        result = run_fuzz(Target.module_factory(f"{__name__}:never_stops"),
                          FuzzSettings(examples=3, budget_s=BACKSTOP_S, explicit=(), debug_run=False, replays=1),
                          strategy=scenarios(kinds=("cancel",)))
    finally:
        for adapter in NeverStops.left:
            adapter.engine._owner.stop()
    assert result.failure is not None and result.failure.violations[0].kind == "thread-leaked"
    assert "shut down after this scenario" in result.failure.blob
    assert result.failure.scenario.requests, "reported against a scenario the run generated"
    assert result.failure.reproduced[0] == 1  # a fresh engine shut down after it leaks the same thread


@pytest.mark.parametrize("reuse", [True, False])
def test_reuse_starts_few_engines_and_the_fresh_mode_one_per_scenario(reuse):
    result = run_fuzz(Target.reference("simple"), FuzzSettings(examples=12, budget_s=BACKSTOP_S, explicit=(),
                                                                debug_run=False, reuse=reuse))
    assert result.ok, result.failure.headline
    if reuse:
        assert result.engines_started < result.examples / 2, result.engines_started
    else:
        assert result.engines_started == result.examples + 1  # and the baseline


def test_fresh_engine_flag_reaches_the_runner():
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    assert command.settings_of(parser.parse_args(["--fresh-engine"])).reuse is False
    assert command.settings_of(parser.parse_args([])).reuse is None
