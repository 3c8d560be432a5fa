"""`fuzz.liveness`: which threads count as parked, and when a quiet wait counts as stalled."""

from __future__ import annotations

import asyncio
import hashlib
import queue
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import pytest

from mlx_invariants.fuzz import liveness
from mlx_invariants.fuzz.liveness import StallWatch, engine_timer_due, parked, quiescent
from mlx_invariants.fuzz.oracles import judge
from mlx_invariants.fuzz.scenario import At, FaultSpec, RequestSpec, Scenario
from mlx_invariants.fuzz.session import run_scenario
from mlx_invariants.fuzz.target import Target
from mlx_invariants.fuzz.trace import Trace
from mlx_invariants.mutants.mutant import Edit
from tests.fuzz.plants import plant

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
    monkeypatch.setattr(liveness, "runnable", lambda native_id: False)
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


def test_a_timer_the_engine_set_means_something_will_run_and_the_fuzzers_own_do_not() -> None:
    async def look() -> dict[str, bool]:
        loop = asyncio.get_running_loop()
        seen = {}

        async def timer(name: str, delay: float = 0.5) -> asyncio.Task:
            task = asyncio.create_task(asyncio.sleep(delay), name=name)
            await asyncio.sleep(0)  # it reaches its sleep: the timer is set
            return task

        harness = await timer("fuzz-lag")
        seen["the fuzzer's lag watcher"] = engine_timer_due(loop, 1.0)
        client = await timer("fuzz-client-r0")  # a client task runs the adapter's code
        seen["a client task's wait"] = engine_timer_due(loop, 1.0)
        client.cancel()
        await asyncio.sleep(0)
        window = await timer("batch-window")
        seen["an engine task's sleep, due within"] = engine_timer_due(loop, 1.0)
        seen["an engine task's sleep, due beyond"] = engine_timer_due(loop, 0.1)
        window.cancel()
        await asyncio.sleep(0)  # its sleep's finally cancels the timer
        handle = loop.call_later(0.5, lambda: None)  # a wait_for's timeout, a poll: no task to name it
        seen["a bare call_later"] = engine_timer_due(loop, 1.0)
        handle.cancel()
        seen["all cancelled but the lag watcher"] = engine_timer_due(loop, 1.0)
        harness.cancel()
        return seen

    seen = asyncio.run(look())
    assert seen == {"the fuzzer's lag watcher": False, "a client task's wait": True,
                    "an engine task's sleep, due within": True, "an engine task's sleep, due beyond": False,
                    "a bare call_later": True, "all cancelled but the lag watcher": False}, seen


def test_a_correct_engine_waiting_out_a_batching_window_is_not_stalled() -> None:
    from mlx_invariants.fuzz.adapters.reference import ReferenceAdapter, reference_engine
    from mlx_invariants.fuzz.oracles import judge
    from mlx_invariants.fuzz.scenario import RequestSpec, Scenario
    from mlx_invariants.fuzz.session import run_scenario

    class Windowed(ReferenceAdapter):
        """Gathers arrivals for a while before posting them (loop idle, owner parked, nothing stuck)."""

        async def submit(self, spec):
            await asyncio.sleep(1.0)
            return await super().submit(spec)

    trace = run_scenario(lambda: Windowed(reference_engine("simple")().factory),
                         Scenario((RequestSpec("r0", 3, 2, True),), followup=False))
    assert trace.first("request", "end", "r0").info["outcome"] == "completed"
    assert judge(trace) == [], judge(trace)


def test_a_thread_whose_frame_looks_parked_but_that_the_kernel_runs_is_not_quiescent() -> None:
    # A woken thread keeps its wait as its innermost frame until it gets a CPU; on a loaded box that took
    # longer than the quiet window. Here a function named like a wait hashes without the GIL: runnable.
    if not Path("/proc/self/task").is_dir():
        pytest.skip("the kernel's thread states are read from /proc (Linux)")
    started, stop = threading.Event(), [False]
    block = bytes(1 << 20)

    def wait() -> None:
        started.set()
        while not stop[0]:
            hashlib.sha256(block).digest()

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    try:
        assert started.wait(WAIT_S) and parked(_frame(thread))
        looks = [quiescent(SimpleNamespace(_ready=[]), SimpleNamespace(deliveries=set(), paused=0))
                 for _ in range(20)]
        assert not all(looks), "a thread the kernel runs was called parked on every look"
    finally:
        stop[0] = True
        thread.join(WAIT_S)


def test_a_wait_with_an_mlx_call_still_running_is_slow_not_stalled_until_the_call_bound(monkeypatch) -> None:
    # A GPU run: one async_eval took 19.6 s under load, and the backstop had called the engine stalled at 13 s.
    trace = Trace()
    span = trace.record("mlx", "eval")
    assert liveness.slow_in_mlx(trace, quiet=False)
    assert not liveness.slow_in_mlx(trace, quiet=True)  # every thread parked: nobody is inside MLX
    monkeypatch.setattr(liveness, "MLX_CALL_S", 0.0)  # a call open past the bound: it may never return
    assert not liveness.slow_in_mlx(trace, quiet=False)
    monkeypatch.undo()
    trace.close_span(span)
    assert not liveness.slow_in_mlx(trace, quiet=False)  # no call open: the backstop judges


