"""Oracles for a lost worker: after the "worker-dies" or "worker-wedges" fault (fuzz/faults.py).

Users of MLX servers keep reporting the same outage: the generation thread died (an uncaught exception,
mlx-lm #1505) or hangs inside MLX with no Python exception (mlx-lm #1834, a deadlock in `eval`), while
`/health` goes on answering 200 and every request waits for hours. An engine that holds up notices: every
request in flight ends, new ones are refused at once, and its health says so. The driver records a stall
after the fault (for a wedge, only once the engine's own declared stall bound, `stall_timeout_s`, has
passed as well as the fuzzer's) and what the adapter's `healthy` said once the requests had ended or
stalled, with the worker still wedged; these oracles judge those records.
"""

from __future__ import annotations

from typing import Iterator, Optional

from mlx_invariants.fuzz.trace import Event, Trace
from mlx_invariants.fuzz.violation import Violation, ViolationKind, yields

HANG_WHY = ("Judged from a stall the driver recorded after the delivered fault: when a quiet wait counts as "
            "stalled depends on timing and load, as for `stalled`.")
IN_PROCESS = ("In process the fault is delivered in the worker by the points hook; in a launched server (`--server-cmd`) "
              "it is armed in the injected sentinel and hits the server's next MLX call, on whichever thread makes "
              "it; a server at a URL takes no worker fault.")
# Stall records that are not a request: the scenario as a whole, a shutdown or restart that never returned.
NOT_REQUESTS = ("scenario", "shutdown", "restart")


def _hangs_after(trace: Trace, fault: Event) -> Iterator[tuple[list[str], str, Event]]:
    """Each stall (or waiter left after shutdown) recorded after `fault`: the requests that hung, those of
    them submitted after it (and so taken by an engine that could never serve them), and the record."""
    for check in trace.of("check"):
        if check.seq < fault.seq or check.name not in ("stalled", "waiters-after-shutdown"):
            continue
        rids = [r for r in check.info.get("rids", ()) if r not in NOT_REQUESTS]
        if not rids:
            continue
        later = [r for r in rids if (s := trace.first("request", "submit", r)) is not None and s.seq > fault.seq]
        yield rids, f"; {', '.join(later)} submitted after it and taken" if later else "", check


@yields(ViolationKind(
    "hang-after-worker-death", "After the worker thread died, a request hung instead of ending or being refused.",
    exact=False, why=HANG_WHY, known_problems=IN_PROCESS))
def work_ends_after_worker_death(trace: Trace) -> Iterator[Violation]:
    """Once the worker died, every request in flight ends and every new one is refused or fails: an engine
    that keeps accepting work it can never do (health that lies) hangs them instead."""
    death = trace.first("fault", "worker-dies")
    if death is None:
        return
    for rids, taken, check in _hangs_after(trace, death):
        yield Violation("hang-after-worker-death",
                        f"the worker died at {death.info.get('at')} (#{death.seq}), then {', '.join(rids)} "
                        f"hung instead of ending or being refused{taken}",
                        detail=check.info.get("stacks", ""), rid=rids[0])


@yields(ViolationKind(
    "hang-after-worker-wedge",
    "After the worker wedged inside MLX, a request hung past the engine's own stall bound instead of ending.",
    exact=False, why=HANG_WHY,
    known_problems=IN_PROCESS + " An engine with no stall bound (no `stall_timeout_s` on its adapter) is given "
                   "the fuzzer's alone, so asking it to wedge finds that it never notices."))
def work_ends_after_worker_wedge(trace: Trace) -> Iterator[Violation]:
    """Once the worker made no progress for the engine's stall bound, every request in flight ends and every
    new one is refused: an engine that only watches whether its thread is alive waits with it forever."""
    wedge = trace.first("fault", "worker-wedges")
    if wedge is None:
        return
    bound = trace.meta.get("stall_timeout_s")
    within = f" (its stall bound: {bound:g} s)" if isinstance(bound, (int, float)) else " (it declares no stall bound)"
    for rids, taken, check in _hangs_after(trace, wedge):
        yield Violation("hang-after-worker-wedge",
                        f"the worker wedged at {wedge.info.get('at')} (#{wedge.seq}), then {', '.join(rids)} "
                        f"hung instead of ending or being refused{within}{taken}",
                        detail=check.info.get("stacks", ""), rid=rids[0])


def _lost(trace: Trace) -> Optional[Event]:
    return trace.first("fault", "worker-dies") or trace.first("fault", "worker-wedges")


def _served_after(trace: Trace, fault: Event, health: Event) -> Optional[str]:
    """In a launched server (the fault names the thread it hit), a request sent after the fault fired that was
    answered in full (after a wedge: before health was read, with the thread still blocked): the thread hit
    was not one the server's serving rests on (a thread per request), so healthy was the truth. Its id."""
    if "server_thread" not in fault.info:
        return None
    for end in trace.of("request", "end"):
        sent = trace.first("request", "submit", end.rid)
        if sent is None or sent.seq < fault.seq or end.info.get("outcome") != "completed":
            continue
        if fault.name == "worker-dies" or end.seq < health.seq:
            return end.rid
    return None


@yields(ViolationKind(
    "health-lies", "The engine still called itself healthy after its worker died or stayed wedged.",
    exact=False,
    why="Read once the requests had ended or stalled after the fault; for a wedge, whether the engine's stall "
        "bound had passed by then depends on timing and load.",
    known_problems=IN_PROCESS + " Read from the adapter's `healthy` (a server's: its declared health route, "
                                "`--health`); an adapter without one is not judged. A launched server that "
                                "answered in full a request sent after the fault (after a wedge: while still "
                                "wedged) is not judged: the thread hit was not one its serving rests on."))
def health_tells_lost_worker(trace: Trace) -> Iterator[Violation]:
    """After the worker is lost, health stops answering healthy: a load balancer or a readiness probe that
    reads it keeps sending traffic to an engine that can never answer."""
    fault = _lost(trace)
    for check in trace.of("check", "health"):
        if fault is not None and check.info.get("healthy") is True and _served_after(trace, fault, check) is None:
            what = "died" if fault.name == "worker-dies" else "wedged"
            yield Violation("health-lies", f"the worker {what} at {fault.info.get('at')} (#{fault.seq}) and the "
                                           "engine still called itself healthy once its requests were over")


# A hang first: it is the outage; the health that hid it comes with it.
LOST_WORKER_ORACLES = (work_ends_after_worker_death, work_ends_after_worker_wedge, health_tells_lost_worker)
