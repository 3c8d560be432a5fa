"""A run aims its faults only where the target reaches (fuzz/aims.py): the points its adapter declares, else
those its baseline reached, else all; and it records them, so a run started from what it wrote draws the same."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from mlx_invariants.fuzz.adapters.base import points_of
from mlx_invariants.fuzz.aims import Aims, aims_for
from mlx_invariants.fuzz.errors import TargetError
from mlx_invariants.fuzz.pace import gone_budget
from mlx_invariants.fuzz.runner import Phase, Progress, run_fuzz
from mlx_invariants.fuzz.scenario import POINTS
from mlx_invariants.fuzz.settings import FuzzSettings
from mlx_invariants.fuzz.strategies import SHORT_TOKENS
from mlx_invariants.fuzz.target import Target

from tests.fuzz.toy_adapter import ToyAdapter

FACTORY = Target.module_factory("pkg.mod:make")
CLIENT = ("ADMITTED", "CHUNK_SENT")  # all the toy engine's adapter marks


def make_declaring() -> ToyAdapter:
    """The toy engine's adapter declaring one of the two points it marks: faults aim at that one alone."""
    adapter = ToyAdapter("drain")
    adapter.points = ("CHUNK_SENT",)
    return adapter


def test_a_run_aims_where_the_adapter_declares_else_where_the_baseline_reached_else_everywhere():
    reached = {"FINISHED", "CHUNK_SENT", "ADMITTED"}
    assert aims_for(FACTORY, ("CHUNK_SENT", "ADMITTED"), reached) == Aims(CLIENT, "declared")
    assert aims_for(FACTORY, None, reached) == Aims(("ADMITTED", "CHUNK_SENT", "FINISHED"), "reached")  # POINTS' order
    assert aims_for(FACTORY, None, set()) == Aims(POINTS, "all")
    # Points the target was given (a test's, or those a run recorded) are kept as they are.
    given = replace(FACTORY, points=("ADMITTED",))
    assert given.points_given and not FACTORY.points_given
    assert aims_for(given, ("CHUNK_SENT",), {"CHUNK_SENT"}) == Aims(("ADMITTED",), "given")


def test_a_server_is_aimed_at_every_point_its_client_marks_and_a_served_route_keeps_its_clients():
    """A server's points are all the fuzzer's HTTP client's: SERVER_STEP comes only while a response is awaited,
    which a streaming follow-up need not do, so the baseline cannot say a server never reaches it. A served
    route's engine points narrow as an in-process engine's do; its client's BODY_PART stays."""
    server = Target.server("serve --port {port}")
    assert aims_for(server, None, {"ADMITTED", "CHUNK_SENT"}) == Aims(server.points, "client")
    served = Target.served("simple")
    assert aims_for(served, None, {"ADMITTED", "FINISHED"}) == Aims(("ADMITTED", "FINISHED", "BODY_PART"), "reached")
    assert aims_for(served, None, {"BODY_PART"}) == Aims(served.points, "all")  # no engine point reached


def test_an_adapter_declaring_a_point_that_does_not_exist_is_a_setup_mistake():
    adapter = ToyAdapter("plain")
    assert points_of(adapter) is None
    adapter.points = ("ADMITTED", "SOMEWHERE")
    with pytest.raises(TargetError, match="points must name some of"):
        points_of(adapter)


DRAIN = replace(Target.module_factory("tests.fuzz.toy_adapter:make_drain"), fault_kinds=("cancel", "disconnect"))


def _run(target: Target, seed: int = 3) -> tuple:
    """A short run of `target` on `seed`: its result and every scenario it generated, as described, with a
    gone client's long budget (its value follows the pace measured, `gone_budget`) as "m+"."""
    seen: list[str] = []

    def progress(state: Progress) -> None:
        if state.phase is Phase.GENERATE:
            seen.append(re.sub(r"\bm(\d+)", lambda m: "m+" if int(m[1]) > SHORT_TOKENS else m[0], state.scenario))

    settings = FuzzSettings(examples=12, seed=seed, explicit=(), debug_run=False, replays=0)
    return run_fuzz(target, settings, progress=progress), seen


def _aimed(described: list[str]) -> set[str]:
    return set(re.findall(r"@([A-Z_]+)", " ".join(described)))


@pytest.mark.parametrize("factory, points, source", [("toy_adapter:make_drain", CLIENT, "reached"),
                                                     ("test_aims:make_declaring", ("CHUNK_SENT",), "declared")])
def test_generated_faults_aim_only_where_the_engine_reaches(factory: str, points: tuple, source: str):
    """A module factory's target takes every point, but the toy engine reaches two: before, most of its
    scenarios aimed at points it never reaches and ran fault-free."""
    result, seen = _run(replace(DRAIN, name=f"tests.fuzz.{factory}"))
    assert result.ok and result.aims == Aims(points, source, gone_budget(result.pace))
    assert result.target.points == points and _aimed(seen) and _aimed(seen) <= set(points), seen


def test_a_run_started_from_the_target_a_run_recorded_draws_the_same_scenarios():
    """The recorded target (a case file's, summary.json's) names the points aimed at: a run from it keeps them
    (given), so the same seed draws the same scenarios whatever its own baseline reached."""
    first, seen = _run(DRAIN)
    recorded = Target.from_dict(first.target.to_dict())
    again, seen_again = _run(recorded)
    assert first.ok and again.aims == replace(first.aims, source="given", gone_tokens=again.aims.gone_tokens)
    assert len(seen) == 12 and seen_again == seen
