"""The timeline picture of a finding: valid standalone SVG, a lane per request and per thread, a mark per
MLX entry (the overlapping ones marked as such), written beside every report."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from mlx_invariants.fuzz.oracles import judge
from mlx_invariants.fuzz.report import Failure, write_report
from mlx_invariants.fuzz.scenario import At, FaultSpec, RequestSpec, Scenario
from mlx_invariants.fuzz.target import Target
from mlx_invariants.fuzz.timeline import timeline_svg
from mlx_invariants.fuzz.trace import Event, Trace

SVG = "{http://www.w3.org/2000/svg}"
OWNER, LOOP, WORKER = (1, "mlx-owner-simple"), (2, "MainThread"), (3, "pool <worker> & co")
SCENARIO = Scenario((RequestSpec("r0", 2, 3, True), RequestSpec("r1", 2, 3, False)),
                    (FaultSpec("cancel", At("r0", "ADMITTED", 0)),))


def racing_trace() -> Trace:
    """Two requests; a pool thread enters MLX (#9..#11) while the owner is inside MLX for r1 (#8..#14)."""
    script = [  # (seq, end of a span, kind, name, rid, thread, info)
        (1, 3, "mlx", "core.eval", None, OWNER, {}),
        (2, None, "request", "submit", "r0", LOOP, {}),
        (4, None, "request", "submit", "r1", LOOP, {}),
        (5, None, "point", "ADMITTED", "r0", LOOP, {}),
        (6, None, "fault", "cancel", "r0", LOOP, {"delivered": True}),
        (7, None, "point", "WORKER_STARTED", "r1", WORKER, {}),
        (8, 14, "mlx", "generate.stream_generate", None, OWNER, {}),
        (9, 11, "mlx", "core.eval", None, WORKER, {"off_owner": True}),
        (10, None, "mlx-error", "no-stream", None, WORKER, {"target": "core.eval", "message": "There is no Stream"}),
        (12, None, "request", "end", "r0", LOOP, {"outcome": "cancelled"}),
        (13, None, "request", "end", "r1", LOOP, {"outcome": "completed"}),
        (15, None, "check", "status", None, LOOP, {"active": 0}),
    ]
    trace = Trace()
    for seq, end, kind, name, rid, (token, thread_name), info in script:
        trace.events.append(Event(seq, kind, name, rid, token, thread_name, seq / 1000, end, info,
                                  t_end=end / 1000 if end else None))
    return trace


def lanes(root: ET.Element) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for group in root.iter(f"{SVG}g"):
        if group.get("class") == "lane":
            found.setdefault(group.get("data-kind", ""), []).append(group.get("data-name", ""))
    return found


def mlx_marks(root: ET.Element) -> list[ET.Element]:
    """The MLX bars in the lanes (the legend's samples have no sequence number)."""
    return [e for e in root.iter(f"{SVG}rect") if "mlx" in e.get("class", "").split() and e.get("data-seq")]


def test_the_svg_has_a_lane_per_request_and_thread_and_a_mark_per_mlx_entry() -> None:
    trace = racing_trace()
    assert [v.kind for v in judge(trace) if v.kind.startswith("mlx")], "the hand-built trace must race"
    root = ET.fromstring(timeline_svg(trace, "mlx-concurrent: <two threads>", ["scenario: " + SCENARIO.describe()]))
    assert root.tag == f"{SVG}svg"
    found = lanes(root)
    assert found["request"] == ["request r0", "request r1"]
    assert sorted(found["thread"]) == sorted(f"thread #{token} {name}" for token, name in (OWNER, LOOP, WORKER))
    assert found["run"] == ["run: checks, errors"]
    marks = mlx_marks(root)
    assert sorted(int(m.get("data-seq")) for m in marks) == sorted(e.seq for e in trace.of("mlx"))
    concurrent = {int(m.get("data-seq")) for m in marks if "concurrent" in m.get("class").split()}
    assert concurrent == {e.seq for pair in trace.overlapping("mlx") for e in pair} and concurrent
    assert any("off-owner" in m.get("class").split() for m in marks)
    assert any(r.get("class") == "overlap" for r in root.iter(f"{SVG}rect")), "the overlap band is missing"
    in_lanes = [mark for group in root.iter(f"{SVG}g") if group.get("class") == "lane" for mark in group]
    assert sum(1 for mark in in_lanes if mark.get("class") == "fault") == 1


def test_a_servers_merged_events_get_lanes_of_their_own() -> None:
    trace = Trace()
    trace.record("request", "submit", "r0")  # this thread, as the client
    server = [Event(1, "mlx", "core.eval", None, 1, "MainThread", 0.5, 2, {"off_owner": True}, t_end=0.6),
              Event(3, "mlx", "core.eval", None, 1, "MainThread", 0.7, 4, {}, t_end=0.8)]
    trace.merge(server)  # the same thread number and name in the server's process
    root = ET.fromstring(timeline_svg(trace))
    client = f"thread #{trace.events[0].thread} {trace.events[0].thread_name}"
    assert sorted(lanes(root)["thread"]) == sorted([client, "[server] thread #1 MainThread"])
    assert len(mlx_marks(root)) == 2
    assert "merged after the scenario" in ET.tostring(root, encoding="unicode")


def test_a_long_trace_stays_a_readable_width() -> None:
    trace = Trace()
    for seq in range(1, 3001):
        trace.events.append(Event(seq, "point", "BEFORE_DECODE", "r0", 1, "mlx-owner", seq / 1000, info={"step": seq}))
    root = ET.fromstring(timeline_svg(trace))
    assert float(root.get("width")) < 3400
    assert lanes(root) == {"request": ["request r0"], "thread": ["thread #1 mlx-owner"]}


def test_every_report_has_its_timeline_beside_it(tmp_path: Path) -> None:
    trace = racing_trace()
    failure = Failure(SCENARIO, trace, judge(trace), Target.reference("simple"), seed="1")
    folder = write_report(tmp_path, failure)
    root = ET.parse(folder / "timeline.svg").getroot()
    assert len(mlx_marks(root)) == len(trace.of("mlx"))
    assert failure.violations[0].kind in (root.findtext(f"{SVG}title") or "")


def test_an_empty_trace_and_a_request_seen_only_in_a_lock_event_still_draw() -> None:
    assert lanes(ET.fromstring(timeline_svg(Trace()))) == {}
    trace = Trace()
    trace.events.append(Event(1, "lock", "reentered", "r5", 1, "MainThread", 0.0))
    assert lanes(ET.fromstring(timeline_svg(trace))) == {"run": ["run: checks, errors"]}
