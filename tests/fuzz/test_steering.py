"""The distances to firing fed to Hypothesis's target phase: each grows as its oracle's window opens, on
hand-built traces, and a real run feeds every label for each example."""

from __future__ import annotations

import math

import hypothesis

from mlx_invariants.fuzz.profiles import SEARCH, STEER, search_phases
from mlx_invariants.fuzz.runner import run_fuzz
from mlx_invariants.fuzz.scenario import At, FaultSpec, RequestSpec, Scenario
from mlx_invariants.fuzz.settings import FuzzSettings
from mlx_invariants.fuzz.target import Target
from mlx_invariants.fuzz.steering import FLOOR, LABELS, distances
from mlx_invariants.fuzz.trace import Event, Trace


def at(*events: tuple[float, dict]) -> Trace:
    """Events at the given times, numbered in the order given."""
    trace = Trace()
    for seq, (t, fields) in enumerate(events, 1):
        trace.events.append(Event(seq=seq, t=t, **fields))
    return trace


def point(name: str, rid: str = "r0", **info) -> dict:
    return {"kind": "point", "name": name, "rid": rid, "info": info}


def request(name: str, rid: str = "r0", **info) -> dict:
    return {"kind": "request", "name": name, "rid": rid, "info": info}


def test_the_slot_release_margin_rises_to_positive_as_the_slot_is_let_go_first():
    late = at((0.0, point("WORKER_STARTED")), (1.0, point("FINISHED")), (1.5, point("SLOT_RELEASED")))
    tight = at((0.0, point("WORKER_STARTED")), (1.0, point("FINISHED")), (1.1, point("SLOT_RELEASED")))
    early = at((0.0, point("WORKER_STARTED")), (0.8, point("SLOT_RELEASED")), (1.0, point("FINISHED")))
    margins = [distances(t)["slot-release-margin"] for t in (late, tight, early)]
    assert margins[0] < margins[1] < 0 < margins[2]


def test_decode_steps_after_a_client_was_hit_are_counted_after_the_fault_only():
    cancel = {"kind": "fault", "name": "cancel", "rid": "r0", "info": {"delivered": True}}
    steps = [(0.1 * i, point("BEFORE_DECODE", step=i)) for i in range(1, 4)]
    assert distances(at(*steps[:1], (0.15, cancel), *steps[1:]))["decode-after-client-left"] == 2
    assert distances(at(*steps, (0.5, cancel)))["decode-after-client-left"] == 0
    missed = {**cancel, "info": {"delivered": False}}
    assert distances(at((0.0, missed), *steps))["decode-after-client-left"] == 0
    gone = {"kind": "check", "name": "compute-after-gone", "info": {"entries": 30, "per_step": 2.0}}
    assert distances(at((0.0, gone)))["decode-after-client-left"] == 15


def test_queue_wait_progress_gap_and_requests_in_flight():
    trace = at((0.0, request("submit", "r0")), (0.0, request("submit", "r1")), (0.1, point("WORKER_STARTED", "r0")),
               (0.2, point("FINISHED", "r0")), (0.2, request("end", "r0")), (0.3, request("submit", "r2")),
               (1.2, point("WORKER_STARTED", "r1")), (1.3, point("FINISHED", "r1")), (1.3, request("end", "r1")))
    found = distances(trace)
    assert math.isclose(found["queue-wait"], 1.2)          # r1 waited behind r0; r2 never started and never ended
    assert math.isclose(found["progress-gap"], 1.0)        # FINISHED r0 at 0.2, next point at 1.2, r1 open
    assert found["in-flight"] == 2                         # r0 and r1; r2 came after r0 ended


def test_an_empty_trace_gives_finite_distances_for_every_label():
    found = distances(Trace())
    assert set(found) == set(LABELS) and all(math.isfinite(v) for v in found.values())
    assert found["slot-release-margin"] == FLOOR


def test_a_run_feeds_every_label_for_each_example_it_generates_or_is_given(monkeypatch, tmp_path):
    """A steered run on the simple reference engine, on a seed (so its round ends in the target phase): each
    example, the given one too, reports every label once through Hypothesis's own `target()` (watched, not
    replaced), and the run ends clean."""
    fed: list[str] = []
    real = hypothesis.target

    def watched(observation, *, label=""):
        fed.append(label)
        return real(observation, label=label)

    monkeypatch.setattr(hypothesis, "target", watched)
    given = Scenario((RequestSpec("r0", 3, 4, True, "chat"),), (FaultSpec("cancel", At("r0", "BEFORE_DECODE", 1)),))
    result = run_fuzz(Target.reference("simple"), FuzzSettings(examples=3, seed=1, steer=True, explicit=(given,),
                                                                 replays=0, debug_run=False, workdir=tmp_path))
    assert result.ok and result.examples == 3, [f.failure.headline for f in result.findings]
    assert sorted(fed) == sorted(LABELS * 3)


def test_a_search_ends_in_the_target_phase_only_when_steered_and_not_derandomized():
    assert search_phases(derandomize=False, replayed=False, steer=True) == SEARCH + (STEER,) == (*SEARCH, "target")
    assert search_phases(derandomize=False, replayed=True, steer=True) == ("explicit", "generate", "target")
    assert search_phases(derandomize=True, replayed=False, steer=True) == SEARCH  # ci draws the same every run
    assert search_phases(derandomize=False, replayed=False) == SEARCH  # off by default
