"""Ownership oracles for engines that mark nothing: judged from the drop-in observation alone.

`fuzz/observe.py` records locks, work handed to threads and cancellation;
the sentinel records MLX spans (and, with no owner declared, which thread
entered MLX first). From those, for any engine:

- a lock or semaphore released while work submitted under it was still
  running in MLX, because its holder stopped waiting (the release happened
  while an exception, typically a cancellation, unwound through it): the
  next holder's work then races the worker it believes finished;
- MLX entered off the thread that first entered it (the one that loaded the
  model), when the adapter declares no owner;
- an MLX generator (mlx-lm's `generate_step`, or any generator target of the
  sentinel) dropped mid-body on a thread other than the one that made it:
  its `with mx.stream(...)` exits and `finally` blocks run there;
- an event loop's thread waited for a `threading.Lock` whose holder was
  inside MLX meanwhile: the loop stood still for another thread's MLX work;
- a task whose cancel was delivered ended as if nothing happened (returned
  normally, with no `uncancel()` to say it took the cancel on purpose).
  `asyncio.shield` and a drain that re-raises end cancelled, and
  `asyncio.timeout` and `TaskGroup` uncancel what they cancel, so none of
  them is reported.

"Two threads inside MLX at once" is `oracles.mlx_never_concurrent`, which
needs nothing marked either.
"""

from __future__ import annotations

import sys
from typing import Iterator, Optional

from mlx_invariants.fuzz.violation import Violation, ViolationKind, yields
from mlx_invariants.fuzz.trace import Event, Trace


@yields(ViolationKind(
    "lock-released-early", "A lock or semaphore was released, while its holder unwound an exception, with work "
                           "submitted under it still in MLX.", exact=False,
    why="Orders a release on the loop against MLX spans on a worker thread: whether the worker had picked "
        "the job up, and was still inside MLX when the lock went, depends on thread timing.",
    known_problems="Sees locks built by code outside the standard library and work handed over through "
                   "`to_thread`, `run_in_executor`, `ThreadPoolExecutor.submit` or `Thread.start`; not work "
                   "handed to threads by C extensions."))
def lock_kept_over_its_work(trace: Trace) -> Iterator[Violation]:
    """A lock or semaphore was let go, while its holder unwound, with work submitted under it still in MLX."""
    releases = [e for e in trace.of("sync", "release") if e.info.get("unwinding")]
    if not releases:
        return
    starts = {e.info["work"]: e for e in trace.of("work", "start")}
    finishes = {e.info["work"]: e for e in trace.of("work", "finish")}
    spans = trace.of("mlx")
    reported: set[int] = set()
    for submit in trace.of("work", "submit"):
        work = submit.info["work"]
        start = starts.get(work)
        if start is None:
            continue
        for held in submit.info.get("under", ()):
            release = next((r for r in releases if r.info["lock"] == held["lock"] and r.seq > submit.seq
                            and r.info.get("holder") == held["holder"]), None)
            if release is None or release.seq in reported:
                continue
            finish = finishes.get(work)
            end = finish.seq if finish is not None else sys.maxsize
            if finish is not None and finish.seq < release.seq:
                continue
            late = _mlx_after(spans, start, end, release.seq)
            if late is None:
                continue
            reported.add(release.seq)
            yield Violation(
                "lock-released-early",
                f"{release.info['type']} released at #{release.seq} by {release.info['holder']} while unwinding "
                f"{release.info['unwinding']}, but {submit.info['via']} job {submit.info['fn']} submitted under it "
                f"(#{submit.seq}) was still in MLX ({late.name} #{late.seq} on {late.who}; "
                f"{'finished at #' + str(finish.seq) if finish else 'never finished'})",
                stacks=(release.stack, late.stack))


def _mlx_after(spans: list[Event], start: Event, end: int, released: int) -> Event | None:
    """The first MLX span of the job that began at `start` (on its thread, before `end`) still open at
    `released` or entered after it."""
    for span in spans:
        if span.thread == start.thread and start.seq < span.seq < end:
            if span.end is None or span.end > released:
                return span
    return None


# From this MLX version on, streams and command encoders are per thread and an evaluated array may be used
# from any thread; a lazy array or a stream used on another thread raises "There is no Stream(...) in current
# thread" (`oracles.no_stream_errors`). Before it, one stream served every thread and any second thread raced it.
THREAD_LOCAL_STREAMS = (0, 31, 2)


def _before_thread_local_streams(version: str) -> bool:
    """Whether MLX `version` predates per-thread streams (an unknown version is not assumed old)."""
    try:
        numbers = tuple(int(part) for part in version.split(".")[:3])
    except ValueError:
        return False
    return bool(numbers) and numbers < THREAD_LOCAL_STREAMS


