"""Deliver faults (and late arrivals) when a request reaches a named point; never after a delay.

The injector is the engine's points hook. It records every point. When a
fault is due:
- on an owner-side point the calling worker pauses, the fault is delivered on
  the event loop, and the worker resumes once the loop is idle (nothing
  runnable), or after `cap_s` of real time if it never gets there;
- on a loop-side point (which must neither block nor raise) the fault is
  delivered right there (a cancel then lands at the task's next suspension);
- a "raise" fault raises `InjectedFault` in the worker, standing for an error
  inside the MLX call at that spot; a "worker-dies" fault raises `WorkerKilled`
  there, a `BaseException` that escapes the worker's loop and kills it; a
  "worker-wedges" fault blocks the worker there, as an MLX call that never
  returns, until the driver lets it go (`release_wedged`, once the requests
  ended or stalled); against a launched server, whose worker no hook of ours runs in, a
  worker fault reached at any point of its scenario is armed in the server's sentinel
  instead (`arm`, fuzz/worker_switch.py) and fires at the server's next MLX call. The hook
  hands the client that reached the point a future to await before it goes on (the HTTP
  adapter's `reached`), so nothing the client does next (a late arrival, a read that lets
  the server write on) can get ahead of the arming. It is recorded when the server says
  it fired, and disarmed (recorded as such) if the scenario's requests ended first
  (`disarm_unfired`);
- a "cancel-in-call" fault is a cancel that never pauses the worker: on an
  owner-side point before MLX work (`RAISE_POINTS`) the worker only schedules
  it and goes on into the call that follows (the prefill after WORKER_STARTED,
  a decode step after BEFORE_DECODE); the loop delivers it once the sentinel
  has seen that worker enter MLX (or reach its next point), so the cancelled
  task unwinds while the worker is really inside a long MLX call, as when a
  client disconnects during a long prefill. A paused worker shows a release
  that comes too early only if the engine lets go before its worker resumes;
  this shows one that comes before the worker's call returns. On a loop-side
  point of an in-process engine (a drop-in engine marks only those) the loop
  waits the same way for any thread but its own to enter MLX, or for the
  request to end: the engine's worker is unknown, but its MLX calls are seen.
  Elsewhere (a launched server's MLX is read from a file afterwards) it is
  delivered at once, with no settling afterwards. One aimed at another request
  (`FaultSpec.rid`) is delivered the same way, at once: the worker at the point
  is not the victim's, so there is no call of the victim's to wait for.

A "cancel-twice" reached at a loop-side point of an in-process engine waits the
same way before its first cancel, so there is work for the drain to wait for.

A fault with a victim (`FaultSpec.rid`) is triggered by the point of `at.rid`
and acts on the victim's client (`ScenarioRun._deliver`); "raise", "shutdown"
and "restart" take no victim. Which of the three ways above a fault takes is
its kind's `FaultKind.delivery`. A late arrival is a trigger of its own
(`Arrival`): it rides on a point as a fault does and is delivered on the loop.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Optional, Union

from mlx_invariants.fuzz.errors import InjectedFault, WorkerKilled
from mlx_invariants.fuzz.scenario import (INDEXED_POINTS, RAISE_POINTS, WORKER_FAULTS, At, Delivery, FaultKind,
                                           FaultSpec)
from mlx_invariants.fuzz.trace import Event, Trace, capture_stack, thread_token
from mlx_invariants.fuzz.worker_switch import CONNECT_S, ArmedFault

IN_CALL = FaultKind.CANCEL_IN_CALL.value  # the fault kind that never pauses the worker
IN_CALL_POLL_S = 0.0002     # how often the loop looks whether the worker entered MLX (it sends no event)


@dataclass(frozen=True)
class Arrival:
    """Request `rid` is sent when `at` is reached (`RequestSpec.arrival`): a trigger, not a fault."""

    rid: str
    at: At

    def __str__(self) -> str:
        return f"arrival of {self.rid} at {self.at}"


# What the injector waits for: a fault to deliver, or a request to send.
Trigger = Union[FaultSpec, Arrival]
# Delivers a trigger at once; returns the rest of the delivery (e.g. a second cancel) to await, if any.
Action = Callable[[Trigger], Optional[Awaitable[None]]]
# Arms a worker fault (kind, where) in a launched server's sentinel (`HttpAdapter.arm_worker_fault`).
Arm = Callable[[str, str], Awaitable[ArmedFault]]
Invariants = Callable[[], list[str]]  # an adapter's `broken_invariants`: what its engine says is wrong now


def delivery(trigger: Trigger) -> Delivery:
    """How `trigger` is delivered: an arrival, like most faults, on the loop."""
    return FaultKind(trigger.kind).delivery if isinstance(trigger, FaultSpec) else Delivery.LOOP


async def wait_loop_idle(max_turns: int = 1000) -> bool:
    """Yield until nothing else is ready to run on this loop; False if it never settled."""
    loop = asyncio.get_running_loop()
    for _ in range(max_turns):
        await asyncio.sleep(0)
        if not loop._ready:  # type: ignore[attr-defined]  # CPython's ready queue: empty means idle
            return True
    return False


def _first_of(raises: list[FaultSpec]) -> FaultSpec:
    """Of the worker-delivered faults due at one point, the one delivered: a death, else a wedge, else a raise."""
    order = (FaultKind.WORKER_DIES.value, FaultKind.WORKER_WEDGES.value)
    return next((f for kind in order for f in raises if f.kind == kind), raises[0])


def _worker_went_on(worker: int) -> Callable[[Event], bool]:
    """An event of `worker` entering MLX or reaching its next point."""
    return lambda e: e.thread == worker and e.kind in ("mlx", "point")


def _mlx_off(loop_thread: int, victim: str) -> Callable[[Event], bool]:
    """An MLX entry on any thread but the loop's, or the end of `victim`'s request."""
    return lambda e: ((e.kind == "mlx" and e.thread != loop_thread)
                      or (e.kind == "request" and e.name == "end" and e.rid == victim))


class Injector:
    """The points hook for one scenario run."""

    def __init__(self, trace: Trace, loop: asyncio.AbstractEventLoop, due: list[Trigger],
                 deliver: Action, cap_s: float = 2.0, suffix: str = "", live_mlx: bool = True,
                 arm: Optional[Arm] = None, invariants: Optional[Invariants] = None):
        self.trace = trace
        self._invariants = invariants  # asked at every point, on the thread that reached it
        self._broken: set[str] = set()  # each broken invariant is recorded once, where it was first seen
        self._arm = arm  # a launched server's: worker faults are armed in it, not raised here
        self.live_mlx = live_mlx  # the sentinel's MLX spans reach the trace as they happen (in-process)
        self.suffix = suffix
        self.loop = loop
        self.cap_s = cap_s
        self._due = list(due)
        self._deliver = deliver
        self._lock = threading.Lock()
        self.deliveries: set[asyncio.Task] = set()
        self.paused = 0
        self._settle = False
        self._unwedge = threading.Event()  # set by `release_wedged`: a wedged worker goes on
        self._wedged = False
        self._arming: set[asyncio.Task] = set()  # worker faults armed in a server, until they fire or are disarmed
        self._armed: list[ArmedFault] = []
        self._disarming = False

    @property
    def undelivered(self) -> list[Trigger]:
        with self._lock:
            return list(self._due)

    def hook(self, point: Any, rid: str, info: dict[str, Any]) -> Optional[asyncio.Future]:
        """Record the point and deliver what is due there; a future for a loop-side caller to await before it
        goes on when a worker fault is being armed in a launched server (None otherwise)."""
        name = getattr(point, "name", str(point))
        if not rid.endswith(self.suffix):
            # An earlier scenario's request (an abandoned coroutine finalized now): not ours to judge.
            self.trace.record("stale", name, rid)
            return None
        rid = rid[: len(rid) - len(self.suffix)] if self.suffix else rid
        index = info.get("step", info.get("index", 0))
        on_loop = self._on_loop_thread()
        self.trace.record("point", name, rid, info=dict(info), stack=capture_stack(1))
        self._check_invariants(name, rid)
        with self._lock:
            fired = [f for f in self._due if f.at.rid == rid and f.at.point == name
                     and (name not in INDEXED_POINTS or f.at.index == index)]
            for fault in fired:
                self._due.remove(fault)
        if not fired:
            if self._settle and not on_loop:
                # The first owner-side point after a loop-side delivery waits for the loop to settle,
                # so whether the owner saw the fault's effects does not depend on thread timing.
                self._settle = False
                self._pause_for([])
            return None
        raises = [f for f in fired if delivery(f) is Delivery.WORKER]
        # A cancel, delivered apart; one aimed at another request's client is a plain cancel of it, at once.
        calls = [f for f in fired if delivery(f) is Delivery.IN_CALL]
        in_call = [FaultSpec(FaultKind.CANCEL.value, f.at, f.rid) for f in calls if f.victim == rid]
        across = [FaultSpec(FaultKind.CANCEL.value, f.at, f.rid) for f in calls if f.victim != rid]
        others = [f for f in fired if delivery(f) is Delivery.LOOP]
        # A double cancel at a loop-side point of an in-process engine: its first cancel waits, as an in-call
        # one does, for work to drain (a cancel that lands before the worker took the job drops the job, and the
        # drain it tests has nothing to wait for: a vllm-mlx zoo replay missed 3 of 3 so, in one process).
        twice = on_loop and self.live_mlx
        drains = [f for f in others if twice and isinstance(f, FaultSpec) and f.kind == FaultKind.CANCEL_TWICE.value]
        others = [f for f in others if f not in drains]
        if others:
            if on_loop:
                self._settle = True
                for fault in others:
                    self._track(self._deliver(fault))
            else:
                self._pause_for(others)
        if in_call:  # after any pause: the worker goes on into its call from here
            self._cancel_in_call(in_call, on_loop or name not in RAISE_POINTS)
        if across:
            self._cancel_in_call(across, True)
        if drains:
            self._start_in_call(drains, None, len(self.trace.events))
        armable = [f for f in raises if f.kind in WORKER_FAULTS]  # a server has no spot for a plain raise
        if armable and on_loop and self._arm is not None:
            return self._arm_in_server(_first_of(armable), rid)
        if raises and not on_loop:
            fault = _first_of(raises)
            self._wedged = self._wedged or fault.kind == FaultKind.WORKER_WEDGES.value  # before the loop can see it
            self.trace.record("fault", fault.kind, rid, info={"at": str(fault.at)})
            if fault.kind == FaultKind.WORKER_DIES.value:
                raise WorkerKilled(f"injected worker death at {fault.at}")
            if fault.kind == FaultKind.WORKER_WEDGES.value:
                self._unwedge.wait()
                return None
            raise InjectedFault(f"injected MLX error at {fault.at}")
        return None

    def _check_invariants(self, point: str, rid: str) -> None:
        """Record each invariant the engine declares broken at this point, the first time it is."""
        if self._invariants is None:
            return
        for broken in self._invariants():
            with self._lock:
                new = broken not in self._broken
                self._broken.add(broken)
            if new:
                self.trace.record("check", "invariant", rid, info={"at": f"{rid}@{point}", "broken": broken})

    def release_wedged(self) -> None:
        """Let a worker wedged by a "worker-wedges" fault go on (it is judged by then), and any later one
        pass straight through, so shutdown can join it; in a launched server, close each arming (it lets
        go of the call it wedged, and disarms one that never fired)."""
        self._unwedge.set()
        self._disarming = True
        for armed in self._armed:
            armed.release()

    def _arm_in_server(self, fault: FaultSpec, rid: str) -> Optional[asyncio.Future]:
        """Arm a worker fault a server scenario reached in the server's sentinel (`Injector.hook`, on the
        loop); at most one: once the worker is lost, a second fault says nothing more. Returns a future done
        once the server answered the arming (or could not be asked): the client that reached the point waits
        for it, or a late arrival it triggers could be served before the fault is armed and never meet it (a
        fresh clone's CI: r1 arrived, was answered and ended before the arming landed, and nothing fired)."""
        if self._arming or self._armed or self._disarming:
            self.trace.record("fault", "armed", rid, info={"at": str(fault.at), "kind": fault.kind, "delivered": False})
            return None
        answered = self.loop.create_future()
        task = self.loop.create_task(self._armed_in_server(fault, rid, answered), name="fuzz-arming")
        self._arming.add(task)
        task.add_done_callback(self._arming.discard)
        return answered

    async def _armed_in_server(self, fault: FaultSpec, rid: str, answered: asyncio.Future) -> None:
        """Arm it (`answered` is done once the server said so, or could not), then record it as delivered
        once the server says it fired (its worker is lost from then on), or as disarmed if the scenario's
        requests ended first."""
        info = {"at": str(fault.at), "kind": fault.kind}
        try:
            armed = await asyncio.wait_for(self._arm(fault.kind, str(fault.at)), CONNECT_S)
        except (OSError, asyncio.TimeoutError) as exc:
            self.trace.record("fault", "armed", rid, info={**info, "delivered": False, "error": str(exc)})
            return
        finally:
            if not answered.done():
                answered.set_result(None)
        self._armed.append(armed)
        self.trace.record("fault", "armed", rid, info=info)
        if self._disarming:
            armed.disarm()
        fired = await armed.fired()
        if fired is None:
            self.trace.record("fault", "disarmed", rid, info=info)
            armed.release()
            return
        self._wedged = self._wedged or fault.kind == FaultKind.WORKER_WEDGES.value
        self.trace.record("fault", fault.kind, rid, info={"at": str(fault.at), "server_thread": fired.get("thread"),
                                                          "call": fired.get("call")})
        if fault.kind == FaultKind.WORKER_DIES.value:
            armed.release()  # nothing to hold: the call raised

    async def disarm_unfired(self) -> None:
        """Once the scenario's requests ended: a worker fault armed in the server that has not fired is
        disarmed, so the follow-up is not its victim; returns once each arming fired or was disarmed."""
        self._disarming = True
        for armed in self._armed:
            armed.disarm()
        if self._arming:
            _, silent = await asyncio.wait(set(self._arming), timeout=CONNECT_S)
            for task in silent:  # a server that answers neither way: its arming ends with the scenario
                task.cancel()

    @property
    def wedged(self) -> bool:
        """A "worker-wedges" fault holds a worker in the hook now (delivered, not yet let go)."""
        return self._wedged and not self._unwedge.is_set()

    def _cancel_in_call(self, cancels: list[FaultSpec], now: bool) -> None:
        """Deliver the cancels without pausing anyone: `now` (on the loop, or from a worker with no MLX
        call ahead) at once; else scheduled for when this worker is inside its next MLX call."""
        if now and self.live_mlx and self._on_loop_thread():
            self._start_in_call(cancels, None, len(self.trace.events))
            return
        if now:
            self.trace.record("fault", "in-call", cancels[0].victim, info={"at": str(cancels[0].at)})
            if self._on_loop_thread():
                self._deliver_each(cancels)
            else:
                self._schedule(self._deliver_each, cancels)
            return
        self._schedule(self._start_in_call, cancels, thread_token(), len(self.trace.events))

    def _schedule(self, callback: Callable[..., None], *args: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop is closed: the scenario is over
            pass

    def _start_in_call(self, cancels: list[FaultSpec], worker: Optional[int], seen: int) -> None:
        self._track(self._deliver_in_call(cancels, worker, seen))

    async def _deliver_in_call(self, cancels: list[FaultSpec], worker: Optional[int], seen: int) -> None:
        """Deliver once the worker, past event number `seen`, entered MLX or reached its next point (it
        had no MLX call to make, e.g. it stopped); after `cap_s` if it did neither. With no `worker` (the
        fault came on the loop): once any other thread entered MLX, or the victim's request ended."""
        deadline = self.loop.time() + self.cap_s
        went_on = None
        went = _worker_went_on(worker) if worker is not None else _mlx_off(thread_token(), cancels[0].victim)
        while self.trace.keep:
            events, end = self.trace.events, len(self.trace.events)
            went_on = next((e for e in events[seen:end] if went(e)), None)
            if went_on is not None or self.loop.time() > deadline:
                break
            seen = end
            await asyncio.sleep(IN_CALL_POLL_S)
        if went_on is None:
            where = "capped"
        else:
            where = f"{'inside' if went_on.kind == 'mlx' and went_on.end is None else 'past'} {went_on.name}"
        self.trace.record("fault", "in-call", cancels[0].victim, info={"at": str(cancels[0].at), "worker": where})
        self._deliver_each(cancels)

    def _deliver_each(self, faults: list[Trigger]) -> None:
        for fault in faults:
            self._track(self._deliver(fault))

    def _pause_for(self, faults: list[Trigger]) -> None:
        resume = threading.Event()
        try:
            self.loop.call_soon_threadsafe(self._start_delivery, faults, resume)
        except RuntimeError:  # the loop is closed: the scenario is over
            return
        self.paused += 1
        try:
            if not resume.wait(self.cap_s):
                self.trace.record("fault", "resume-capped", faults[0].at.rid if faults else None,
                                  info={"cap_s": self.cap_s})
        finally:
            self.paused -= 1

    def _start_delivery(self, faults: list[Trigger], resume: threading.Event) -> None:
        self._track(self._deliver_all(faults, resume))

    def _track(self, pending: Optional[Awaitable[None]]) -> None:
        if pending is None:
            return
        task = self.loop.create_task(pending, name="fuzz-delivery")  # type: ignore[arg-type]
        self.deliveries.add(task)
        task.add_done_callback(self.deliveries.discard)

    async def _deliver_all(self, faults: list[Trigger], resume: threading.Event) -> None:
        try:
            for fault in faults:
                rest = self._deliver(fault)
                if rest is not None:
                    await rest
            await wait_loop_idle()
        finally:
            resume.set()

    def _on_loop_thread(self) -> bool:
        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:
            return False
