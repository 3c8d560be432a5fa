"""Whether anything can still run, and when a quiet wait counts as stalled.

The driver never decides "stuck" on a timer alone: it asks the loop and the
threads themselves. Nothing can run (`quiescent`) when the loop has nothing
ready, no fault is in flight, and every other thread is parked in a blocking
wait (`parked`, judged from its innermost Python frame). A `StallWatch` turns
those looks, one per tick, into a verdict: stalled after `quiet_ticks` quiet
ticks in a row, or after `stall_s` without progress whatever the threads do
(the backstop for a thread that spins). `doing` and `stacks` are what a stall record shows.
"""

from __future__ import annotations

import asyncio
import io
import linecache
import re
import sys
import threading
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from mlx_invariants.fuzz.faults import wait_loop_idle

if TYPE_CHECKING:
    from mlx_invariants.fuzz.faults import Injector
    from mlx_invariants.fuzz.trace import Event, Trace

TICK_S = 0.1          # how often a wait for clients looks again when nothing happened
# One MLX call may run this long before a wait with no other progress counts as stalled: on a loaded GPU one
# async_eval at a prefill took 19.6 s (seven fuzz processes sharing it; why so long was not shown), and the no-progress
# backstop, scaled to a 12.6 ms step, had called the engine stalled after 13 s (0 of 3 replays).
MLX_CALL_S = 60.0
SETTLE_POLL_S = 0.001
_PARKED_FUNCTIONS = frozenset({"wait", "get", "_wait_for_tstate_lock", "select", "poll", "acquire", "join",
                               "wait_for_work", "accept", "recv", "readinto"})
# A blocking read counts too: a `--jobs` child's lifeline thread sits in `os.read` for its whole life, and a
# thread that never counted as parked made every scenario wait `cap_s` for the engine to settle.
_PARKED_LINE = re.compile(r"\.(get|wait|acquire|join|result|recv|read|accept|select|poll)\(|with\s.*lock")


def parked(frame: Any) -> bool:
    """Whether a thread stands in a blocking wait (best effort: its innermost Python frame)."""
    if frame.f_code.co_name in _PARKED_FUNCTIONS:
        return True
    if frame.f_lineno is None:  # between two lines' bytecode (a zoo run crashed on it): no line to read
        return False
    return bool(_PARKED_LINE.search(linecache.getline(frame.f_code.co_filename, frame.f_lineno)))


def _timer_task(handle: asyncio.TimerHandle) -> Optional[asyncio.Task]:
    """The task an `asyncio.sleep` timer wakes (its future's one waiter), if it is one."""
    future = handle._args[0] if handle._args and isinstance(handle._args[0], asyncio.Future) else None
    for callback, _context in getattr(future, "_callbacks", None) or ():
        if isinstance(getattr(callback, "__self__", None), asyncio.Task):
            return callback.__self__
    return None


def engine_timer_due(loop: asyncio.AbstractEventLoop, within_s: float) -> bool:
    """A timer the engine set (not the fuzzer's own) fires within `within_s`: something will run then.

    A batching window (`await asyncio.sleep(0.5)` to gather arrivals), a `wait_for` before a busy
    refusal or a poll interval leave the loop idle and every thread parked while a request waits, and
    the engine is not stuck. The fuzzer's own tasks are named "fuzz-..."; a client task runs the
    adapter's code, so its timers are the engine's. A timer whose owner cannot be told counts as the
    engine's: the no-progress backstop still catches a stall, only later."""
    deadline = loop.time() + within_s
    for handle in loop._scheduled:  # type: ignore[attr-defined]  # CPython's timer heap
        if handle.cancelled() or handle.when() > deadline:
            continue
        task = _timer_task(handle)
        name = task.get_name() if task is not None else ""
        if not name.startswith("fuzz-") or name.startswith("fuzz-client-"):
            return True
    return False