@yields(ViolationKind(
    "mlx-off-loader", "With no owner declared and an MLX older than 0.31.2 (one stream shared by every thread), "
                      "MLX was entered off the thread that entered it first (the one that loaded the model).",
    exact=False,
    why="Which thread is the loader is whichever entered MLX first: with no owner declared, the order of the "
        "first entries across threads can differ from run to run, so it counts once it replays.",
    known_problems="From MLX 0.31.2 on it never fires: another thread is no bug by itself there, and what goes "
                   "wrong (a lazy array or a stream used across threads) raises and is `mlx-no-stream`. Before "
                   "0.31.2, an engine that loads on one thread and serves from another by design is reported "
                   "unless its adapter declares that owner (then `mlx-off-owner` judges)."))
def mlx_only_on_loader(trace: Trace) -> Iterator[Violation]:
    """With no owner declared and an MLX older than 0.31.2, MLX was entered off the thread that entered it
    first (reported once per thread). From 0.31.2 on another thread is no bug by itself: what goes wrong
    there (a lazy array or a stream used across threads) raises, and `mlx-no-stream` reports that."""
    loader = next((e for e in trace.of("mlx") if not e.info.get("off_loader")), None)
    seen: set[int] = set()
    for span in trace.of("mlx"):
        if span.info.get("off_loader") and not span.info.get("off_owner") and span.thread not in seen \
                and _before_thread_local_streams(span.info.get("mlx_version", "")):
            seen.add(span.thread)
            where = f" ({loader.who} entered it first)" if loader is not None else ""
            yield Violation("mlx-off-loader",
                            f"{span.who} entered {span.name} off the thread that loaded the model{where}; MLX "
                            f"{span.info['mlx_version']} shares one stream between threads (per-thread streams "
                            f"came in 0.31.2)",
                            stacks=((loader.stack if loader else ()), span.stack))


@yields(ViolationKind(
    "cancel-swallowed", "A task cancelled from outside (by another task, or by a callback while something "
                        "awaited it) returned normally and never called `uncancel()`.",
    exact=False,
    why="Whether the cancel landed while the task could still swallow it (inside a `try` that ate it) or "
        "after it had its result depends on timing across loop turns and threads.",
    known_problems="Tasks made by a custom task factory are not observed. A cancel arranged by the task "
                   "itself (it, or a task it started, called `cancel()`) is never reported, nor one from a "
                   "callback while nothing awaits the task (a server's connection handler that cancels "
                   "itself when its client goes)."))
def cancel_is_honoured(trace: Trace) -> Iterator[Violation]:
    """A task cancelled from outside returned normally and never called `uncancel()`: it swallowed a cancel
    someone relied on. From outside means by another task (a caller, a TaskGroup's parent, a server shutting
    down), or by a callback while something awaits the task (`wait_for`, `gather`, an awaiting task). A task
    that cancels itself, through itself or a task it started, and cleans up and returns, swallows nothing
    anyone waits for. (Cancels requested before the task runs again arrive as one `CancelledError`, so one
    `uncancel()` is taken to answer them all.)"""
    cancels: dict[int, list[str]] = {}
    answered: set[int] = set()
    for event in trace.of("task"):
        task = event.info["task"]
        if event.name == "cancel":
            cancels.setdefault(task, []).append(event.info.get("by", "task"))
        elif event.name == "uncancel":
            answered.add(task)
        elif event.name == "end" and event.info.get("outcome") == "returned" and task not in answered:
            relied_on = [by for by in cancels.get(task, ()) if by == "task"
                         or (by == "callback" and event.info.get("awaited"))]
            if relied_on:
                yield Violation("cancel-swallowed",
                                f"task {event.info['name']} ({event.info.get('coro')}) was cancelled from outside "
                                f"({_cancellers(relied_on)}) but returned normally at #{event.seq}")


def _cancellers(kinds: list[str]) -> str:
    """"by another task", "by a callback while awaited", or both with counts."""
    words = {"task": "by another task", "callback": "by a callback while something awaited it"}
    return "; ".join(f"{words[k]}{f' x{kinds.count(k)}' if kinds.count(k) > 1 else ''}" for k in sorted(set(kinds)))


@yields(ViolationKind(
    "mlx-finalized-off-thread", "An MLX generator (e.g. mlx-lm's generate_step) was dropped mid-body on another "
                                "thread than made it.", exact=False,
    why="When a dropped generator is finalized, and on which thread, depends on the garbage collector and "
        "on which thread drops the last reference, so it counts once it replays. One the harness's own "
        "collection finalizes (its rest sample, fuzz/collect.py) is recorded apart and never counted: that "
        "thread is the harness's choice. So is one made in an earlier scenario and finalized while a later one "
        "runs: the thread is whichever that scenario's collection fell on.",
    known_problems="Only generators the sentinel wraps; an array or stream whose last reference drops on "
                   "another thread is not seen. A generator that outlives its scenario is never judged, even "
                   "where a server that goes on across scenarios really drops it off its thread."))
def mlx_finalized_where_it_lives(trace: Trace) -> Iterator[Violation]:
    """An MLX generator (e.g. mlx-lm's generate_step) was dropped mid-body on another thread than made it."""
    for event in trace.of("mlx-gc", "finalized-off-thread"):
        yield Violation("mlx-finalized-off-thread",
                        f"{event.info['target']} made on {event.info['created_by']} was finalized mid-generation "
                        f"on {event.who}, which ran its stream exits and finally blocks there",
                        stacks=(event.stack,))


