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

Threads: everything here runs on the caller's thread, which runs the loop
only while a scenario runs; between scenarios the loop is idle and the
engine's own threads wait for work.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable, Optional

from mlx_invariants.fuzz.adapters.base import Adapter
from mlx_invariants.fuzz.driver import DriverSettings, _close_loop, _logs_into, _Run
from mlx_invariants.fuzz.executors import make_executor
from mlx_invariants.fuzz.locks import LockWatch, watch_locks
from mlx_invariants.fuzz.scenario import Scenario
from mlx_invariants.fuzz.sentinel import Sentinel
from mlx_invariants.fuzz.trace import Trace


class EngineSession:
    """Runs scenarios on one engine built by `factory`; `reuse=False` starts a fresh one for each."""

    def __init__(self, factory: Callable[[], Adapter], sentinel: Sentinel,
                 settings: DriverSettings = DriverSettings(), reuse: bool = True):
        self.factory, self.sentinel, self.settings, self.reuse = factory, sentinel, settings, reuse
        self.adapter: Optional[Adapter] = None
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self.running = False       # the adapter started and has not been shut down
        self.served = 0            # scenarios the current engine ran before the one running now
        self.starts = 0            # engines built so far
        self.threads_before: set[threading.Thread] = set()  # threads alive before the engine started
        self.last: Optional[Scenario] = None
        self._locks = LockWatch()  # the engine's asyncio locks record into the running scenario's trace

    def run(self, scenario: Scenario, expected_followup: Optional[list[Any]] = None, *,
            keep: Optional[bool] = None) -> Trace:
        """Run `scenario` (on the kept engine if there is one) and keep the engine if it is still clean;
        `keep=False` shuts it down after this scenario whatever happens."""
        keep = self.reuse if keep is None else keep
        trace = Trace()
        trace.meta.update(scenario=scenario.to_json(), lag_bound_s=self.settings.lag_bound_s)
        executor = make_executor(scenario.executor)
        run: Optional[_Run] = None
        try:
            with watch_locks(self._locks), _logs_into(trace):
                self._locks.trace = trace
                fresh = self.adapter is None
                if fresh:
                    self._open()  # engines build their asyncio locks under the watch
                self.loop.set_default_executor(executor)
                self.loop.set_debug(scenario.debug)
                trace.meta.update(engine=self.adapter.name, busy_bound_s=self.adapter.busy_bound_s,
                                  owner=self.adapter.owner, reused=self.served)
                self.sentinel.owner = self.adapter.owner
                self.sentinel.attach(trace, forget_owner=fresh)
                run = _Run(self, scenario, trace, executor, expected_followup, keep)
                self.loop.run_until_complete(self.loop.create_task(run.main(), name="fuzz-main"))
        finally:
            if self.adapter is not None:
                self.adapter.set_point_hook(None)
            self.sentinel.attach(Trace(), forget_owner=False)
            self.last = scenario
            if run is not None and run.kept:
                self.served += 1
                executor.shutdown(wait=False)  # idle: the scenario's executor had no job left
            else:
                self._retire()
        return trace

    def close(self) -> Optional[Trace]:
        """Shut a kept engine down with every after-shutdown check. Returns that trace (its meta names
        the scenario run last as "after"), or None if no engine was kept."""
        if self.adapter is None:
            return None
        last = self.last
        trace = self.run(Scenario((), followup=False), keep=False)
        trace.meta["after"] = last.to_json() if last is not None else None
        self.last = last
        return trace

    def _open(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.adapter = self.factory()
        self.running = False
        self.served = 0
        self.starts += 1

    def _retire(self) -> None:
        """Drop the engine (shut down, failed to start, or wedged past the backstop and abandoned, as
        `_close_loop` abandons a wedged task) and close its loop."""
        loop, self.loop, self.adapter, self.running, self.served = self.loop, None, None, False, 0
        if loop is not None:
            _close_loop(loop)
