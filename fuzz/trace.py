"""The ordered event record of one scenario: the only input of the oracles.

Every event gets a sequence number under one lock, so "A happened before B"
is exact across threads even where clocks are too coarse. MLX calls are spans
(`seq` at entry, `end` at exit); everything else is an instant.

`EVENTS` declares every event kind and the names recorded under it: what an
oracle may look for (`trace.of(kind, name)`) and what a report shows.
tests/fuzz/test_vocabulary.py checks that every literal `record`, `of` and
`first` in fuzz/ uses a declared kind and name.
"""

from __future__ import annotations

import itertools
import json
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator, Mapping, Optional

from mlx_invariants.fuzz.scenario import FaultKind
from mlx_invariants.points import Point

_local = threading.local()
_tokens = itertools.count(1)
_token_lock = threading.Lock()


def thread_token() -> int:
    """A per-thread number that is never reused, unlike `threading.get_ident()`."""
    token = getattr(_local, "token", None)
    if token is None:
        with _token_lock:
            token = _local.token = next(_tokens)
    return token


def capture_stack(skip: int = 1, limit: int = 30) -> tuple[str, ...]:
    """The caller's stack as "file:line in function" lines, innermost last; cheap enough per MLX entry."""
    frame = sys._getframe(skip + 1)
    lines: list[str] = []
    while frame is not None and len(lines) < limit:
        code = frame.f_code
        lines.append(f"{code.co_filename}:{frame.f_lineno} in {code.co_name}")
        frame = frame.f_back
    lines.reverse()
    return tuple(lines)


@dataclass(frozen=True)
class EventKind:
    """One kind of trace event: what it records, and the names recorded under it (None: any name, as
    `open_names` says)."""

    doc: str
    names: Optional[Mapping[str, str]]
    open_names: str = ""


