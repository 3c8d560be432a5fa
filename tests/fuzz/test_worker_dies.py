"""The "worker-dies" fault: an exception escapes the engine's owner/generation thread and kills it. Every
request in flight must then end and every new one be refused or fail; an engine that goes on taking work
it can never do hangs them, which `hang-after-worker-death` reports."""

from __future__ import annotations

import pytest

from mlx_invariants.fuzz.adapters.reference import reference_engine
from mlx_invariants.fuzz.followup import FollowupOutcome
from mlx_invariants.fuzz.oracles import judge
from mlx_invariants.fuzz.scenario import At, FaultSpec, RequestSpec, Scenario
from mlx_invariants.fuzz.session import run_scenario

from tests.fuzz import dead_owner_engine

# r0 streams and its worker dies at a drawn worker-side point; r1 is sent once r0's work is over.
def _dies_at(point: str, index: int = 0) -> Scenario:
    return Scenario((RequestSpec("r0", 3, 6, True), RequestSpec("r1", 2, 3, False, arrival=At("r0", "FINISHED"))),
                    (FaultSpec("worker-dies", At("r0", point, index)),))


AIMS = [("WORKER_STARTED", 0), ("PREFILL_DONE", 0), ("BEFORE_DECODE", 2)]


def _followup(factory) -> FollowupOutcome:
    return FollowupOutcome.of_trace(run_scenario(factory, Scenario(())))


@pytest.mark.parametrize("route", ["simple", "batched"])
@pytest.mark.parametrize("point, index", AIMS)
def test_a_reference_engine_ends_or_refuses_everything_once_its_worker_died(route: str, point: str, index: int):
    factory = reference_engine(route)
    trace = run_scenario(factory, _dies_at(point, index), expected_followup=_followup(factory))
    assert judge(trace) == [], judge(trace)
    assert trace.first("fault", "worker-dies") is not None
    ends = {e.rid: e.info for e in trace.of("request", "end")}
    assert ends["r0"]["outcome"] == "error", ends
    assert ends["followup"]["outcome"] == "refused" and ends["followup"]["code"] == "engine_dead", ends


@pytest.mark.parametrize("point, index", AIMS[:1] + AIMS[2:])
def test_an_engine_deaf_to_its_dead_worker_is_found(point: str, index: int):
    factory = dead_owner_engine.make_deaf
    kinds = [v.kind for v in judge(run_scenario(factory, _dies_at(point, index), expected_followup=_followup(factory)))]
    assert kinds[:1] == ["hang-after-worker-death"], kinds


def test_worker_dies_is_drawn_only_when_asked_for(capsys):
    """A default run never kills an engine's worker: an engine may fairly not be built to survive that,
    so `--faults` (or `Target(fault_kinds=...)`) asks for it; a server at a URL, with no sentinel of ours
    inside, cannot take it (a launched one can: tests/fuzz/test_server_worker_faults.py)."""
    import argparse

    from mlx_invariants.cli import main
    from mlx_invariants.commands.fuzz import add_arguments, target_of
    from mlx_invariants.fuzz.scenario import DEFAULT_KINDS, OPT_IN_KINDS
    from mlx_invariants.fuzz.target import Target

    assert "worker-dies" in OPT_IN_KINDS and "worker-dies" not in DEFAULT_KINDS
    assert "worker-dies" not in Target.engine("tests.fuzz.dead_owner_engine:make_deaf").fault_kinds
    assert "worker-dies" not in Target.reference("batched").fault_kinds
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    asked = target_of(parser.parse_args(["--engine", "batched", "--faults", "worker-dies,cancel"]))
    assert asked.fault_kinds == ("worker-dies", "cancel")
    assert main(["fuzz", "--engine", "batched", "--faults", "worker-dies,nap"]) == 2
    assert "--faults: nap; choose from " in capsys.readouterr().err
    assert main(["fuzz", "--url", "http://127.0.0.1:9", "--faults", "worker-dies"]) == 2
    assert "an HTTP target takes the fault kinds" in capsys.readouterr().err


@pytest.mark.parametrize("route", ["simple", "batched"])
def test_a_worker_that_dies_during_the_shutdowns_grace_ends_what_it_held_at_once(route: str, tmp_path):
    """Found on this box (runner profile, every fault kind): the owner died while a shutdown was waiting out its
    grace, and the engine, reading the death as the shutdown's own stop, left r2 waiting through the grace
    periods for a thread that was gone (4 s). Replayed as the fuzzer replays it (a baseline first)."""
    from mlx_invariants.fuzz.case import dumps_case
    from mlx_invariants.fuzz.replay import replay
    from mlx_invariants.fuzz.target import Target

    scenario = Scenario((RequestSpec("r0", 6, 8, True), RequestSpec("r1", 11, 5, False),
                         RequestSpec("r2", 296, 9, False, route="chat")),
                        (FaultSpec("shutdown", At("r2", "SLOT_ACQUIRED")), FaultSpec("worker-dies", At("r2", "PREFILL_DONE"))),
                        "alternate")
    target = Target.reference(route)
    case = tmp_path / "scenario.json"
    case.write_text(dumps_case(scenario, target))
    replayed = replay(case, target)
    assert replayed.reproduced == 0, replayed.runs
