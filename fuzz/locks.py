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
from typing import Iterator

from fuzz.trace import Trace, capture_stack


class LockReentered(RuntimeError):
    """A task tried to acquire an asyncio lock it already holds."""


class OwnedLock(asyncio.Lock):
    trace: Trace | None = None  # set by watch_locks for the scenario being run

    def __init__(self) -> None:
        super().__init__()
        self._trace = OwnedLock.trace  # the scenario this lock was built in, even after the watch ends
        self._holder: asyncio.Task | None = None
        self._holder_stack: tuple[str, ...] = ()

    async def acquire(self) -> bool:
        task = asyncio.current_task()
        if task is not None and task is self._holder:
            stack = capture_stack(1)
            if self._trace is not None:
                self._trace.record("lock", "reentered", info={"task": task.get_name(),
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
def watch_locks(trace: Trace) -> Iterator[None]:
    """Make `asyncio.Lock()` build `OwnedLock`s recording into `trace` until the block ends."""
    original = asyncio.Lock
    OwnedLock.trace = trace
    asyncio.Lock = OwnedLock  # type: ignore[misc]
    try:
        yield
    finally:
        asyncio.Lock = original  # type: ignore[misc]
        OwnedLock.trace = None
