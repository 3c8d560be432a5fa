"""Executor policies: what `asyncio.to_thread` and `run_in_executor(None, ...)` land on.

The scenario's `executor` field installs one of these as the loop's default
executor, so an engine that hands MLX work to "some thread" is exercised on a
stable thread, on two threads taking turns, and on a plain pool. Engines with
their own owner thread must hold every invariant under all three.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import threading
from typing import Any, Callable

THREAD_PREFIX = "fuzz-executor"


class CountingExecutor(concurrent.futures.ThreadPoolExecutor):
    """Dispatches to one of its single-thread lanes by `pick` (or, with no lanes, to its own pool),
    counting jobs still running. A ThreadPoolExecutor because asyncio accepts nothing else."""

    def __init__(self, lanes: int, pick: Callable[[], int], label: str, pool_size: int = 1):
        super().__init__(pool_size, thread_name_prefix=f"{THREAD_PREFIX}-{label}")
        self._lanes = [
            concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"{THREAD_PREFIX}-{label}{i}")
            for i in range(lanes)
        ]
        self._pick = pick
        self._count_lock = threading.Lock()
        self.busy = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        with self._count_lock:
            self.busy += 1
        if self._lanes:
            future = self._lanes[self._pick() % len(self._lanes)].submit(fn, *args, **kwargs)
        else:
            future = super().submit(fn, *args, **kwargs)
        future.add_done_callback(self._done)
        return future

    def _done(self, _future: concurrent.futures.Future) -> None:
        with self._count_lock:
            self.busy -= 1

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        for lane in self._lanes:
            lane.shutdown(wait=wait, cancel_futures=cancel_futures)
        super().shutdown(wait=wait, cancel_futures=cancel_futures)


class EngineExecutors:
    """The executors one engine is served with over its life, one per policy, each made on first use.

    A kept engine meets the same threads scenario after scenario, as a deployed engine meets the same
    default pool: a new executor per scenario would move its work onto a brand-new thread every time,
    a condition no deployment creates (and one the MLX thread oracles would then report).
    """

    def __init__(self) -> None:
        self._made: dict[str, CountingExecutor] = {}

    def for_policy(self, policy: str) -> CountingExecutor:
        if policy not in self._made:
            self._made[policy] = make_executor(policy)
        return self._made[policy]

    @property
    def busy(self) -> int:
        """Jobs still running on any of them."""
        return sum(executor.busy for executor in self._made.values())

    def shutdown(self) -> None:
        """Once the engine is retired: its threads go (without waiting for a wedged job)."""
        for executor in self._made.values():
            executor.shutdown(wait=False)
        self._made.clear()


def make_executor(policy: str) -> CountingExecutor:
    """"owner": one stable thread; "alternate": two threads strictly taking turns; "pool": a plain
    four-thread pool where the pool decides."""
    if policy == "owner":
        return CountingExecutor(1, lambda: 0, "owner")
    if policy == "alternate":
        turns = itertools.count()
        return CountingExecutor(2, lambda: next(turns), "alt")
    if policy == "pool":
        return CountingExecutor(0, lambda: 0, "pool", pool_size=4)
    raise ValueError(f"unknown executor policy {policy!r}; use owner, alternate or pool")
