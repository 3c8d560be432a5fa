"""`fuzz.liveness`: which threads count as parked, and when a quiet wait counts as stalled."""

from __future__ import annotations

import queue
import sys
import threading
import time
from types import SimpleNamespace
from typing import Callable

import pytest

from mlx_invariants.fuzz import liveness
from mlx_invariants.fuzz.liveness import StallWatch, parked, quiescent

WAIT_S = 10.0   # how long a thread gets to reach its blocking call (a loaded box is slow, never this slow)


def _frame(thread: threading.Thread):
    return sys._current_frames()[thread.ident]


def _eventually_parked(thread: threading.Thread) -> bool:
    """Polls: a thread just started may not have reached its blocking call yet."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if parked(_frame(thread)):
            return True
        time.sleep(0.005)
    return False


def _blocked_in(block: Callable[[], object], release: Callable[[], object]) -> bool:
    thread = threading.Thread(target=block, daemon=True)
    thread.start()
    try:
        return _eventually_parked(thread)
    finally:
        release()
        thread.join(WAIT_S)


def test_a_thread_waiting_on_an_event_is_parked() -> None:
    event = threading.Event()
    assert _blocked_in(event.wait, event.set)


def test_a_thread_blocked_on_a_lock_is_parked() -> None:
    lock = threading.Lock()
    lock.acquire()

    def block() -> None:
        lock.acquire()
        lock.release()

    assert _blocked_in(block, lock.release)


def test_a_thread_blocked_on_a_queue_is_parked() -> None:
    inbox: queue.Queue[int] = queue.Queue()
    assert _blocked_in(inbox.get, lambda: inbox.put(0))


@pytest.fixture
def spinning():
    """A thread busy in plain Python, never waiting on anything."""
    started, stop = threading.Event(), [False]

    def spin() -> None:
        started.set()
        count = 0
        while not stop[0]:
            count += 1

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    assert started.wait(WAIT_S)
    yield thread
    stop[0] = True
    thread.join(WAIT_S)


def test_a_thread_spinning_in_python_is_not_parked(spinning: threading.Thread) -> None:
    looks = []
    for _ in range(50):
        looks.append(parked(_frame(spinning)))
        time.sleep(0.002)
    assert not any(looks), f"{sum(looks)} of {len(looks)} looks called a spinning thread parked"


def test_nothing_is_quiescent_while_a_thread_spins(spinning: threading.Thread) -> None:
    assert not quiescent(SimpleNamespace(_ready=[]), SimpleNamespace(deliveries=set(), paused=0))


def test_nothing_is_quiescent_while_the_loop_has_work_or_a_fault_is_in_flight(monkeypatch) -> None:
    monkeypatch.setattr(liveness, "parked", lambda frame: True)  # whatever else this process runs
    idle_loop, no_fault = SimpleNamespace(_ready=[]), SimpleNamespace(deliveries=set(), paused=0)
    assert quiescent(idle_loop, no_fault)
    assert not quiescent(SimpleNamespace(_ready=[object()]), no_fault)
    assert not quiescent(idle_loop, SimpleNamespace(deliveries={object()}, paused=0))
    assert not quiescent(idle_loop, SimpleNamespace(deliveries=set(), paused=1))


def test_the_stall_watch_says_stalled_only_after_its_quiet_ticks_in_a_row() -> None:
    watch = StallWatch(quiet_ticks=3, stall_s=5.0, last_change=0.0)
    assert not watch.stalled(0.1, nothing_runs=True)
    assert not watch.stalled(0.2, nothing_runs=True)
    assert not watch.stalled(0.3, nothing_runs=False)  # something could still run: counting starts again
    assert not watch.stalled(0.4, nothing_runs=True)
    assert not watch.stalled(0.5, nothing_runs=True)
    assert watch.stalled(0.6, nothing_runs=True)


def test_the_stall_watch_backstop_stalls_a_busy_wait_with_no_progress() -> None:
    watch = StallWatch(quiet_ticks=3, stall_s=5.0, last_change=0.0)
    assert not watch.stalled(4.9, nothing_runs=False)
    assert not watch.stalled(5.0, nothing_runs=False)
    assert watch.stalled(5.1, nothing_runs=False)


def test_progress_resets_the_quiet_ticks_and_the_backstop() -> None:
    watch = StallWatch(quiet_ticks=3, stall_s=5.0, last_change=0.0)
    assert not watch.stalled(4.0, nothing_runs=True)
    assert not watch.stalled(4.1, nothing_runs=True)
    watch.saw_progress(4.2)
    assert not watch.stalled(4.3, nothing_runs=True)
    assert not watch.stalled(4.4, nothing_runs=True)   # two quiet ticks since the progress, not four
    watch.saw_progress(4.5)
    assert not watch.stalled(9.4, nothing_runs=False)  # under stall_s since the progress at 4.5
    assert watch.stalled(9.6, nothing_runs=False)
