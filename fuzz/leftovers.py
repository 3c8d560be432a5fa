"""What an engine leaves behind: the after-shutdown checks, and what a scenario started that still runs.

Once an engine's shutdown returned, no client may still wait, no executor job
may still run, every thread the engine started must be gone (a short join
allowed) and no task but the fuzzer's own may be left on the loop. The same
"started since, still running" lists decide whether a kept engine is clean
enough for the next scenario. The fuzzer's own tasks are named `TASK_PREFIX`
and its executor threads `executors.THREAD_PREFIX`: neither is a leftover.
"""

from __future__ import annotations

import asyncio
import threading
from typing import AbstractSet

from mlx_invariants.fuzz.executors import THREAD_PREFIX
from mlx_invariants.fuzz.liveness import stacks, thread_stacks
from mlx_invariants.fuzz.trace import Trace

TASK_PREFIX = "fuzz-"
THREAD_JOIN_S = 2.0   # how long a thread the engine started gets to end once shutdown returned


def new_tasks(loop: asyncio.AbstractEventLoop, before: AbstractSet[asyncio.Task] = frozenset()) -> list[asyncio.Task]:
    """Unfinished tasks on `loop` that are not the fuzzer's own and were not there `before`."""
    return [t for t in asyncio.all_tasks(loop) if not t.done() and t not in before
            and not t.get_name().startswith(TASK_PREFIX)]


def new_threads(before: AbstractSet[threading.Thread]) -> list[threading.Thread]:
    """Live threads that are not the fuzzer's executor threads and were not there `before`."""
    return [t for t in threading.enumerate() if t.is_alive() and t not in before
            and not t.name.startswith(THREAD_PREFIX)]


def check_threads(trace: Trace, before: AbstractSet[threading.Thread]) -> None:
    """Threads the engine started (alive now, not `before` it started) must be gone once shutdown returned
    (a short join allowed); those still alive are recorded with every thread's stack."""
    new = new_threads(before)
    for thread in new:
        thread.join(timeout=THREAD_JOIN_S)
    alive = [t for t in new if t.is_alive()]
    if alive:
        trace.record("check", "threads-alive", info={"names": [t.name for t in alive], "stacks": thread_stacks()})


def check_stray_tasks(trace: Trace, loop: asyncio.AbstractEventLoop) -> None:
    """No task but the fuzzer's own may be left on the loop once shutdown returned."""
    stray = new_tasks(loop)
    if stray:
        trace.record("check", "stray-tasks", info={"tasks": [repr(t) for t in stray]})


def record_waiters(trace: Trace, loop: asyncio.AbstractEventLoop, rids: list[str]) -> None:
    """Clients `rids` still wait although shutdown returned: recorded with every task's and thread's stack."""
    trace.record("check", "waiters-after-shutdown", info={"rids": rids, "stacks": stacks(loop)})
