"""A finding's trace as a picture: one lane per request and per thread, so the overlap is seen, not read.

`timeline_svg(trace)` returns a standalone SVG (text written here, no drawing
library). The horizontal axis is the trace's sequence numbers, which order
events exactly across threads (clocks do not); the ticks also give the time
in ms. Request lanes show each request from submit to end, its points (dots)
and the faults aimed at it (red diamonds); thread lanes show every MLX entry
as a bar from entry to exit (orange: off the owner; red: while another thread
was inside MLX, with a red band across the lanes where the two overlap) and
the points that thread passed (ticks). A top lane holds the run's checks and
errors. A server's threads (events merged from its process) get lanes of
their own, marked [server]: they are numbered after the scenario's events, so
only their order among themselves is exact. Every mark has a tooltip with its
full event line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Sequence
from xml.sax.saxutils import escape, quoteattr

from mlx_invariants.fuzz.trace import Event, Trace

LABEL_W = 270        # the lane-name column
LANE_H = 36
TOP = 70             # title and notes above the lanes
CHAR_W = 6.6         # monospace advance at font-size 11
SMALL_CHAR_W = 5.4   # at font-size 9
MAX_W = 1400         # the drawing area aims at this width; longer traces get 1px per event
OUTCOME_FILL = {"completed": "#cfe8cf", "cancelled": "#e2e2e2", "aborted": "#e2e2e2", "refused": "#f6dca8",
                "error": "#f4c4c4"}
STYLE = """
  text { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 11px; fill: #222; }
  .small { font-size: 9px; fill: #555; }
  .title { font-size: 13px; font-weight: bold; }
  .lane-bg { fill: #f7f7f7; } .lane-bg.odd { fill: #ffffff; }
  .axis { stroke: #bbb; stroke-width: 1; } .grid { stroke: #e4e4e4; stroke-width: 1; }
  .mlx { fill: #3b6fc2; } .mlx.off-owner { fill: #e8912d; } .mlx.concurrent { fill: #d22f2f; }
  .overlap { fill: #d22f2f; fill-opacity: 0.13; }
  .point { fill: #333; } .tick { stroke: #888; stroke-width: 1; } .tick.fault { stroke: #d22f2f; stroke-width: 2; }
  .fault { fill: #d22f2f; } .fault-label { fill: #d22f2f; font-weight: bold; }
  .check { fill: #999; } .error { fill: none; stroke: #111; stroke-width: 2.5; }
"""


@dataclass
class _Lane:
    label: str
    kind: str                 # request | thread | run
    events: list[Event] = field(default_factory=list)


def timeline_svg(trace: Trace, title: str = "", notes: Sequence[str] = ()) -> str:
    """The SVG text for `trace`; `title` (e.g. the headline) and `notes` (e.g. the scenario) head it."""
    events = sorted(trace.events, key=lambda e: e.seq)
    last = max([e.seq for e in events] + [e.end for e in events if e.end is not None] + [1])
    step = max(1.0, min(24.0, MAX_W / last))
    lanes = _lanes(trace, events)
    legend, legend_w = _legend(TOP - 8)
    width = max(LABEL_W + last * step + 40, legend_w)
    height = TOP + LANE_H * len(lanes) + 44
    concurrent = {id(e) for pair in trace.overlapping("mlx") for e in pair}
    x = _Scale(step)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
           f'viewBox="0 0 {width:.0f} {height:.0f}">',
           f"<title>{escape(title or 'fuzz timeline')}</title>", f"<style>{STYLE}</style>",
           f'<rect width="{width:.0f}" height="{height:.0f}" fill="#ffffff"/>',
           f'<text class="title" x="8" y="18">{escape(_clip(title or "fuzz timeline", width - 16, 8.0))}</text>']
    if trace.meta.get("merged"):
        notes = [*notes[:1], "[server] lanes: the server's own events, merged after the scenario's: ordered exactly "
                             "among themselves, not against the lanes above"]
    for number, note in enumerate(notes[:2]):
        out.append(f'<text x="8" y="{34 + 14 * number}">{escape(_clip(note, width - 16, CHAR_W))}</text>')
    out.extend(legend)
    bottom = TOP + LANE_H * len(lanes)
    out.extend(_axis([e for e in events if not _merged(trace, e)], last, x, bottom))
    for index, lane in enumerate(lanes):
        top = TOP + LANE_H * index
        out.append(f'<g class="lane" data-kind="{lane.kind}" data-name={quoteattr(lane.label)}>')
        out.append(f'<rect class="lane-bg{" odd" if index % 2 else ""}" x="0" y="{top}" width="{width:.0f}" '
                   f'height="{LANE_H}"/>')
        out.append(f'<text x="8" y="{top + 22}">{escape(_clip(lane.label, LABEL_W - 14, CHAR_W))}</text>')
        draw = {"request": _request_marks, "thread": _thread_marks, "run": _run_marks}[lane.kind]
        out.extend(draw(lane, top, x, last, concurrent))
        out.append("</g>")
    for first, second in trace.overlapping("mlx"):  # over the lanes, translucent
        end = min(n for n in (first.end, second.end, last) if n is not None)
        out.append(f'<rect class="overlap" x="{x(second.seq):.1f}" y="{TOP}" '
                   f'width="{max(x(end) - x(second.seq), 2):.1f}" height="{bottom - TOP}">'
                   f'<title>{escape(f"#{second.seq}..#{end}: two threads inside MLX")}</title></rect>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write_timeline(path: str | Path, trace: Trace, title: str = "", notes: Sequence[str] = ()) -> Path:
    """Write `timeline_svg(trace, title, notes)` to `path`; returns it."""
    path = Path(path)
    path.write_text(timeline_svg(trace, title, notes))
    return path


class _Scale:
    """Sequence number to x."""

    def __init__(self, step: float):
        self.step = step

    def __call__(self, seq: float) -> float:
        return LABEL_W + (seq - 0.5) * self.step


def _lanes(trace: Trace, events: list[Event]) -> list[_Lane]:
    """The run lane (if it has events), then requests and threads, each in order of first appearance;
    a server's threads (events merged from its process, `Trace.merge`) get lanes of their own, marked
    [server]."""
    run = _Lane("run: checks, errors", "run")
    first_seen: dict[str | None, int] = {}
    for event in events:
        first_seen.setdefault(event.rid, event.seq)
    requests = {rid: _Lane(f"request {rid}", "request") for rid in sorted(trace.rids(), key=first_seen.get)}
    threads: dict[tuple, _Lane] = {}
    for event in events:
        if event.rid in requests and event.kind in ("request", "point", "fault", "stale"):
            requests[event.rid].events.append(event)
        if event.kind in ("check", "loop", "log", "lock", "engine"):  # engine: stopped and restarted
            run.events.append(event)
        elif event.thread or event.thread_name:
            server = _merged(trace, event)
            key = (server, event.thread, event.thread_name)
            label = f"{'[server] ' if server else ''}thread #{event.thread} {event.thread_name}"
            threads.setdefault(key, _Lane(label, "thread")).events.append(event)
    return [lane for lane in [run, *requests.values(), *threads.values()] if lane.events]


def _merged(trace: Trace, event: Event) -> bool:
    """Whether `event` came from another process (`Trace.merge`): its time is that process's clock."""
    return any(first <= event.seq <= last for first, last in trace.meta.get("merged", ()))


def _request_marks(lane: _Lane, top: int, x: _Scale, last: int, concurrent: set) -> Iterable[str]:
    """The request's bar (submit to end, coloured by outcome), its points with labels above, faults below."""
    submit = next((e for e in lane.events if e.kind == "request" and e.name == "submit"), None)
    end = next((e for e in lane.events if e.kind == "request" and e.name == "end"), None)
    start_seq = submit.seq if submit else lane.events[0].seq
    end_seq = end.seq if end else last
    outcome = str(end.info.get("outcome", "")) if end else "unfinished"
    fill = OUTCOME_FILL.get(outcome, "#f4c4c4")
    yield (f'<rect class="request" x="{x(start_seq):.1f}" y="{top + 13}" '
           f'width="{max(x(end_seq) - x(start_seq), 2):.1f}" height="12" rx="3" fill="{fill}" stroke="#999">'
           f"<title>{escape(_tip(end or submit or lane.events[0]))}</title></rect>")
    yield f'<text class="small" x="{x(end_seq) + 4:.1f}" y="{top + 22}">{escape(outcome)}</text>'
    label_end = {"point": -1.0, "fault": -1.0}
    for event in lane.events:
        cx = x(event.seq)
        if event.kind == "fault":
            yield (f'<polygon class="fault" points="{cx:.1f},{top + 12} {cx + 5:.1f},{top + 19} {cx:.1f},{top + 26} '
                   f'{cx - 5:.1f},{top + 19}"><title>{escape(_tip(event))}</title></polygon>')
            text, css, y, row = event.name, "small fault-label", top + 34, "fault"
        elif event.kind in ("point", "stale"):
            yield (f'<circle class="point" cx="{cx:.1f}" cy="{top + 19}" r="2.5">'
                   f"<title>{escape(_tip(event))}</title></circle>")
            text, css, y, row = _short(event), "small", top + 10, "point"
        else:
            continue
        if cx > label_end[row]:  # a label only where it does not run into the previous one of its row
            yield f'<text class="{css}" x="{cx - 2:.1f}" y="{y}">{escape(text)}</text>'
            label_end[row] = cx - 2 + SMALL_CHAR_W * len(text) + 4


def _thread_marks(lane: _Lane, top: int, x: _Scale, last: int, concurrent: set) -> Iterable[str]:
    for event in lane.events:
        if event.kind == "mlx":
            end = event.end if event.end is not None else last
            css = "mlx" + (" off-owner" if event.info.get("off_owner") else "") + \
                (" concurrent" if id(event) in concurrent else "") + (" open" if event.end is None else "")
            yield (f'<rect class="{css}" data-seq="{event.seq}" x="{x(event.seq):.1f}" y="{top + 10}" '
                   f'width="{max(x(end) - x(event.seq), 2):.1f}" height="16">'
                   f"<title>{escape(_tip(event))}</title></rect>")
        elif event.kind == "mlx-error":
            yield _cross(x(event.seq), top + 18, event)
        else:
            cx = x(event.seq)
            css = "tick fault" if event.kind == "fault" else "tick"
            yield (f'<line class="{css}" x1="{cx:.1f}" y1="{top + 13}" x2="{cx:.1f}" y2="{top + 23}">'
                   f"<title>{escape(_tip(event))}</title></line>")


def _run_marks(lane: _Lane, top: int, x: _Scale, last: int, concurrent: set) -> Iterable[str]:
    for event in lane.events:
        if event.kind == "loop" or event.name in ("stalled", "startup-failed", "shutdown-failed", "reentered"):
            yield _cross(x(event.seq), top + 18, event)
            continue
        cx = x(event.seq)
        yield (f'<polygon class="check" points="{cx - 4:.1f},{top + 24} {cx + 4:.1f},{top + 24} {cx:.1f},{top + 13}">'
               f"<title>{escape(_tip(event))}</title></polygon>")


def _cross(cx: float, cy: float, event: Event) -> str:
    return (f'<path class="error" d="M{cx - 5:.1f},{cy - 5:.1f} L{cx + 5:.1f},{cy + 5:.1f} M{cx - 5:.1f},{cy + 5:.1f} '
            f'L{cx + 5:.1f},{cy - 5:.1f}"><title>{escape(_tip(event))}</title></path>')


def _legend(y: int) -> tuple[list[str], float]:
    """What the marks mean, on one line above the lanes (an SVG turned into a PNG has no tooltips),
    and the width it takes."""
    items = [('<rect class="mlx" x="{x}" y="{top}" width="14" height="9"/>', "MLX call (entry..exit)"),
             ('<rect class="mlx off-owner" x="{x}" y="{top}" width="14" height="9"/>', "off the owner thread"),
             ('<rect class="mlx concurrent" x="{x}" y="{top}" width="14" height="9"/>',
              "while another thread was in MLX"),
             ('<circle class="point" cx="{cx}" cy="{cy}" r="2.5"/>', "point"),
             ('<polygon class="fault" points="{cx},{top} {r},{cy} {cx},{bottom} {left},{cy}"/>', "fault"),
             ('<polygon class="check" points="{left},{bottom} {r},{bottom} {cx},{top}"/>', "check"),
             ('<line class="tick" x1="{cx}" y1="{top}" x2="{cx}" y2="{bottom}"/>', "event on this thread"),
             ('<path class="error" d="M{left},{top} L{r},{bottom} M{left},{bottom} L{r},{top}"/>', "error")]
    out, x = [], 8.0
    for shape, text in items:
        out.append(shape.format(x=x, top=y - 8, bottom=y + 1, cx=x + 5, cy=y - 3.5, r=x + 10, left=x))
        out.append(f'<text class="small" x="{x + 18:.0f}" y="{y}">{escape(text)}</text>')
        x += 18 + SMALL_CHAR_W * len(text) + 14
    return out, x


def _axis(events: list[Event], last: int, x: _Scale, bottom: int) -> Iterable[str]:
    """Grid lines and ticks: the sequence number, and the time (ms) of the event that has it (`events` are
    this process's: a merged event's time is on another clock)."""
    times = {e.seq: e.t for e in events}
    times.update({e.end: e.t_end for e in events if e.end is not None and e.t_end is not None})
    every = max(1, round(70 / x.step))
    yield f'<line class="axis" x1="{LABEL_W}" y1="{bottom}" x2="{x(last) + 10:.1f}" y2="{bottom}"/>'
    for seq in range(1, last + 1, every):
        cx = x(seq)
        yield f'<line class="grid" x1="{cx:.1f}" y1="{TOP}" x2="{cx:.1f}" y2="{bottom + 4}"/>'
        yield f'<text class="small" x="{cx:.1f}" y="{bottom + 15}" text-anchor="middle">#{seq}</text>'
        if seq in times:
            yield (f'<text class="small" x="{cx:.1f}" y="{bottom + 27}" text-anchor="middle">'
                   f"{times[seq] * 1000:.1f}ms</text>")
    yield f'<text class="small" x="8" y="{bottom + 15}">event order (#seq)</text>'
    yield f'<text class="small" x="8" y="{bottom + 27}">time since start</text>'


def _short(event: Event) -> str:
    """A point's label: its name, with its step or chunk index when it has one."""
    index: Optional[object] = event.info.get("step", event.info.get("index"))
    return f"{event.name}({index})" if index is not None else event.name


def _tip(event: Event) -> str:
    return " ".join(event.line().split())


def _clip(text: str, width: float, char_w: float) -> str:
    room = max(int(width / char_w), 4)
    return text if len(text) <= room else text[:room - 1] + "…"
