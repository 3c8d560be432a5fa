"""Scenarios draw past the capacity the engine reports (or `--capacity` gives), and the run says which
capacity it used and where it came from; where none is known, the profile's number of requests."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Optional

import pytest
from hypothesis import HealthCheck, given, settings

from mlx_invariants.cli import main
from mlx_invariants.engine.base import EngineConfig
from mlx_invariants.fuzz.adapters.base import capacity_of
from mlx_invariants.fuzz.errors import TargetError
from mlx_invariants.fuzz.profiles import MOST_REQUESTS, PAST_CAPACITY, PROFILES, Requests, requests_for
from mlx_invariants.fuzz.runner import FuzzResult, Progress, run_fuzz
from mlx_invariants.fuzz.scenario import Scenario
from mlx_invariants.fuzz.settings import FuzzSettings
from mlx_invariants.fuzz.strategies import scenarios
from mlx_invariants.fuzz.target import Target, TargetKind
from tests.conftest import BACKSTOP_S
from tests.fuzz import toy_adapter

CI = PROFILES["ci"]
SMALL = 2  # what the toy engine below says it holds at once: well under the ci profile's own number


def make_small() -> toy_adapter.ToyAdapter:
    """The fixed toy engine, saying it holds two requests at once."""
    adapter = toy_adapter.make_drain()
    adapter.capacity = lambda: SMALL  # type: ignore[attr-defined]
    return adapter


def _fuzz(factory: str, capacity: Optional[int] = None, report_dir: Optional[Path] = None,
          examples: int = 20) -> tuple[FuzzResult, int]:
    """A short run on the toy engine; also the most requests any scenario it ran had."""
    most = [0]

    def progress(state: Progress) -> None:
        most[0] = max(most[0], len(re.findall(r"\br\d+\(", state.scenario.split("]")[0])))
    target = Target(TargetKind.FACTORY, factory, fault_kinds=("cancel",), points=("ADMITTED", "CHUNK_SENT"))
    result = run_fuzz(target, FuzzSettings(examples=examples, budget_s=BACKSTOP_S, explicit=(), replays=0,
                                           debug_run=False, capacity=capacity, report_dir=report_dir),
                      progress=progress)
    return result, most[0]


def test_the_capacity_the_engine_reports_is_drawn_past(tmp_path: Path):
    result, most = _fuzz("tests.fuzz.test_capacity:make_small", report_dir=tmp_path)
    assert result.requests == Requests(SMALL + PAST_CAPACITY, SMALL, "engine")
    assert SMALL < most <= SMALL + PAST_CAPACITY, most
    summary = json.loads(next(tmp_path.glob("*/summary.json")).read_text())
    assert summary["requests"] == {"most": SMALL + PAST_CAPACITY, "capacity": SMALL, "source": "engine"}
    assert "capacity 2, read from the engine" in next(tmp_path.glob("*/summary.md")).read_text()


def test_a_given_capacity_overrides_the_engines():
    result, most = _fuzz("tests.fuzz.test_capacity:make_small", capacity=1, examples=10)
    assert result.requests == Requests(1 + PAST_CAPACITY, 1, "given")
    assert most <= 1 + PAST_CAPACITY


def test_an_engine_that_says_nothing_gets_the_profiles_number():
    result, _ = _fuzz("tests.fuzz.toy_adapter:make_drain", examples=3)
    assert result.requests == Requests(CI.max_requests, None, "unknown")
    assert "capacity unknown" in result.requests.describe()


def test_the_reference_engine_reports_its_slot_and_queue():
    result = run_fuzz(Target.reference("simple"), FuzzSettings(examples=1, budget_s=BACKSTOP_S, explicit=(), replays=0,
                                                                debug_run=False))
    assert result.requests == Requests(1 + 4 + PAST_CAPACITY, 1 + 4, "engine")  # one slot, a queue of four


def test_a_large_capacity_is_drawn_past_only_up_to_the_cap():
    assert requests_for(CI, None, 100) == Requests(MOST_REQUESTS, 100, "engine")
    assert requests_for(CI, 3, 100) == Requests(3 + PAST_CAPACITY, 3, "given")


def test_the_batched_reference_engine_is_drawn_past_its_capacity_of_dozens():
    result = run_fuzz(Target.reference("batched"), FuzzSettings(examples=1, budget_s=BACKSTOP_S, explicit=(),
                                                                 replays=0, debug_run=False))
    batched = EngineConfig()  # eight seats and sixteen waiting for one
    assert result.requests == Requests(batched.max_batch + batched.max_batch_queue + PAST_CAPACITY,
                                       batched.max_batch + batched.max_batch_queue, "engine")
    assert result.requests.most > 16  # the old cap, under which this engine was never drawn past


def test_only_a_target_holding_more_than_the_profile_draws_is_filled_now_and_then():
    assert requests_for(CI, None, 24).crowd(CI.max_requests) == 25
    assert requests_for(CI, None, CI.max_requests - 1).crowd(CI.max_requests) == 0  # lists reach it themselves
    assert requests_for(CI, None, None).crowd(CI.max_requests) == 0


def test_a_crowd_fills_past_the_capacity_now_and_then_and_no_fault_aims_at_it():
    crowd, most = 25, 26
    drawn: list[Scenario] = []

    @settings(max_examples=120, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    @given(scenarios(max_requests=most, crowd=crowd))
    def draw(scenario: Scenario) -> None:
        drawn.append(scenario)

    draw()
    sizes = [len(s.requests) for s in drawn]
    filled = [s for s in drawn if len(s.requests) >= crowd]
    assert max(sizes) <= most and 0.04 < len(filled) / len(drawn) < 0.5, sizes
    assert sorted(sizes)[len(sizes) // 2] < 10  # most scenarios stay small
    for scenario in filled:  # the drawn requests are fewer than `crowd`: from r24 on, every one is the crowd's
        aimed = {f.at.rid for f in scenario.faults} | {f.rid for f in scenario.faults if f.rid}
        crowd_only = scenario.requests[crowd - 1:]
        assert not aimed & {r.rid for r in crowd_only}, scenario.describe()
        assert all(r.arrival is None for r in crowd_only), scenario.describe()


class _Says:
    name = "says"

    def __init__(self, value: object):
        self.capacity = lambda: value


@pytest.mark.parametrize("value", [0, -1, 2.5, "4", True])
def test_an_adapter_capacity_that_is_no_count_is_a_setup_error(value: object):
    with pytest.raises(TargetError, match="capacity"):
        capacity_of(_Says(value))


def test_an_adapter_may_give_its_capacity_as_an_attribute_or_not_at_all():
    assert capacity_of(type("A", (), {"capacity": 3})()) == 3
    assert capacity_of(_Says(None)) is None
    assert capacity_of(object()) is None


@pytest.mark.parametrize("argv, message", [
    (["--capacity", "0"], "capacity must be a positive number"),
    (["--capacity", "-3", "--engine", "batched"], "capacity must be a positive number"),
    (["--capacity", "4", "--exhaustive"], "--capacity applies to a search"),
    (["--capacity", "4", "--replay", "scenario.json"], "--capacity applies to a search"),
])
def test_a_bad_capacity_is_a_usage_error(argv: list[str], message: str, capsys):
    assert main(["fuzz", *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_capacity_that_is_no_number_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["fuzz", "--capacity", "many"])
    assert exit_.value.code == 2
    assert "--capacity" in capsys.readouterr().err


def test_the_capacity_travels_to_child_processes():
    settings = FuzzSettings(capacity=3)
    assert FuzzSettings.from_dict(json.loads(json.dumps(settings.to_dict()))).capacity == 3


def test_the_summary_line_says_which_capacity_was_used(tmp_path: Path, capsys):
    assert main(["fuzz", "--engine", "simple", "--capacity", "3", "--examples", "2", "--budget", str(BACKSTOP_S),
                 "--jobs", "0", "--report", str(tmp_path)]) == 0
    assert "up to 5 requests per scenario (capacity 3, given with --capacity)" in capsys.readouterr().out
