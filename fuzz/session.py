"""`EngineSession`: one started engine and its event loop, reused by scenario after scenario.

Starting an engine (load, warm-up, a new owner thread) costs more than most
scenarios, so a fuzz run keeps one engine as long as the scenarios leave it
clean. A scenario is run on the kept engine unless none is kept; afterwards
the engine is kept only if nothing was violated, it is healthy, it holds no
slot, queue entry or request, and nothing the scenario started (executor
job, task, thread) still runs. Otherwise, and after a `shutdown` fault, it is
shut down inside that scenario with every after-shutdown check, exactly as
in the fresh-engine mode, and the next scenario starts a fresh engine on a
fresh loop. So a violation is always seen with the engine state that caused
it, and the runner re-runs it on a fresh engine before believing it.

`run_scenario` is the one-scenario case: a fresh engine, shut down after.

Threads: everything here runs on the caller's thread, which runs the loop
only while a scenario runs; between scenarios the loop is idle and the
engine's own threads wait for work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Callable, Iterator, Optional

from mlx_invariants.fuzz.adapters.base import Adapter, capacity_of, points_of
from mlx_invariants.fuzz.driver import DriverSettings, LiveEngine, ScenarioRun
from mlx_invariants.fuzz.faults import wait_loop_idle
from mlx_invariants.fuzz.locks import LockWatch, watch_locks
from mlx_invariants.fuzz.scenario import Scenario
from mlx_invariants.fuzz.sentinel import Sentinel
from mlx_invariants.fuzz.trace import Trace


def run_scenario(adapter_factory: Callable[[], Adapter], scenario: Scenario, *,
                 sentinel: Optional[Sentinel] = None, expected_followup: Optional[list[Any]] = None,
                 settings: DriverSettings = DriverSettings()) -> Trace:
    """Run `scenario` on a fresh adapter and shut it down; pass an installed `sentinel` to reuse it."""
    own_sentinel = sentinel is None
    if sentinel is None:
        sentinel = Sentinel(strict=settings.strict).install()
    try:
        return EngineSession(adapter_factory, sentinel, settings, reuse=False).run(scenario, expected_followup)
    finally:
        if own_sentinel:
            sentinel.uninstall()


class EngineSession:
    """Runs scenarios on one engine built by `factory`; `reuse=False` starts a fresh one for each."""

    def __init__(self, factory: Callable[[], Adapter], sentinel: Sentinel,
                 settings: DriverSettings = DriverSettings(), reuse: bool = True):
        self.factory, self.sentinel, self.settings, self.reuse = factory, sentinel, settings, reuse
        self.engine: Optional[LiveEngine] = None  # the kept engine, if any
        self.served = 0            # scenarios the current engine ran before the one running now
        self.starts = 0            # engines built so far
        self.last: Optional[Scenario] = None
        self._locks = LockWatch()  # the engine's asyncio locks record into the running scenario's trace

    def run(self, scenario: Scenario, expected_followup: Optional[list[Any]] = None, *,
            keep: Optional[bool] = None) -> Trace:
        """Run `scenario` (on the kept engine if there is one) and keep the engine if it is still clean;
        `keep=False` shuts it down after this scenario whatever happens."""
        keep = self.reuse if keep is None else keep
        trace = Trace()
        trace.meta.update(scenario=scenario.to_json(), lag_bound_s=self.settings.lag_bound_s)
        run: Optional[ScenarioRun] = None
        try:
            with watch_locks(self._locks), _logs_into(trace):
                self._locks.trace = trace
                fresh = self.engine is None
                engine = self._open() if fresh else self.engine  # its asyncio locks are built under the watch
                adapter, loop = engine.adapter, engine.loop
                executor = engine.executors.for_policy(scenario.executor)
                loop.set_default_executor(executor)
                loop.set_debug(scenario.debug)
                trace.meta.update(engine=adapter.name, busy_bound_s=adapter.busy_bound_s,
                                  owner=adapter.owner, reused=self.served)
                self.sentinel.owner = adapter.owner
                self.sentinel.attach(trace, forget_owner=fresh)
                run = ScenarioRun(engine, self.settings, scenario, trace, engine.executors, expected_followup, keep)
                loop.run_until_complete(loop.create_task(run.main(), name="fuzz-main"))
                trace.meta["capacity"] = capacity_of(adapter)  # known once the engine started
                trace.meta["declared_points"] = points_of(adapter)
        finally:
            if self.engine is not None:
                self.engine.adapter.set_point_hook(None)
            self.sentinel.attach(Trace(), forget_owner=False)
            self.last = scenario
            if run is not None and run.kept:
                self.served += 1
            else:
                self._retire()
        return trace

    def close(self) -> Optional[Trace]:
        """Shut a kept engine down with every after-shutdown check. Returns that trace (its meta names
        the scenario run last as "after"), or None if no engine was kept."""
        if self.engine is None:
            return None
        last = self.last
        trace = self.run(Scenario((), followup=False), keep=False)
        trace.meta["after"] = last.to_json() if last is not None else None
        self.last = last
        return trace

    def _open(self) -> LiveEngine:
        loop = asyncio.new_event_loop()
        try:
            self.engine = LiveEngine(self.factory(), loop, forget_owner=self._forget_owner)
        except BaseException:
            loop.close()  # no engine to retire: only the loop to close
            raise
        self.served = 0
        self.starts += 1
        return self.engine

    def _forget_owner(self) -> None:
        """The engine starts again inside a scenario (a restart): its new threads own MLX from now on."""
        self.sentinel.attach(self.sentinel.trace, forget_owner=True)

    def _retire(self) -> None:
        """Drop the engine (shut down, failed to start, or wedged past the backstop and abandoned, as
        `_close_loop` abandons a wedged task) and close its loop."""
        engine, self.engine, self.served = self.engine, None, 0
        if engine is not None:
            _close_loop(engine.loop)
            engine.executors.shutdown()


@contextlib.contextmanager
def _logs_into(trace: Trace) -> Iterator[None]:
    """Engine log records (warnings and worse) become trace events instead of stderr noise."""
    handler = _TraceLogHandler(trace)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)


class _TraceLogHandler(logging.Handler):
    def __init__(self, trace: Trace):
        super().__init__(logging.WARNING)
        self.trace = trace

    def emit(self, record: logging.LogRecord) -> None:
        self.trace.record("log", record.levelname.lower(), info={"logger": record.name,
                                                                  "message": record.getMessage()})


def _close_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what is left, give it a bounded chance to finish, close; a wedged task is abandoned."""
    leftover = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in leftover:
        task.cancel()
    if leftover:
        loop.run_until_complete(wait_loop_idle())
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()


