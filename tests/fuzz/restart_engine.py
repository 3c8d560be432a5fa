"""The simple reference engine with what a stop leaves behind planted, for the restart tests (`make_*`
are `--engine tests.fuzz.restart_engine:make_*` factories). A plain shutdown shows neither: after it
nothing runs again, and neither is a count `status()` reports. Only starting the engine again does.

- `make_held_lock`: shutdown takes the generation lock once the owner has stopped, so no job can start
  while the engine is down, and never gives it back: harmless when the process exits next, a wedge
  once the engine starts again (its first request waits for the lock forever: `stalled`).
- `make_stale_flag`: start keeps the "shutting down" flag its last stop set, so the restarted engine
  says it is up and refuses every request (the follow-up is refused: `followup-differs`).
- `make_fixed`: takes the lock while down, as `make_held_lock` does, and gives it back on start.
"""

from __future__ import annotations

from mlx_invariants.engine import SimpleEngine
from mlx_invariants.fuzz.adapters.reference import ReferenceAdapter


class HeldLockEngine(SimpleEngine):
    async def shutdown(self, grace_s: float = 5.0) -> None:
        await super().shutdown(grace_s)
        if not self._generation_lock.locked():
            await self._generation_lock.acquire()  # no job may start while the engine is down


class FixedEngine(HeldLockEngine):
    async def start(self) -> None:
        if self._generation_lock.locked():
            self._generation_lock.release()  # up again: jobs may start
        await super().start()


class StaleFlagEngine(SimpleEngine):
    async def start(self) -> None:
        stopped = self._shutting_down
        await super().start()
        self._shutting_down = stopped


def make_held_lock() -> ReferenceAdapter:
    return ReferenceAdapter(HeldLockEngine, name="held-lock")


def make_stale_flag() -> ReferenceAdapter:
    return ReferenceAdapter(StaleFlagEngine, name="stale-flag")


def make_fixed() -> ReferenceAdapter:
    return ReferenceAdapter(FixedEngine, name="fixed")