def test_a_frame_with_no_line_number_is_not_parked_and_does_not_raise() -> None:
    # CPython gives f_lineno None for a frame between lines' bytecode; a zoo fuzz run crashed in parked() on it.
    frame = SimpleNamespace(f_code=SimpleNamespace(co_name="step", co_filename=__file__), f_lineno=None)
    assert parked(frame) is False



# Where each route's worker starts a request, and the import line the chain's `mx` goes after.
_WORKER_START = {
    "simple": ("engine/serial.py", """
        pending, params = job.pending, job.pending.params
        """, """
        import queue
        """),
    "batched": ("engine/batched.py", """
            reach(Point.WORKER_STARTED, rid)
        """, """
        import threading
        """),
}


def _plant_slow_first_call(tmp_path_factory: pytest.TempPathFactory, plant_id: str, route: str, *more: Edit,
                           seconds: float = 2.0) -> str:
    """The `route` reference engine whose worker starts each request with one long MLX call (a long prefill on a
    loaded box): a chain of matmuls timed here to take about `seconds` inside one `eval`; `more` edits besides."""
    import mlx.core as mx

    slow = mx.ones((512, 512)) / 512
    mx.eval(slow)
    began = time.perf_counter()
    for _ in range(5):
        slow = slow @ slow
    mx.eval(slow)
    chain = max(5, int(5 * seconds / max(time.perf_counter() - began, 1e-3)) + 1)
    path, start, imported = _WORKER_START[route]  # blocks match at any indentation (`Edit`)
    chain_lines = f"slow = mx.ones((512, 512)) / 512\nfor _ in range({chain}):\n    slow = slow @ slow\nmx.eval(slow)\n"
    edit = Edit(path, start, textwrap.dedent(start) + chain_lines)
    imports = Edit(path, imported, textwrap.dedent(imported) + "\nimport mlx.core as mx\n")
    return plant(tmp_path_factory, plant_id, route, imports, edit, *more)


@pytest.fixture(scope="module")
def slow_first_call(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Past the served route's release grace (1 s). Correct: it keeps the request's seat until that call
    returns, and lets it go then."""
    return _plant_slow_first_call(tmp_path_factory, "slow-first-call", "simple")


@pytest.fixture(scope="module")
def slow_call_short_shutdown(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The batched route with a first call of about 4 s (past the fuzzer's 2 s thread join), and a shutdown that
    waits only 0.1 s at each of its steps before it gives up on its owner: the GPU case, where one call outlasted
    the engine's patience (11 s in all)."""
    patience = Edit("engine/frontend.py", """
        await self._wait_streams_ended(grace_s)
        for stream in list(self._streams.values()):
            stream.abort()
        await self._wait_streams_ended(max(grace_s, 1.0))
        owner = self._owner
        if owner is not None:
            owner.stop()
            try:
                await asyncio.wait_for(asyncio.shield(owner.stopped), max(grace_s, 1.0) + 5.0)
        """, """
        await self._wait_streams_ended(0.1)
        for stream in list(self._streams.values()):
            stream.abort()
        await self._wait_streams_ended(0.1)
        owner = self._owner
        if owner is not None:
            owner.stop()
            try:
                await asyncio.wait_for(asyncio.shield(owner.stopped), 0.1)
        """)
    return _plant_slow_first_call(tmp_path_factory, "slow-call-short-shutdown", "batched", patience, seconds=4.0)


def test_a_shutdown_that_gives_up_on_a_thread_inside_one_mlx_call_leaks_nothing(
        slow_call_short_shutdown: str) -> None:
    """A shared GPU's first prefill of a new shape outlasted the reference engine's shutdown patience: the
    engine let the seat go and returned with its owner still in the call, which then ended on its own. Neither
    the release (admission had closed) nor the thread still finishing its call is a finding."""
    scenario = Scenario((RequestSpec("r0", 4, 2, False),), (FaultSpec("shutdown", At("r0", "WORKER_STARTED")),))
    trace = run_scenario(Target.reference("batched", package=slow_call_short_shutdown).build(), scenario)
    released, finished = trace.first("point", "SLOT_RELEASED", "r0"), trace.first("point", "FINISHED", "r0")
    assert released is not None and (finished is None or finished.seq > released.seq), "the shutdown waited"
    assert [(v.kind, v.message) for v in judge(trace)] == []


def test_a_seat_held_until_a_long_mlx_call_returns_is_read_after_it_not_as_a_leak(slow_first_call: str) -> None:
    """Over HTTP the client is gone at once while the worker is still inside its long call; the engine keeps
    the seat until the call returns, as it must. Its books are read once the call is over, not after the
    release grace alone (a 10-minute runner run of the served route once reported slot-leaked for a 2.2 s
    prefill on a loaded box)."""
    scenario = Scenario((RequestSpec("r0", 4, 2, False),), (FaultSpec("cancel-in-call", At("r0", "ADMITTED")),))
    trace = run_scenario(Target.served("simple", package=slow_first_call).build(), scenario)
    assert trace.first("fault", "in-call").info["worker"].startswith("inside"), "the cancel missed the long call"
    assert [(v.kind, v.message) for v in judge(trace)] == []
