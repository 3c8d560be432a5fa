"""An `asyncio.Lock` that knows which task holds it, so a re-acquire fails at once.

A task awaiting a lock it already holds waits forever: the classic nested
`async with self._lock` deadlock. While `watch_locks()` is active, engines
that create their locks as `asyncio.Lock()` get an `OwnedLock`, which records
the re-acquire (with the holder's stack) and raises `LockReentered` in the
second acquire instead of hanging. Locks bound by `from asyncio import Lock`
before the watch started are not replaced.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Iterator, Optional

from mlx_invariants.fuzz.errors import LockReentered
from mlx_invariants.fuzz.trace import Trace, capture_stack


class LockWatch:
    """Where the locks built under one watch record. An engine outlives a scenario when it is reused,
    so its locks follow `trace`, which the driver points at each scenario in turn."""

    def __init__(self, trace: Optional[Trace] = None):
        self.trace = trace


class OwnedLock(asyncio.Lock):
    watch: LockWatch | None = None  # set by watch_locks while it is active

    def __init__(self) -> None:
        super().__init__()
        self._watch = OwnedLock.watch  # the watch this lock was built under, even after it ends
        self._holder: asyncio.Task | None = None
        self._holder_stack: tuple[str, ...] = ()

    async def acquire(self) -> bool:
        task = asyncio.current_task()
        if task is not None and task is self._holder:
            stack = capture_stack(1)
            trace = self._watch.trace if self._watch is not None else None
            if trace is not None:
                trace.record("lock", "reentered", info={"task": task.get_name(),
                                                        "holder_stack": list(self._holder_stack)}, stack=stack)
            raise LockReentered(f"task {task.get_name()} re-acquired an asyncio.Lock it already holds")
        await super().acquire()
        self._holder = task
        self._holder_stack = capture_stack(1)
        return True

    def release(self) -> None:
        self._holder = None
        self._holder_stack = ()
        super().release()


@contextlib.contextmanager
def watch_locks(target: Trace | LockWatch) -> Iterator[LockWatch]:
    """Make `asyncio.Lock()` build `OwnedLock`s until the block ends; they record into `target` (a trace,
    or a `LockWatch` whose trace the caller moves from scenario to scenario)."""
    watch = target if isinstance(target, LockWatch) else LockWatch(target)
    original = asyncio.Lock
    OwnedLock.watch = watch
    asyncio.Lock = OwnedLock  # type: ignore[misc]
    try:
        yield watch
    finally:
        asyncio.Lock = original  # type: ignore[misc]
        OwnedLock.watch = None
