"""Compute spent for clients that have gone: watched after a scenario's last client ended, then judged.

A server that keeps decoding every token for a client that disconnected answers
everyone correctly and leaks nothing a status can show; it only burns the
machine. The one trace of it is MLX still being entered once nobody is left to
read the tokens. So once every client of a scenario has ended and at least one
of them went away (cancelled or disconnected), `watch_gone` holds the follow-up
back and counts the MLX entries (the sentinel's, in this process or merged from
a launched server's records at each poll) until MLX has been quiet for a few
decode steps, and records the count as one `check`.

The count is judged in decode steps, not seconds: the runner's baseline says
how many MLX entries one decode step makes on this target (`mlx_per_step`, see
`fuzz.pace`), so `compute_stops_for_gone_clients` finds a gone client that
still cost more than `GONE_STEPS` steps however fast the target decodes and
however slow its HTTP front is. Wall time only decides when to stop watching:
"quiet" is a few of the target's real steps (its MLX time per step on the
baseline), never less than the time a server's records take to reach us.
"""

from __future__ import annotations

import asyncio
from typing import Callable, Iterator, Optional, Protocol

from mlx_invariants.fuzz.trace import Trace
from mlx_invariants.fuzz.violation import Violation, ViolationKind, yields

GONE_STEPS = 8            # decode steps of MLX after the last client went, allowed (a step in flight, a cache flush)
GONE_TOKENS = GONE_STEPS + 2  # a budget past that bound: the least a gone client's long request draws (fuzz.strategies)
MIN_ENTRIES = 8           # and never fewer MLX entries than this: a flush or one step is never a finding
QUIET_STEPS = 2           # decode steps without an MLX entry: the engine has stopped
DEFAULT_STEP_S = 0.02     # one decode step when no pace was measured (a scenario run outside the runner)
DEFAULT_PER_STEP = 1.0    # MLX entries per decode step when none were measured
MIN_POLL_S = 0.002
MIN_WATCH_S = 0.5         # the watch's floor: a poll on a loaded machine comes late
SERVER_QUIET_S = 0.5      # a launched server counts as stopped only after this long without MLX (its records come
                          # through a file; on a loaded box the server may not run at all for 0.1 s)
GONE_OUTCOMES = frozenset({"cancelled", "disconnected"})


class StepScale(Protocol):
    """What one decode step of the target is, as the runner measured it (`fuzz.driver.DriverSettings`)."""

    step_s: float        # wall time per step, HTTP and prefill included: bounds how long the watch may last
    mlx_per_step: float  # MLX entries per step: what gone compute is counted in
    mlx_step_s: float    # MLX time per step: how long "quiet" is


def gone_clients(trace: Trace) -> list[str]:
    """The requests whose client went away (not the follow-up), if every request has ended; else []."""
    submitted = [e.rid for e in trace.of("request", "submit") if e.rid != "followup"]
    ends = {e.rid: e.info.get("outcome") for e in trace.of("request", "end")}
    if not submitted or any(rid not in ends for rid in submitted):
        return []
    return [rid for rid in submitted if ends[rid] in GONE_OUTCOMES]


async def watch_gone(trace: Trace, rids: list[str], scale: StepScale,
                     collect: Optional[Callable[[Trace], None]] = None) -> None:
    """Count the MLX entries after every client ended and `rids` went away; record them as a `check`.

    Returns once MLX was quiet for `QUIET_STEPS` real steps, once the count is twice the bound (clearly past
    it), or when the watch has lasted twice the bound in wall steps. A local span counts as busy at its own
    time; a span merged from a server's records at the poll that brought it."""
    wall = scale.step_s if scale.step_s > 0 else DEFAULT_STEP_S
    per_step = scale.mlx_per_step if scale.mlx_per_step > 0 else DEFAULT_PER_STEP
    real = scale.mlx_step_s if scale.mlx_step_s > 0 else wall
    # A server's spans reach us through its records file, and it may not have begun the gone request yet.
    quiet = max(QUIET_STEPS * real, SERVER_QUIET_S if collect is not None else 0.0)
    limit_s = max(2 * GONE_STEPS * wall, MIN_WATCH_S, 2 * quiet)
    poll = max(min(real, wall) / 2, MIN_POLL_S)
    loop = asyncio.get_running_loop()
    if collect is not None:
        collect(trace)  # what a server did before the last client ended is not counted
    gone = trace.record("check", "clients-gone", info={"rids": rids})
    started, seen, busy, counted = loop.time(), len(trace.events), 0.0, []
    while True:
        await asyncio.sleep(poll)  # each poll looks at what MLX did since the last one
        local = len(trace.events)
        if collect is not None:
            collect(trace)
        now = loop.time() - started
        for index in range(seen, len(trace.events)):
            event = trace.events[index]
            if event.kind == "mlx":
                counted.append(event)
                busy = max(busy, event.t - gone.t if index < local else now)
        seen = len(trace.events)
        if now - busy >= quiet or len(counted) > max(2 * GONE_STEPS * per_step, 2 * MIN_ENTRIES) or now > limit_s:
            break
    trace.record("check", "compute-after-gone",
                 info={"rids": rids, "entries": len(counted), "per_step": round(per_step, 3),
                       "mlx_s": round(sum(e.duration for e in counted), 4), "busy_s": round(busy, 4),
                       "quiet_s": round(quiet, 4)})


def gone_steps(info: dict) -> float:
    """The decode steps a `compute-after-gone` check counted: its MLX entries over entries per step."""
    return info["entries"] / info["per_step"]


@yields(ViolationKind(
    "compute-after-disconnect", "Once every client had gone, MLX ran for more than 8 decode steps (and 8 calls).",
    exact=False,
    why="Counts MLX calls after the last client went: whether the server had begun the request when its "
        "client went, and how many steps it ran before it noticed, depend on timing.",
    known_problems="Over HTTP the count comes from the launched server's records, so a `--url` server is not "
                   "judged; requests in flight together are counted together. Not judged after a worker fault "
                   "(`worker-dies`, `worker-wedges`): a wedged worker let go drains what it held in its own time, "
                   "and the lost-worker oracles judge that engine."))
def compute_stops_for_gone_clients(trace: Trace) -> Iterator[Violation]:
    """Once every client had gone, MLX ran for at most `GONE_STEPS` decode steps (and `MIN_ENTRIES` entries)."""
    for check in trace.of("check", "compute-after-gone"):
        info = check.info
        steps = gone_steps(info)
        if steps > GONE_STEPS and info["entries"] > MIN_ENTRIES:
            yield Violation("compute-after-disconnect",
                            f"{', '.join(info['rids'])}: every client had gone, and MLX ran {steps:.1f} more "
                            f"decode steps ({info['entries']} MLX calls at {info['per_step']:g} per step, "
                            f"{info['mlx_s']:.2f}s inside MLX over {info['busy_s']:.2f}s; "
                            f"bound {GONE_STEPS} steps)", rid=info["rids"][0])
