"""Compute spent for clients that have gone: watched after a scenario's last client ended, then judged.

A server that keeps decoding every token for a client that disconnected answers
everyone correctly and leaks nothing a status can show; it only burns the
machine. The one trace of it is MLX still being entered once nobody is left to
read the tokens. So once every client of a scenario has ended and at least one
of them went away (cancelled or disconnected), `watch_gone` holds the follow-up
back and watches the MLX calls (the sentinel's, in this process or merged from
a launched server's records at each poll) until they have been quiet for a few
decode steps, or until twice the bound has passed, and records how long MLX
stayed busy as one `check`. `compute_stops_for_gone_clients` judges that fact:
busy for more than `GONE_STEPS` decode steps of the pace the runner measured
(`bound_s`) is a finding. A server's spans count at the poll that merged them,
so they need no clock shared with this process.
"""

from __future__ import annotations

import asyncio
from typing import Callable, Iterator, Optional

from mlx_invariants.fuzz.trace import Trace
from mlx_invariants.fuzz.violation import Violation

GONE_STEPS = 8            # decode steps of MLX after the last client went, allowed (a step in flight, a cache flush)
QUIET_STEPS = 2           # decode steps without an MLX entry: the engine has stopped
DEFAULT_STEP_S = 0.02     # one decode step when no pace was measured (a scenario run outside the runner)
MIN_POLL_S = 0.002
MIN_BOUND_S = 0.25        # the bound's floor: scheduling noise, not compute
SERVER_QUIET_S = 0.1      # a launched server counts as stopped only after this long without MLX
GONE_OUTCOMES = frozenset({"cancelled", "disconnected"})


def gone_clients(trace: Trace) -> list[str]:
    """The requests whose client went away (not the follow-up), if every request has ended; else []."""
    submitted = [e.rid for e in trace.of("request", "submit") if e.rid != "followup"]
    ends = {e.rid: e.info.get("outcome") for e in trace.of("request", "end")}
    if not submitted or any(rid not in ends for rid in submitted):
        return []
    return [rid for rid in submitted if ends[rid] in GONE_OUTCOMES]


async def watch_gone(trace: Trace, rids: list[str], step_s: float,
                     collect: Optional[Callable[[Trace], None]] = None) -> None:
    """Poll the MLX calls after every client ended and `rids` went away; record how long MLX stayed busy.

    Returns once MLX was quiet for `QUIET_STEPS` steps, or at twice the bound (then the engine is still
    busy, and the check says so). An MLX span of this process counts at its own time; one merged from a
    server's records at the poll that brought it (an upper bound)."""
    step = step_s if step_s > 0 else DEFAULT_STEP_S
    # A server's spans reach us through its records file, and it may not have begun the gone request yet.
    bound, quiet = bound_s(step), max(QUIET_STEPS * step, SERVER_QUIET_S if collect is not None else 0.0)
    poll = max(step / 2, MIN_POLL_S)
    loop = asyncio.get_running_loop()
    if collect is not None:
        collect(trace)  # what a server did before the last client ended is not counted
    gone = trace.record("check", "clients-gone", info={"rids": rids})
    started, seen, busy, entries = loop.time(), len(trace.events), 0.0, 0
    while True:
        await asyncio.sleep(poll)  # each poll looks at what MLX did since the last one
        local = len(trace.events)
        if collect is not None:
            collect(trace)
        now = loop.time() - started
        for index in range(seen, len(trace.events)):
            event = trace.events[index]
            if event.kind == "mlx":
                entries += 1
                busy = max(busy, event.t - gone.t if index < local else now)
        seen = len(trace.events)
        if now - busy >= quiet or now > 2 * bound:  # still busy at twice the bound: clearly past it
            break
    trace.record("check", "compute-after-gone",
                 info={"rids": rids, "busy_s": round(busy, 4), "entries": entries, "step_s": round(step, 5),
                       "bound_s": round(bound, 4)})


def bound_s(step_s: float) -> float:
    """How long MLX may stay busy after every client went: `GONE_STEPS` decode steps, never under
    `MIN_BOUND_S` (a poll on a loaded machine comes late, and a server's spans count at their poll)."""
    return max(GONE_STEPS * step_s, MIN_BOUND_S)


def compute_stops_for_gone_clients(trace: Trace) -> Iterator[Violation]:
    """Once every client had gone, MLX was entered for no longer than the bound (`bound_s`)."""
    for check in trace.of("check", "compute-after-gone"):
        info = check.info
        step, busy = info["step_s"], info["busy_s"]
        if busy > info["bound_s"]:
            yield Violation("compute-after-disconnect",
                            f"{', '.join(info['rids'])}: every client had gone, and MLX was still entered "
                            f"{info['entries']} time(s) over {busy:.2f}s ({busy / step:.0f} decode steps at "
                            f"{step * 1000:.1f} ms; bound {info['bound_s']:.2f}s)", rid=info["rids"][0])