_POINT_NAMES = {point.name: point.marked for point in Point}
EVENTS: dict[str, EventKind] = {
    "point": EventKind("a request reached a named point (the injector records every one; info: step or index)",
                       _POINT_NAMES),
    "stale": EventKind("a point reached by an earlier scenario's request (another run's rid suffix): ignored",
                       _POINT_NAMES),
    "mlx": EventKind("one outermost MLX entry as a span, with its thread and stack (the sentinel)", None,
                     "the wrapped entry point, e.g. `core.eval`"),
    "mlx-error": EventKind("MLX raised inside a wrapped call (the sentinel)", {
        "no-stream": "\"There is no Stream(...) in current thread\": an array or stream crossed threads"}),
    "mlx-gc": EventKind("an MLX object was finalized (the sentinel's wrapped generators)", {
        "finalized-off-thread": "a wrapped generator dropped mid-body on another thread than made it",
        "collected-suspended": "a wrapped generator left mid-body in a reference cycle, finalized by the harness's "
                               "own collection (fuzz/collect.py): its thread is the harness's, not judged",
        "outlived-its-scenario": "a wrapped generator made in an earlier scenario, finalized mid-body while a later "
                                 "one runs: its thread and moment are that scenario's, not judged"}),
    "fault": EventKind("a fault or arrival was delivered, or found nothing to hit (info: at, delivered)", {
        **{kind.value: f"a `{kind.value}` fault delivered (or, `delivered: false`, nothing to hit)"
           for kind in FaultKind},
        "arrive": "a request whose arrival point came was sent",
        "abort-deferred": "an abort aimed at a request not submitted yet: sent once `submit` returns",
        "cancel-again": "the second cancel of `cancel-twice`, once the first was taken",
        "in-call": "a `cancel-in-call` (or an in-process loop-side `cancel-twice`) let go: at once, or once the "
                   "worker entered MLX (info: worker)",
        "resume-capped": "a paused worker resumed after `cap_s` although the loop never went idle",
        "armed": "a worker fault armed in a launched server's sentinel, for its next MLX call (info: kind; "
                 "`delivered: false`: the server had no switch, or a worker fault was already armed)",
        "disarmed": "a worker fault armed in a launched server that had not fired once the requests ended"}),
    "request": EventKind("a client's request (info: the outcome at its end)", {
        "submit": "the client sent it", "end": "the client saw it end: completed, cancelled, disconnected, "
                                               "aborted, refused, error or crashed"}),
    "lock": EventKind("the owner-aware asyncio lock (fuzz/locks.py)", {
        "reentered": "a task acquired a lock it already holds"}),
    "check": EventKind("an after-the-fact check the driver made (the oracles judge its info)", {
        "status": "the adapter's status once every request ended (after a grace of loop turns), before the "
                  "follow-up and after it",
        "rest": "threads and MLX active memory at rest before and after the follow-up, and the engine's rest "
                "series (a launched server's: from its sentinel's samples; fuzz/rest.py)",
        "loop-lag": "the event loop's longest lag during the scenario",
        "startup-failed": "the engine's `start()` raised",
        "start-unsettled": "the engine's threads were not all parked within `cap_s` of its start",
        "shutdown-failed": "the adapter's `shutdown()` raised",
        "executor-busy": "executor jobs still running after shutdown returned",
        "stray-tasks": "asyncio tasks still pending after the scenario",
        "threads-alive": "threads the engine started still alive after shutdown",
        "stalled": "nothing could run but requests were unfinished (with every stack)",
        "waiters-after-shutdown": "requests still waiting once shutdown returned",
        "followup": "the follow-up's answer next to a fresh engine's",
        "invariant": "an invariant the engine declares broken at a point, the first time (info: at, broken)",
        "alone": "a request's tokens next to its tokens alone on the same engine, with the lone run's leads",
        "health": "the adapter's `healthy` once the requests ended or stalled after a worker fault",
        "stopping-health": "the health route read while the engine drained or once it stopped (info: during, "
                           "healthy)",
        "clients-gone": "every client had ended, some gone: the MLX watch begins",
        "compute-after-gone": "the MLX calls counted after the last client went"}),
    "loop": EventKind("the event loop itself", {"error": "its exception handler was called"}),
    "engine": EventKind("the engine's life inside a scenario (a restart fault)", {
        "stopped": "shut down, checked as after any shutdown", "restarted": "started again and settled"}),
    "sync": EventKind("an asyncio or threading lock or semaphore (drop-in observation, fuzz/observe.py)", {
        "acquire": "taken (info: holder)", "release": "let go (info: holder, the exception being unwound)",
        "wait": "an event loop's thread waited for a taken `threading.Lock` (info: since, its last taker)"}),
    "work": EventKind("work handed to a thread (drop-in observation)", {
        "submit": "handed over (info: how, by whom, under which locks)", "start": "began on its thread",
        "finish": "ended on its thread"}),
    "task": EventKind("an asyncio task's cancellation (drop-in observation)", {
        "cancel": "a cancel was delivered to it", "uncancel": "it called `uncancel()`",
        "end": "it ended: cancelled, returned or raised"}),
    "log": EventKind("a log record the engine emitted during the scenario", None,
                     "the record's level, lowercased"),
}


@dataclass
class Event:
    """One fact. `kind` groups events for the oracles; `name` says which one."""

    seq: int
    kind: str  # one of `EVENTS`
    name: str
    rid: str | None = None
    thread: int = 0
    thread_name: str = ""
    t: float = 0.0
    end: int | None = None  # spans only: the sequence number at exit
    info: dict[str, Any] = field(default_factory=dict)
    stack: tuple[str, ...] = ()
    t_end: float | None = None  # spans only: the time at exit

    @property
    def duration(self) -> float:
        """Seconds inside a closed span; 0 for instants and open spans."""
        return self.t_end - self.t if self.t_end is not None else 0.0

    @property
    def who(self) -> str:
        return f"thread #{self.thread} ({self.thread_name})"

    def line(self) -> str:
        """One line for the report's event listing."""
        span = f"..{self.end}" if self.end is not None else ""
        rid = f" {self.rid}" if self.rid else ""
        info = f" {self.info}" if self.info else ""
        return f"{self.seq:>5}{span:<7} {self.t * 1000:9.2f}ms  {self.kind:<7} {self.name}{rid}{info}  [{self.who}]"


