"""Run one scenario against an engine, on an event loop, and return its trace.

The driver only records facts: what each client saw, which faults landed
where, what the engine reported afterwards. `oracles.judge(trace)` decides
what is wrong. Nothing here waits on a timer to order events: faults ride on
points, and "is it stuck?" is asked of the loop and the threads themselves
(everything parked, nothing ready: `fuzz.liveness`) before a wall-clock
backstop applies. What an engine must not leave behind once it shut down is
checked by `fuzz.leftovers`.

`ScenarioRun` is one scenario on a `LiveEngine`; `fuzz.session.EngineSession`
keeps that engine from scenario to scenario while each leaves it clean, and
`fuzz.session.run_scenario` runs one scenario on a fresh engine.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import traceback
from dataclasses import dataclass, field, replace
from typing import Any, Awaitable, Callable, Optional

from mlx_invariants.fuzz.adapters.base import Adapter, Handle
from mlx_invariants.fuzz.collect import harness_collect
from mlx_invariants.fuzz.compute import gone_clients, watch_gone
from mlx_invariants.fuzz.differential import AloneCache, compare_alone
from mlx_invariants.fuzz.errors import Refused
from mlx_invariants.fuzz.executors import EngineExecutors
from mlx_invariants.fuzz.faults import Arrival, Injector, Trigger, wait_loop_idle
from mlx_invariants.fuzz.followup import FollowupOutcome
from mlx_invariants.fuzz.leftovers import check_stray_tasks, check_threads, new_tasks, new_threads, record_waiters
from mlx_invariants.fuzz.liveness import (TICK_S, StallWatch, doing, in_mlx_call, quiescent, slow_in_mlx, stacks,
                                          wait_settled)
from mlx_invariants.fuzz.oracles import RELEASE_GRACE_TURNS, judge
from mlx_invariants.fuzz.rest import RestSeries, lingering, own_threads, sample_here, server_floor
from mlx_invariants.fuzz.scenario import AFTER_END_POINTS, WORKER_FAULTS, FaultKind, RequestSpec, Scenario
from mlx_invariants.fuzz.trace import Trace, thread_token
from mlx_invariants.fuzz.transport import Answer

_RUNS = itertools.count(1)
AFTER_CALL_S = 0.25  # after an MLX call returned, what the release it held up takes to land (`_status_after_grace`)


@dataclass(frozen=True)
class DriverSettings:
    quiet_ticks: int = 3          # ticks with every thread parked and the loop idle: stalled
    stall_s: float = 5.0          # backstop: no progress at all for this long
    cap_s: float = 2.0            # a paused worker resumes after this even if the loop never idles
    backstop_s: float = 60.0      # the whole scenario, once its engine started
    start_s: float = 60.0         # a fresh engine's start, timed apart from the scenario (`_start_in_time`)
    lag_bound_s: float = 2.0
    strict: bool = False          # the sentinel refuses bad entries instead of only recording them
    step_s: float = 0.0           # one decode step as the runner measured it (fuzz.pace); 0: not measured
    mlx_per_step: float = 0.0     # MLX entries per decode step on the baseline (fuzz.pace); 0: not measured
    mlx_step_s: float = 0.0       # MLX time per decode step on the baseline (fuzz.pace); 0: not measured
    followup: RequestSpec = RequestSpec("followup", prompt_len=5, max_tokens=6, stream=True)


@dataclass
class LiveEngine:
    """One engine as it lives across the scenarios it serves: built by the session, started by the first
    scenario run on it, shut down by the last."""

    adapter: Adapter
    loop: asyncio.AbstractEventLoop
    running: bool = False  # started and not shut down
    # Alive before it started: any other thread still alive after its shutdown is one it leaked.
    threads_before: set[threading.Thread] = field(default_factory=set)
    # Called before it starts again inside a scenario (a "restart" fault): the sentinel forgets which
    # thread owned MLX, since the second run's owner is a new thread.
    forget_owner: Callable[[], None] = lambda: None
    # What `asyncio.to_thread` and `run_in_executor(None, ...)` land on, kept for the engine's whole life.
    executors: EngineExecutors = field(default_factory=EngineExecutors)
    # Each request's greedy answer alone on this engine, by prompt (fuzz/differential.py).
    alone: AloneCache = field(default_factory=AloneCache)
    # Its rest state after each scenario it served (`fuzz.rest`).
    rest: RestSeries = field(default_factory=RestSeries)


@dataclass
class Client:
    spec: RequestSpec
    task: Optional[asyncio.Task] = None
    handle: Optional[Handle] = None
    disconnected: bool = False
    abort_pending: bool = False
    answered: bool = False  # its outcome is known (refused, ended, failed) or it went away; only its close may remain
    tokens: list[Any] = field(default_factory=list)


class ScenarioRun:
    """One scenario on `engine` (run `main()` on its loop), starting the engine first if it is not running.

    Afterwards the engine is either kept for the next scenario (`kept`), or shut
    down here with every after-shutdown check recorded into this trace.
    """

    def __init__(self, engine: LiveEngine, settings: DriverSettings, scenario: Scenario, trace: Trace,
                 executor: EngineExecutors, expected_followup: Optional[FollowupOutcome], keep: bool):
        self.engine, self.adapter, self.loop = engine, engine.adapter, engine.loop
        self.scenario, self.trace, self.executor = scenario, trace, executor
        self.settings, self.expected_followup, self.keep = settings, expected_followup, keep
        self.kept = False
        self.clients = {r.rid: Client(r) for r in scenario.requests}
        self.settled_for_late = False  # waited once for the engine to settle before sending arrivals still due
        triggers = list(scenario.faults) + [Arrival(r.rid, r.arrival) for r in scenario.requests if r.arrival]
        # Engine-side request ids carry a per-run suffix, so a point reached by an earlier run's
        # leftover coroutine (finalized during this run) is never mistaken for one of ours.
        self.suffix = f"~{next(_RUNS)}"
        # A launched server's records reader (its MLX is seen afterwards, from a file); None in-process.
        self.collect = getattr(self.adapter, "collect", None)
        # A launched server with the sentinel's worker switch: worker faults are armed in it (fuzz/worker_switch.py).
        arm = self.adapter.arm_worker_fault if getattr(self.adapter, "arms_worker_faults", False) else None
        self.injector = Injector(trace, self.loop, triggers, self._deliver, cap_s=self.settings.cap_s,
                                 suffix=self.suffix, live_mlx=self.collect is None, arm=arm,
                                 invariants=getattr(self.adapter, "broken_invariants", None))
        self.shutdown_task: Optional[asyncio.Task] = None
        self.restart_task: Optional[asyncio.Task] = None  # the latest "restart": True once it serves again
        self.shutdown_stalled = False  # a shutdown never returned: nothing after it is waited for
        self.max_lag = 0.0
        self.lag_window = (0.0, 0.0)
        self.tasks_before: set[asyncio.Task] = set()
        self.threads_before: set[threading.Thread] = set()

    async def main(self) -> None:
        self.loop.set_exception_handler(self._loop_error)
        self.adapter.set_point_hook(self.injector.hook)
        if not await self._start_in_time():
            return
        body = self.loop.create_task(self._body(), name="fuzz-body")
        done, _ = await asyncio.wait({body}, timeout=self.settings.backstop_s)
        self.injector.release_wedged()  # whatever happened, no worker stays blocked in the hook
        if not done:
            self._record_stall("backstop", [c.spec.rid for c in self._unfinished()] or ["scenario"])
        elif body.exception() is not None:
            raise body.exception()  # a driver bug: let it surface with its traceback

    async def _body(self) -> None:
        self.trace.meta["stall_timeout_s"] = getattr(self.adapter, "stall_timeout_s", None)  # its promise, if any
        lag = self.loop.create_task(self._watch_lag(), name="fuzz-lag")
        for client in self.clients.values():
            if client.spec.arrival is None:
                self._launch(client)
        live = await self._wait_clients()
        await self.injector.disarm_unfired()  # a worker fault armed in a server fired by now, or never will
        if self._lost_worker() is not None:
            await self._after_worker_fault()
            live = live and await self._wait_clients()  # the closes a wedged worker held up end once it goes on
        # An engine that lost its worker is judged by what it said and did since (fuzz/lost_worker.py), and
        # retired: its books are not read, nor the MLX its gone clients cost. A wedged worker let go drains what
        # it held in its own time, after a stall the engine may need moments to notice (a launched server's books
        # showed requests still held, 0 of 3 replays; on a GPU its released owner ran 12 steps, 1 of 3).
        books = self._lost_worker() is None
        gone = gone_clients(self.trace) if live and books and self.shutdown_task is None else []
        if gone:  # before the follow-up: the MLX a gone client still costs (fuzz/compute.py)
            await watch_gone(self.trace, gone, self.settings, self.collect)
        rest = None
        if live and self.shutdown_task is None and self.scenario.followup:
            # At rest once the scenario's own requests ended, before the follow-up decodes beside what they left.
            if books:
                self.trace.record("check", "status", info=await self._status_after_grace())
            rest = await self._rest_before_followup()
            live = await self._followup()
        if live and self.shutdown_task is None:
            await compare_alone(self)  # each request's answer alone, after the follow-up (fuzz/differential.py)
            if books:
                self.trace.record("check", "status", info=await self._status_after_grace())
            if rest is not None:
                await self._record_rest(*rest)
        lag.cancel()
        self.trace.record("check", "loop-lag", info={
            "max_s": round(self.max_lag, 4), "window": [round(t, 4) for t in self.lag_window],
            "loop_thread": thread_token(), "in_process": self.collect is None})
        if self.keep and live and self.shutdown_task is None and await self._fit_for_next():
            self.kept = True
            return
        await self._shutdown_and_check(live)

    def _lost_worker(self) -> Optional[str]:
        """The worker fault ("worker-dies", "worker-wedges") delivered in this scenario, if any."""
        return next((kind for kind in WORKER_FAULTS if self.trace.of("fault", kind)), None)

    async def _after_worker_fault(self) -> None:
        """Once the requests were answered, went away or stalled after a worker fault: record whether the
        adapter still called the engine healthy, then let a wedged worker go on. A wedged worker's engine is
        given its declared stall bound (the fuzzer's, if it declares none) from the wedge, plus a second, to
        stop calling itself healthy: health read earlier says nothing."""
        fault = self._lost_worker()
        # A restart or shutdown since then (it also let a wedged worker go) made the health another run's.
        restarted = any(self.trace.of("fault", k.value) for k in (FaultKind.RESTART, FaultKind.SHUTDOWN))
        wedge = self.trace.first("fault", FaultKind.WORKER_WEDGES.value)
        if self.injector.wedged and not restarted:
            bound = self.trace.meta.get("stall_timeout_s") or self.settings.stall_s
            while getattr(self.adapter, "healthy", None) is True and self.trace.now() < wedge.t + bound + 1.0:
                await asyncio.sleep(TICK_S)
        healthy = getattr(self.adapter, "healthy", None)
        if isinstance(healthy, bool) and not restarted:
            self.trace.record("check", "health", info={"healthy": healthy, "fault": fault})
        self.injector.release_wedged()

    async def _start_in_time(self) -> bool:
        """`_started` under its own bound, `start_s`, before the scenario's backstop begins: a first start that
        imports and loads for a minute is the engine's time, not the scenario's (nor its follow-up's). A start
        that does not return within it is a stall of the start, named so; a fresh engine's start time goes to
        the trace's meta (`start_s`)."""
        fresh, began = not self.engine.running, self.loop.time()
        start = self.loop.create_task(self._started(), name="fuzz-start")
        done, _ = await asyncio.wait({start}, timeout=self.settings.start_s)
        if not done:
            self._record_stall("start", ["start"], bound_s=self.settings.start_s)
            return False
        if fresh:
            self.trace.meta["start_s"] = round(self.loop.time() - began, 3)
        return start.result()

    async def _started(self) -> bool:
        """Start the engine unless it is already running, then wait for it to settle; False (recorded) if
        it failed to start."""
        if not self.engine.running:
            self.engine.threads_before = set(threading.enumerate())
            try:
                await self.adapter.start()
            except Exception as exc:
                self.trace.record("check", "startup-failed", info={"error": f"{type(exc).__name__}: {exc}"})
                return False
            self.engine.running = True
        # A fresh engine's owner may still be on its way from "ready" to waiting for work, and the first
        # requests must not race it: so every scenario begins with the engine waiting for work (every other
        # thread parked), whether it was just started or reused.
        if not await wait_settled(self.loop, self.injector, self.settings.cap_s):
            self.trace.record("check", "start-unsettled", info={"cap_s": self.settings.cap_s})
        # What the engine started for itself is not this scenario's (it is checked after shutdown).
        self.threads_before = set(threading.enumerate())
        self.tasks_before = set(asyncio.all_tasks(self.loop))
        return True

    async def _rest_before_followup(self) -> Optional[tuple[Any, set[threading.Thread], bool]]:
        """In-process, once the scenario's own requests ended and the engine settled: its rest sample, the
        threads alive and whether it is warm (it completed a request before, and neither restarted nor lost
        its worker in this scenario). None for a launched server, whose sentinel samples it (`fuzz.rest`)."""
        if self.collect is not None:
            return None
        await wait_settled(self.loop, self.injector, self.settings.cap_s)
        lost = [f for f in self.trace.of("fault") if f.name.startswith("worker-")]  # it died or wedged
        warm = (self.engine.rest.completed + self._completed() > 0 and not lost
                and not self.trace.of("fault", FaultKind.RESTART.value))
        return sample_here(), set(own_threads()), warm

    async def _record_rest(self, before: Any, threads: set[threading.Thread], warm: bool) -> None:
        """After the follow-up, at rest again: what it left behind, and the engine's rest series."""
        await wait_settled(self.loop, self.injector, self.settings.cap_s)
        after = sample_here()
        left = lingering(threads) if warm else []
        self.engine.rest.completed += self._completed()
        series = self.engine.rest.add(after) if warm else []
        self.trace.record("check", "rest", info={"before": before.to_json(), "after": after.to_json(),
                                                 "warm": warm, "threads_left": left, "series": series})

    def _completed(self) -> int:
        return sum(1 for e in self.trace.of("request", "end") if e.info.get("outcome") == "completed")

    def _record_server_rest(self) -> None:
        """A launched server's rest floor in this scenario (its sentinel's samples), onto its series."""
        floor, series = server_floor(self.trace), getattr(self.adapter, "rest_series", None)
        if floor is not None and series is not None:
            window = series.add(floor, len(self.scenario.requests) + 1)  # the follow-up too
            self.trace.record("check", "rest", info={"series": window, "where": "server",
                                                     "pool_bound": series.pool_bound})

    async def _fit_for_next(self) -> bool:
        """Whether the engine may take the next scenario as it stands: nothing was violated, it is healthy,
        and nothing this scenario started (executor job, task, thread) still runs. If not, it is shut down
        inside this scenario, so every after-shutdown check is judged against the scenario that caused it."""
        await wait_loop_idle()
        harness_collect()  # as after a shutdown: what this scenario left unretrieved is judged against it
        await wait_loop_idle()
        if self.collect is not None:
            self.collect(self.trace)  # a server's spans count before deciding
            self._record_server_rest()
        # An engine whose worker was lost is not kept, however it recovered (`healthy` None: not known).
        if judge(self.trace) or getattr(self.adapter, "healthy", True) is False or self.executor.busy \
                or self._lost_worker() is not None:
            return False
        if self.restart_task is not None and not self.restart_task.done():
            return False  # a restart delivered late (after the last client ended) is still on its way
        return not new_tasks(self.loop, self.tasks_before) and not new_threads(self.threads_before)

    async def _status_after_grace(self) -> dict[str, Any]:
        """The engine's status once a release already on its way has landed: while it shows something held,
        up to `RELEASE_GRACE_TURNS` loop turns (1 ms naps), and on while an MLX call runs (`in_mlx_call`),
        before it is recorded as it stands."""
        status = self.adapter.status()
        for _ in range(RELEASE_GRACE_TURNS):
            if not any(isinstance(v, int) and v for v in status.values()):
                return status
            await asyncio.sleep(0.001)
            status = self.adapter.status()
        # A launched server hears of a gone client only when it next writes to it: it gets a longer grace.
        deadline = self.loop.time() + getattr(self.adapter, "release_grace_s", 0.0)
        while any(isinstance(v, int) and v for v in status.values()):
            # A seat is let go once its worker's MLX call returns, and one call (a long prefill) cannot be cut
            # short: while one runs, and a moment after, the books wait (a loaded box took 2.2 s for one prefill).
            if in_mlx_call(self.trace):
                deadline = max(deadline, self.loop.time() + AFTER_CALL_S)
            elif self.loop.time() >= deadline:
                break
            await asyncio.sleep(0.02)
            status = self.adapter.status()
        return status

    # -- clients ------------------------------------------------------------------
    def _launch(self, client: Client) -> None:
        if client.task is None:
            client.task = self.loop.create_task(self._client(client), name=f"fuzz-client-{client.spec.rid}")

    async def _client(self, client: Client) -> None:
        rid, spec = client.spec.rid, client.spec
        self.trace.record("request", "submit", rid, info={"stream": spec.stream, "max_tokens": spec.max_tokens,
                                                          **_asked(spec)})
        started = self.loop.time()
        end: dict[str, Any] = {"outcome": "cancelled"}
        stack: tuple[str, ...] = ()
        try:
            try:
                client.handle = await self.adapter.submit(replace(spec, rid=rid + self.suffix))
            except Refused as exc:
                end = {"outcome": "refused", "code": exc.code, "message": str(exc),
                       "elapsed_s": round(self.loop.time() - started, 4), **_answer_info(exc.answer)}
                return
            if client.abort_pending:
                self._abort(client)
            if spec.stream:
                async for token in client.handle:
                    client.tokens.append(token)
            else:
                await client.handle.wait_ended()
            outcome = client.handle.outcome()
            end = {"outcome": outcome.kind, "reason": outcome.reason, "message": outcome.message,
                   "tokens": len(client.tokens), **_answer_info(outcome.answer)}
        except asyncio.CancelledError:
            end = {"outcome": "disconnected" if client.disconnected else "cancelled"}
            if not client.disconnected:
                raise
            asyncio.current_task().uncancel()
        except Exception as exc:
            end, stack = _crashed(exc)
        finally:
            client.answered = True  # it has its answer, or went away: only the close is left
            try:
                if client.handle is not None:
                    await client.handle.close()
            except Exception as exc:
                end, stack = _crashed(exc, "close: ")
            finally:
                returned = getattr(client.handle, "returned", None)  # what it saw, also of a cancelled answer
                self.trace.record("request", "end", rid, info={**end, **(returned.to_info() if returned else {})},
                                  stack=stack)

    async def _followup(self) -> bool:
        """One greedy request after the scenario; its tokens must match a fresh engine's."""
        if not await self._restarted():  # one delivered at a point reached after its client ended
            return False
        client = self.clients["followup"] = Client(self.settings.followup)
        self._launch(client)
        if not await self._wait_clients():
            return False
        got = FollowupOutcome.of(self.trace.of("request", "end", "followup")[-1].info, client.tokens)
        self.trace.meta["followup"] = got.to_json()
        if self.shutdown_task is not None:
            # A shutdown delivered at a point its request reached after its client ended (the owner's last
            # point comes after the answer): the follow-up met a shutdown the scenario asked for, so whatever
            # it got says nothing of the engine. What the shutdown leaves behind is judged as any other.
            return True
        # After its worker died or wedged an engine cannot answer as a fresh one does: the follow-up must only end
        # or be refused (a hang is a stall, judged by `hang-after-worker-fault`), whatever it returned.
        if self.expected_followup is not None and self._lost_worker() is None:
            self.trace.record("check", "followup", info={"got": got.to_json(),
                                                         "expected": self.expected_followup.to_json()})
        return True

    # -- faults ---------------------------------------------------------------------
    def _deliver(self, trigger: Trigger) -> Optional[Awaitable[None]]:
        """Deliver `trigger` now, on the loop: an arrival sends its request, a fault goes by its kind's row
        of `DELIVERIES`; a second cancel comes back as the rest to await."""
        if isinstance(trigger, Arrival):
            self._arrive(trigger)
            return None
        kind = FaultKind(trigger.kind)
        if kind in (FaultKind.SHUTDOWN, FaultKind.RESTART):
            # A stuck thread outlives any shutdown: what a shutdown would leave behind then (the thread, the
            # slots it holds, a refused restart) says nothing of the engine, so a wedge ends where one begins.
            self.injector.release_wedged()
        rid = trigger.victim if kind.victim else trigger.at.rid
        client = self.clients[rid]
        info = {"at": str(trigger.at)}
        if rid != trigger.at.rid and (client.task is None or client.task.done()):
            # Another request's client, not started yet or already ended: nothing to hit.
            self.trace.record("fault", kind.value, rid, info={**info, "delivered": False, "client": "absent"})
            return None
        return self.DELIVERIES[kind](self, client, info)

    def _arrive(self, arrival: Arrival) -> None:
        """Send the arriving request, unless a restart is on its way (`_wait_clients` then sends it)."""
        client = self.clients[arrival.rid]
        restarting = self.restart_task is not None and not self.restart_task.done()
        self.trace.record("fault", "arrive", client.spec.rid,
                          info={"at": str(arrival.at), **({"after": "restart"} if restarting else {})})
        if not restarting:
            self._launch(client)

    def _cancel_client(self, client: Client, name: str, info: dict[str, Any], disconnect: bool = False) -> bool:
        """Cancel the client's task (a disconnect: it ends as disconnected); whether the cancel was delivered."""
        client.disconnected = disconnect
        delivered = client.task is not None and client.task.cancel()
        self.trace.record("fault", name, client.spec.rid, info={**info, "delivered": delivered})
        return delivered

    def _deliver_cancel(self, client: Client, info: dict[str, Any]) -> None:
        self._cancel_client(client, "cancel", info)

    def _deliver_disconnect(self, client: Client, info: dict[str, Any]) -> None:
        self._cancel_client(client, "disconnect", info, disconnect=True)

    def _deliver_cancel_twice(self, client: Client, info: dict[str, Any]) -> Optional[Awaitable[None]]:
        return self._cancel_again(client, info) if self._cancel_client(client, "cancel", info) else None

    def _deliver_abort(self, client: Client, info: dict[str, Any]) -> None:
        if client.handle is None:  # not submitted yet: `_client` aborts it once `submit` returned
            client.abort_pending = True
            self.trace.record("fault", "abort-deferred", client.spec.rid, info=info)
        else:
            self._abort(client)

    def _deliver_shutdown(self, client: Client, info: dict[str, Any]) -> None:
        self.trace.record("fault", "shutdown", client.spec.rid, info=info)
        self._start_shutdown()

    def _deliver_restart(self, client: Client, info: dict[str, Any]) -> None:
        self._start_restart(client.spec.rid, info)

    # The faults delivered on the loop, by kind (`Delivery.LOOP`). The fuzz/faults.py injector delivers
    # the others itself: a raise in the worker, a cancel-in-call as a plain cancel here once the worker is
    # inside its MLX call. tests/fuzz/test_vocabulary.py checks every kind is delivered one way or the other.
    DELIVERIES: dict[FaultKind, Callable[["ScenarioRun", Client, dict[str, Any]], Optional[Awaitable[None]]]] = {
        FaultKind.CANCEL: _deliver_cancel,
        FaultKind.ABORT: _deliver_abort,
        FaultKind.DISCONNECT: _deliver_disconnect,
        FaultKind.CANCEL_TWICE: _deliver_cancel_twice,
        FaultKind.SHUTDOWN: _deliver_shutdown,
        FaultKind.RESTART: _deliver_restart,
    }

    async def _cancel_again(self, client: Client, info: dict[str, Any]) -> None:
        """The second cancel of cancel-twice, once the first has been taken (the loop went idle)."""
        await wait_loop_idle()
        again = client.task is not None and not client.task.done() and client.task.cancel()
        self.trace.record("fault", "cancel-again", client.spec.rid, info={**info, "delivered": again})

    def _abort(self, client: Client) -> None:
        acknowledged = client.handle.abort()
        self.trace.record("fault", "abort", client.spec.rid, info={"acknowledged": acknowledged})

    def _start_shutdown(self) -> None:
        if self.shutdown_task is None:
            self.shutdown_task = self.loop.create_task(self._shutdown_after_restart(), name="fuzz-shutdown")

    async def _shutdown_after_restart(self) -> None:
        """The adapter's shutdown, once a restart on its way has ended (a shutdown never overlaps one)."""
        if self.restart_task is not None:
            await asyncio.wait({self.restart_task})
        await self.adapter.shutdown()

    def _start_restart(self, rid: str, info: dict[str, Any]) -> None:
        """Restart the engine after any restart on its way; not once it is shutting down for good or kept
        for the next scenario (a point reached after every client ended)."""
        delivered = self.shutdown_task is None and not self.kept
        self.trace.record("fault", "restart", rid, info={**info, "delivered": delivered})
        if delivered:
            self.restart_task = self.loop.create_task(self._restart(self.restart_task), name="fuzz-restart")

    async def _restart(self, previous: Optional[asyncio.Task]) -> bool:
        """Shut the engine down, check its first run left nothing behind (as after a final shutdown), and
        start it again through the adapter's `start()`; the scenario then goes on on the second run.
        False (recorded) when it cannot go on: shutdown stalled, a client still waits, or start failed."""
        if previous is not None and not await previous:
            return False
        shutdown = self.loop.create_task(self.adapter.shutdown(), name="fuzz-restart-shutdown")
        if not await self._shutdown_returned(shutdown, "restart"):
            self.shutdown_task = shutdown  # wedged: the scenario ends as after a shutdown fault
            return False
        if not await self._check_after_shutdown(live=True):
            return False
        self.engine.running = False
        self.trace.record("engine", "stopped", info={"for": "restart"})
        self.engine.forget_owner()
        if not await self._started():
            return False
        self.trace.record("engine", "restarted")
        return True

    # -- waiting --------------------------------------------------------------------
    def _unfinished(self) -> list[Client]:
        return [c for c in self.clients.values() if c.task is not None and not c.task.done()]

    async def _wait_clients(self) -> bool:
        """Until every client ended (True), or until nothing can run but some have not (False)."""
        seen = len(self.trace.events)
        watch = StallWatch(self.settings.quiet_ticks, self.settings.stall_s, self.loop.time())
        while True:
            if not await self._restarted():
                return False
            if len(self.trace.events) != seen:  # a restart was waited out
                seen = len(self.trace.events)
                watch.saw_progress(self.loop.time())
            # With its worker wedged an engine answers each request (ends it with an error) but may rightly keep
            # the request's slot until the worker returns, so a close still waiting for that (also a gone
            # client's, whose handler drains the worker) is not a hang.
            wedged = self.injector.wedged
            pending = [c.task for c in self._unfinished() if not (wedged and c.answered)]
            if not pending:
                late = [c for c in self.clients.values() if c.task is None]
                if not late:
                    return True
                if any(c.spec.arrival.point in AFTER_END_POINTS for c in late) and not self.settled_for_late:
                    # Aimed at a point marked after its request ended (the owner going idle): it may come yet.
                    self.settled_for_late = True
                    await wait_settled(self.loop, self.injector, self.injector.cap_s)
                    continue
                for client in late:  # its arrival point never came: it arrives now
                    self._launch(client)
                continue
            shutdown = self.shutdown_task
            watching = pending + ([shutdown] if shutdown is not None and not shutdown.done() else [])
            done, _ = await asyncio.wait(watching, timeout=TICK_S, return_when=asyncio.FIRST_COMPLETED)
            if shutdown is not None and shutdown.done():
                # Once shutdown returned nothing may be left waiting: give the loop its turns, then look.
                await wait_loop_idle()
                if self._unfinished():
                    self._record_waiters()
                    return False
                continue
            if done or len(self.trace.events) != seen:
                seen = len(self.trace.events)
                watch.saw_progress(self.loop.time())
                continue
            # Let what is ready run first: the fuzzer's own lag watcher wakes every 20 ms, in step with this
            # 100 ms tick, and a wakeup of it found in the ready queue is not the engine doing anything.
            nothing_runs = await wait_loop_idle() and quiescent(self.loop, self.injector, watch.stall_s)
            if wedged:
                # A wedged worker is parked by design: the engine gets its own stall bound to notice, then ours.
                nothing_runs = False
                watch.stall_s = self.settings.stall_s + (self.trace.meta.get("stall_timeout_s") or 0.0)
            if watch.stalled(self.loop.time(), nothing_runs):
                if not wedged and slow_in_mlx(self.trace, quiet=nothing_runs):
                    continue  # no progress, but an MLX call still runs: slow (a loaded GPU), not stuck
                self._record_stall("stalled", [c.spec.rid for c in self._unfinished()])
                return False

    async def _restarted(self) -> bool:
        """Waits out a restart on its way (it bounds itself); False if one could not go on."""
        return self.restart_task is None or await self.restart_task

    async def _shutdown_and_check(self, live: bool) -> None:
        self._start_shutdown()
        if await self._shutdown_returned(self.shutdown_task, "shutdown"):
            await self._check_after_shutdown(live)

    async def _shutdown_returned(self, shutdown: asyncio.Task, why: str) -> bool:
        """Whether `shutdown` returned within the stall bound (one that raised is recorded and counts as
        returned); a stall is recorded once, and a shutdown that stalled is not waited for again."""
        if self.shutdown_stalled:
            return False
        done, _ = await asyncio.wait({shutdown}, timeout=self.settings.stall_s * 2)
        if not done:
            self.shutdown_stalled = True
            self._record_stall("stalled", [why])
            return False
        if shutdown.exception() is not None:
            exc = shutdown.exception()
            self.trace.record("check", "shutdown-failed", info={"error": f"{type(exc).__name__}: {exc}"})
        return True

    async def _check_after_shutdown(self, live: bool) -> bool:
        """Once shutdown returned: no client waits (if `live`), no executor job, no thread the engine
        started, no stray task. False if a client still waits."""
        await wait_loop_idle()
        harness_collect()  # a future that died with an unretrieved exception is reported now, in this trace
        await wait_loop_idle()
        waiting = live and bool(self._unfinished())
        if waiting:
            self._record_waiters()
        if self.executor.busy:
            self.trace.record("check", "executor-busy", info={"busy": self.executor.busy})
        # One MLX call cannot be cut short: a shutdown that gave up on a thread inside one (a first prefill of a
        # new shape on a shared GPU outlasted 11 s) leaves it to end with the call, slow rather than leaked.
        while in_mlx_call(self.trace):
            await asyncio.sleep(TICK_S)
        check_threads(self.trace, self.engine.threads_before)
        self._record_stopping_health()
        if self.collect is not None:
            self.collect(self.trace)  # events recorded outside this process (a server's injected sentinel)
        await wait_loop_idle()
        check_stray_tasks(self.trace, self.loop)
        return not waiting

    # -- records ------------------------------------------------------------------------
    def _record_stopping_health(self) -> None:
        """What the adapter's health route said while the engine drained and once it stopped, where it reads
        one (`stopping_health`, a served route's), for `health-while-stopping`."""
        readings = getattr(self.adapter, "stopping_health", None)
        while readings:
            self.trace.record("check", "stopping-health", info=readings.pop(0))

    def _record_stall(self, name: str, rids: list[str], **info: Any) -> None:
        report = doing(self.trace, [r for r in rids if r in self.clients]) + stacks(self.loop)
        self.trace.record("check", "stalled", info={"rids": rids, "why": name, "stacks": report, **info})

    def _record_waiters(self) -> None:
        record_waiters(self.trace, self.loop, [c.spec.rid for c in self._unfinished()])

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        text = "".join(traceback.format_exception(exc)) if exc else ""
        self.trace.record("loop", "error", info={"message": context.get("message", ""), "traceback": text})

    async def _watch_lag(self) -> None:
        """The loop's worst lag and when it was (trace time), so the oracle can ask what the loop was doing."""
        period = 0.02
        while True:
            before = self.trace.now()
            await asyncio.sleep(period)
            after = self.trace.now()
            if after - before - period > self.max_lag:
                self.max_lag, self.lag_window = after - before - period, (before + period, after)


def _answer_info(answer: Optional[Answer]) -> dict[str, Any]:
    """How an HTTP server answered a failed request, for `fuzz.transport` (nothing in-process)."""
    return {"answer": answer.to_json()} if answer is not None else {}


def _asked(spec: RequestSpec) -> dict[str, Any]:
    """What a request asked for beyond its length that a client can see honoured (fuzz/surface.py): its stop
    strings and log-probabilities, only where it asked."""
    asked: dict[str, Any] = {"stop": list(spec.stop)} if spec.stop else {}
    if spec.logprobs or spec.top_logprobs:
        asked.update(logprobs=True, top_logprobs=spec.top_logprobs, route=spec.route)
    return asked


def _crashed(exc: BaseException, prefix: str = "") -> tuple[dict[str, Any], tuple[str, ...]]:
    lines = tuple(line.rstrip() for line in traceback.format_exception(exc))
    return {"outcome": "crashed", "error": f"{prefix}{type(exc).__name__}: {exc}"}, lines