def runnable(native_id: Optional[int]) -> bool:
    """Whether the kernel has the thread running or ready to run (Linux: its /proc state is R). A thread
    woken from a wait still shows the wait as its innermost frame until the scheduler gives it a CPU, which
    on a loaded machine may outlast a short quiet window. (The GPU run's stalls this was first written for
    turned out to be one slow MLX call: `slow_in_mlx`.) False where /proc cannot tell (macOS): the frames
    decide alone."""
    try:
        with open(f"/proc/self/task/{native_id}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] == b"R"
    except (OSError, IndexError):
        return False


def quiescent(loop: asyncio.AbstractEventLoop, injector: "Injector", within_s: float = 0.0) -> bool:
    """Nothing can run: the loop has nothing ready and no engine timer due within `within_s`, no fault is
    in flight, every other thread is parked and none is runnable."""
    if loop._ready or injector.deliveries or injector.paused:  # type: ignore[attr-defined]
        return False
    if within_s and engine_timer_due(loop, within_s):
        return False
    me = threading.get_ident()
    others = {ident: frame for ident, frame in sys._current_frames().items() if ident != me}
    if not all(parked(frame) for frame in others.values()):
        return False
    return not any(runnable(t.native_id) for t in threading.enumerate() if t.ident in others)


async def wait_settled(loop: asyncio.AbstractEventLoop, injector: "Injector", cap_s: float) -> bool:
    """Until the loop is idle and every other thread is parked; False after `cap_s`."""
    deadline = loop.time() + cap_s
    while loop.time() < deadline:
        if await wait_loop_idle() and quiescent(loop, injector):
            return True
        await asyncio.sleep(SETTLE_POLL_S)  # threads going idle send no event; this only looks again
    return False


@dataclass
class StallWatch:
    """The stall decision of one wait, tick by tick: stalled after `quiet_ticks` ticks in a row on which
    nothing could run, or once `stall_s` passed without progress (the backstop). Progress resets both."""

    quiet_ticks: int
    stall_s: float
    last_change: float    # loop time of the last progress (or of the start)
    quiet: int = 0        # quiet ticks in a row so far

    def saw_progress(self, now: float) -> None:
        """Something happened (a client ended, an event was recorded): start counting again."""
        self.last_change, self.quiet = now, 0

    def stalled(self, now: float, nothing_runs: bool) -> bool:
        """One tick without progress, on which nothing could run (`nothing_runs`) or something still could:
        whether the wait counts as stalled now."""
        self.quiet = self.quiet + 1 if nothing_runs else 0
        return self.quiet >= self.quiet_ticks or now - self.last_change > self.stall_s


def thread_stacks() -> str:
    """Every thread's stack, named, as a stall or leftover record shows it."""
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        out.append(f"--- thread {names.get(ident, ident)}\n" + "".join(traceback.format_stack(frame)))
    return "\n".join(out)


def stacks(loop: asyncio.AbstractEventLoop) -> str:
    """Every unfinished task on `loop`, then every thread's stack. On Python 3.14+ a task shows its await graph
    (`asyncio.format_call_graph`: the coroutines it awaits through and the tasks awaiting it), which names the
    future a stuck request waits for; before, its stack."""
    out = io.StringIO()
    graph = getattr(asyncio, "format_call_graph", None)
    for task in asyncio.all_tasks(loop):
        if not task.done():
            out.write(f"--- task {task.get_name()}\n")
            if graph is not None:
                out.write(graph(task) + "\n")
            else:
                task.print_stack(file=out)
    return out.getvalue() + thread_stacks()


def doing(trace: "Trace", rids: list[str]) -> str:
    """What the engine was doing for each of `rids` when the wait gave up: the last point it reached on each
    thread (the loop's side and the worker's), how long before, and an MLX call still open (begun, never
    ended) on any thread."""
    now, out = trace.now(), []
    for rid in rids:
        last: dict[int, "Event"] = {}  # the last point on each thread that served the request
        for event in reversed(trace.of("point", rid=rid)):
            last.setdefault(event.thread, event)
        out.append(f"{rid}: " + ("; ".join(f"last at {e.name}{_index(e)} on {e.thread_name or e.thread}, "
                                          f"{now - e.t:.2f} s before" for e in sorted(last.values(), key=lambda e: e.seq))
                                 or "reached no point"))
    for span in trace.of("mlx"):
        if span.end is None:
            out.append(f"in MLX since {now - span.t:.2f} s: {span.name} on {span.thread_name or span.thread}"
                       + (f" for {span.rid}" if span.rid else ""))
    return "--- what the engine was doing\n" + "\n".join(out) + "\n"


def slow_in_mlx(trace: "Trace", quiet: bool) -> bool:
    """Whether a wait with no progress is one MLX call still running (for under `MLX_CALL_S`), not a stall:
    a thread inside MLX is working, however slowly, unless the call never returns. Not when the wait went
    `quiet` (every thread parked: nobody is inside anything)."""
    return not quiet and in_mlx_call(trace)


def in_mlx_call(trace: "Trace") -> bool:
    """Whether a thread is inside an MLX call it entered less than `MLX_CALL_S` ago: one call cannot be cut
    short, so whatever waits for it to return is slow, not lost."""
    starts = [span.t for span in trace.of("mlx") if span.end is None]
    return bool(starts) and trace.now() - min(starts) < MLX_CALL_S


def _index(point: "Event") -> str:
    index = point.info.get("step", point.info.get("index"))
    return f"#{index}" if index else ""