# What is decode work wherever it runs: a forward pass or a generation step (the sentinel's span names).
DECODE_SPANS = ("Model.__call__", "generate_step", "stream_generate", "generate.generate", "BatchGenerator.next",
                "BatchGenerator.insert")
LOOP_MLX_S = 0.05  # any other MLX call holding the loop this long counts too


@yields(ViolationKind(
    "mlx-on-loop", "Decode work ran on a thread running an asyncio event loop (a forward pass or generation "
                   "step, or an MLX call that held it 50 ms or more) while it served requests.", exact=False,
    why="Which thread runs a step can depend on the order of arrivals (a fast path taken only when nothing "
        "else is queued), and the 50 ms part on the machine's speed, so it counts once it replays.",
    known_problems="Work before the first request of a scenario (loading, warm-up) is not judged. A server "
                   "whose loop thread does MLX but no asyncio loop runs on it (a plain thread) is not seen."))
def mlx_stays_off_the_loop(trace: Trace) -> Iterator[Violation]:
    """Decode work ran on an event loop's thread: every request on that loop waits for it (once per thread)."""
    first = trace.first("request", "submit")
    seen: set[int] = set()
    for span in trace.of("mlx"):
        if first is None or span.seq < first.seq or not span.info.get("on_loop") or span.thread in seen:
            continue
        if span.name.endswith(DECODE_SPANS) or span.duration >= LOOP_MLX_S:
            seen.add(span.thread)
            yield Violation("mlx-on-loop", f"{span.who} ran {span.name} ({span.duration * 1000:.0f} ms) on its asyncio "
                                           f"event loop: every other request on that loop waited for it",
                            stacks=(span.stack,))


@yields(ViolationKind(
    "loop-waits-for-mlx", "A thread running an asyncio event loop waited for a `threading.Lock` while the thread "
                          "holding it was inside MLX (a forward pass or generation step, or 50 ms or more of "
                          "MLX): the loop, and every request on it, stood still for the holder's MLX work.",
    exact=False,
    why="Whether the loop asks for the lock while the holder is inside MLX depends on thread timing, so it "
        "counts once it replays; that the holder keeps the lock across its MLX work is what makes it possible.",
    known_problems="Sees `threading.Lock`s built by code outside the standard library (not `RLock`s, "
                   "`Condition`s or locks of C extensions). Waits before the scenario's first request "
                   "(loading, warm-up) are not judged. The static INV114 finds the same shape in source."))
def loop_never_waits_for_mlx(trace: Trace) -> Iterator[Violation]:
    """An event loop's thread waited on a lock its holder kept across MLX work (once per lock)."""
    first = trace.first("request", "submit")
    spans, seen = trace.of("mlx"), set()
    for wait in trace.of("sync", "wait"):
        lock = wait.info["lock"]
        if first is None or wait.seq < first.seq or lock in seen:
            continue
        start, end = _held_while_waited(trace, wait)
        inside = [(span, min(end, span.t_end if span.t_end is not None else end) - max(start, span.t))
                  for span in spans if span.thread == wait.info["holder_thread"] and span.t < end
                  and (span.t_end is None or span.t_end > start) and start < end]
        overlap = sum(part for _, part in inside)
        if not inside or (overlap < LOOP_MLX_S and not any(span.name.endswith(DECODE_SPANS) for span, _ in inside)):
            continue
        seen.add(lock)
        longest = max(inside, key=lambda pair: pair[1])[0]
        yield Violation("loop-waits-for-mlx",
                        f"{wait.who}, which runs an asyncio event loop, waited {wait.t - wait.info['since']:.3f}s for a "
                        f"threading.Lock that {wait.info['holder']} held while inside MLX ({longest.name}, "
                        f"{overlap * 1000:.0f} ms of the wait): every request on that loop waited with it",
                        stacks=(wait.stack, longest.stack))


def _held_while_waited(trace: Trace, wait: Event) -> tuple[float, float]:
    """The part of the loop's wait during which the holder still held the lock: from the later of the wait's
    start and the hold's acquire to the earlier of the wait's end and the hold's release (a holder that let go
    at once and went into MLX afterwards kept nobody waiting for its MLX)."""
    def of_hold(name: str) -> Optional[Event]:
        return next((e for e in trace.of("sync", name) if e.info.get("lock") == wait.info["lock"]
                     and e.info.get("hold") == wait.info.get("holder_hold")
                     and e.thread == wait.info["holder_thread"]), None)
    taken, let_go = of_hold("acquire"), of_hold("release")
    start = max(wait.info["since"], taken.t if taken is not None else wait.info["since"])
    return start, min(wait.t, let_go.t if let_go is not None else wait.t)


OWNERSHIP_ORACLES = (lock_kept_over_its_work, mlx_only_on_loader, mlx_finalized_where_it_lives, cancel_is_honoured,
                     mlx_stays_off_the_loop, loop_never_waits_for_mlx)
