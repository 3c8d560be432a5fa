"""How close a scenario came to firing an oracle, read from its trace: what `hypothesis.target()` is fed.

Hypothesis's target phase hill-climbs each labelled observation (larger is
nearer), so each distance here grows as a timing oracle's window opens, even
on an engine that never fires it. A pure function of the trace, like an oracle:
it never sleeps or touches the engine.

- `slot-release-margin`: FINISHED's time minus SLOT_RELEASED's, the largest over
  requests (`slot-freed-early` fires once it is positive: the slot let go first);
  negative on a correct engine, nearer 0 the tighter the two come.
- `decode-after-client-left`: decode steps a request reached after a fault hit
  its client (`abort-ignored`, `abort-completed`, `slot-leaked`), and the steps
  MLX ran once every client had gone (`compute-after-disconnect`), the larger.
- `queue-wait`: the longest wait from a request's submit to its worker's start
  (`busy-slow`, `stalled`, a waiter left behind by a shutdown).
- `progress-gap`: the longest time between two points while a request was open
  (`stalled`, `hang-after-*`).
- `in-flight`: the most requests submitted and not yet ended at once (the
  oracles that need requests side by side: `mlx-concurrent`, `output-differs-alone`).

Times are in seconds of the run itself. The runner calls `target()` with these
only with `--steer` (`FuzzSettings.steer`) and only while it generates, never
while it shrinks (`fuzz.runner`). Off by default: docs/fuzz.md ("Profiles")
gives the before/after measurement that found no gain.
"""

from __future__ import annotations

import math

from mlx_invariants.fuzz.compute import gone_steps
from mlx_invariants.fuzz.scenario import VICTIM_KINDS
from mlx_invariants.fuzz.trace import Trace

LABELS: tuple[str, ...] = ("slot-release-margin", "decode-after-client-left", "queue-wait", "progress-gap",
                           "in-flight")
FLOOR = -60.0   # a distance with nothing to measure (no such event in the trace): far from firing, still finite


def distances(trace: Trace) -> dict[str, float]:
    """Every label of `LABELS` with its distance in this trace (finite; `FLOOR` where nothing was seen)."""
    found = {"slot-release-margin": _slot_release_margin(trace), "decode-after-client-left": _decode_after_left(trace),
             "queue-wait": _queue_wait(trace), "progress-gap": _progress_gap(trace), "in-flight": _in_flight(trace)}
    return {label: value if math.isfinite(value) else FLOOR for label, value in found.items()}


def _slot_release_margin(trace: Trace) -> float:
    margins = []
    for rid in trace.rids():
        released, finished = trace.first("point", "SLOT_RELEASED", rid), trace.first("point", "FINISHED", rid)
        if released is not None and finished is not None:
            margins.append(finished.t - released.t)
    return max(margins, default=FLOOR)


def _decode_after_left(trace: Trace) -> float:
    steps = [gone_steps(check.info) for check in trace.of("check", "compute-after-gone")]
    for fault in trace.events:
        if fault.kind == "fault" and fault.name in VICTIM_KINDS and fault.info.get("delivered") and fault.rid:
            steps.append(sum(1 for e in trace.of("point", "BEFORE_DECODE", fault.rid) if e.seq > fault.seq))
    return float(max(steps, default=0))


def _queue_wait(trace: Trace) -> float:
    waits = []
    for submit in trace.of("request", "submit"):
        started = trace.first("point", "WORKER_STARTED", submit.rid)
        end = trace.first("request", "end", submit.rid)
        began = started if started is not None else end
        if began is not None:
            waits.append(began.t - submit.t)
    return max(waits, default=0.0)


def _open_spans(trace: Trace) -> list[tuple[float, float]]:
    """Each request's (submit, end) times; an unended one is open to the last event."""
    last = trace.events[-1].t if trace.events else 0.0
    spans = []
    for submit in trace.of("request", "submit"):
        end = trace.first("request", "end", submit.rid)
        spans.append((submit.t, end.t if end is not None else last))
    return spans


def _progress_gap(trace: Trace) -> float:
    spans = _open_spans(trace)
    times = sorted(e.t for e in trace.of("point"))
    gaps = [b - a for a, b in zip(times, times[1:]) if any(start <= a and b <= end for start, end in spans)]
    return max(gaps, default=0.0)


def _in_flight(trace: Trace) -> float:
    changes = sorted([(start, 1) for start, _ in _open_spans(trace)] + [(end, -1) for _, end in _open_spans(trace)],
                     key=lambda change: (change[0], change[1]))
    most = now = 0
    for _, step in changes:
        now += step
        most = max(most, now)
    return float(most)