class Trace:
    """Thread-safe append-only list of events for one scenario run."""

    def __init__(self, keep: bool = True) -> None:
        self.keep = keep  # False: number and return events without storing them (a long-lived server)
        self.events: list[Event] = []
        self.meta: dict[str, Any] = {}
        # Reentrant: the collector may run a finalizer on a thread inside one of the blocks below, and the
        # finalizer may record (an abandoned request reaching a point as it is closed); a plain lock would
        # wait on itself. `record` builds its event before taking the lock, so that recording numbers and
        # appends with nothing in between.
        self._lock = threading.RLock()
        self._seq = itertools.count(1)
        self._t0 = time.perf_counter()

    def record(self, kind: str, name: str, rid: str | None = None, *,
               info: dict[str, Any] | None = None, stack: tuple[str, ...] = ()) -> Event:
        thread = threading.current_thread()
        event = Event(0, kind, name, rid, thread_token(), thread.name, 0.0, None, dict(info or {}), stack)
        with self._lock:  # nothing in here allocates a collectable object, so no finalizer runs in between
            event.seq = next(self._seq)
            event.t = time.perf_counter() - self._t0
            if self.keep:
                self.events.append(event)
        return event

    def now(self) -> float:
        """Seconds since this trace began, on the clock its events' `t` use."""
        return time.perf_counter() - self._t0

    def close_span(self, event: Event) -> None:
        with self._lock:
            event.end = next(self._seq)
            event.t_end = time.perf_counter() - self._t0

    def merge(self, events: list[Event]) -> None:
        """Append events numbered elsewhere (another process's sentinel), keeping their relative order."""
        numbers = sorted({n for e in events for n in (e.seq, e.end) if n is not None})
        with self._lock:
            renumber = {n: next(self._seq) for n in numbers}
            for event in sorted(events, key=lambda e: e.seq):
                event.seq = renumber[event.seq]
                event.end = renumber[event.end] if event.end is not None else None
                self.events.append(event)
            if renumber:  # which numbers came from elsewhere: ordered among themselves, not against ours
                self.meta.setdefault("merged", []).append([min(renumber.values()), max(renumber.values())])

    # -- queries (oracles) -------------------------------------------------
    def of(self, kind: str, name: str | None = None, rid: str | None = None) -> list[Event]:
        return [e for e in self.events if e.kind == kind and (name is None or e.name == name)
                and (rid is None or e.rid == rid)]

    def first(self, kind: str, name: str, rid: str | None = None) -> Event | None:
        found = self.of(kind, name, rid)
        return found[0] if found else None

    def overlapping(self, kind: str) -> Iterator[tuple[Event, Event]]:
        """Pairs of spans on different threads where `second` began while `first` was open."""
        spans = sorted(self.of(kind), key=lambda e: e.seq)
        for i, first in enumerate(spans):
            end = first.end if first.end is not None else sys.maxsize
            for second in spans[i + 1:]:
                if second.seq > end:
                    break
                if second.thread != first.thread:
                    yield first, second

    def rids(self) -> list[str]:
        return sorted({e.rid for e in self.events if e.rid}, key=_rid_order)

    # -- persistence -------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {"meta": self.meta, "events": [asdict(e) for e in self.events]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Trace":
        trace = cls()
        trace.meta = dict(data.get("meta", {}))
        for raw in data.get("events", []):
            raw = dict(raw)
            raw["stack"] = tuple(raw.get("stack", ()))
            trace.events.append(Event(**raw))
        return trace

    def dumps(self) -> str:
        return json.dumps(self.to_json(), default=str)


def _rid_order(rid: str) -> tuple[int, str]:
    digits = "".join(ch for ch in rid if ch.isdigit())
    return (int(digits) if digits else 0, rid)
