"""Drop-in observation: what an engine nobody marked does with locks, threads and cancellation.

The MLX sentinel sees who is inside MLX; an engine that calls no point hooks
tells nothing else. While an `Observer` is installed it records, into the same
trace as the sentinel's spans:

- "sync" events: `asyncio.Lock` / `asyncio.Semaphore` acquire and release
  (their class methods are wrapped, so locks built before installation and
  subclasses count too) and `threading.Lock` acquire and release for locks
  built while installed by code outside the standard library and this harness
  (`threading.Lock` is a builtin factory: the module attribute is replaced).
  Each names the lock, the holder (a task, or a thread for `threading.Lock`)
  and, on release, the exception being unwound, if any; and a "wait" when a
  thread running an event loop found a `threading.Lock` taken and waited;
- "work" events: a job handed to a thread (`asyncio.to_thread`,
  `loop.run_in_executor`, `ThreadPoolExecutor.submit`, `threading.Thread`
  started outside the standard library): "submit" (by which task or thread,
  under which held locks), then "start" and "finish" on the thread that ran it;
- "task" events: a cancel delivered to a task (`cancel()` returned True),
  `uncancel()`, and how a task that was cancelled ended (cancelled, returned,
  raised). Tasks are made by a `Task` subclass put in `asyncio.tasks.Task`,
  which is what `loop.create_task` builds when the loop has no task factory.

`fuzz/ownership.py` turns these into oracles. `uninstall()` puts every
patched attribute back.
"""

from __future__ import annotations

import _thread
import asyncio
import asyncio.events as asyncio_events
import asyncio.locks
import asyncio.tasks
import concurrent.futures
import itertools
import os
import sys
import sysconfig
import threading
import weakref
from typing import Any, Callable, Optional

from mlx_invariants.fuzz.trace import Event, Trace, capture_stack, thread_token

_HARNESS = os.path.dirname(os.path.abspath(__file__))
_STDLIB = sysconfig.get_paths()["stdlib"]
_SITE = tuple({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
# Frames a submission passes through on its way to `ThreadPoolExecutor.submit`, and what each means.
_VIA = {"to_thread": "to_thread", "run_in_executor": "run_in_executor"}
_task_ids = itertools.count(1)


def _library_code(filename: str) -> bool:
    """Code whose locks and threads are not the engine's: the standard library and this harness."""
    if filename.startswith("<frozen"):
        return True
    if filename.startswith(_HARNESS):
        return True
    return filename.startswith(_STDLIB) and not filename.startswith(_SITE)


class Observer:
    """Records sync, work and task events into `trace` while installed; `emit` also gets each event
    (the injected sentinel writes them to its file)."""

    def __init__(self, trace: Trace, emit: Optional[Callable[[Event], None]] = None):
        self.trace = trace
        self._emit = emit
        self._guard = _thread.allocate_lock()
        self._ids = itertools.count(1)
        self._held: dict[tuple[str, int], list[int]] = {}  # holder -> lock ids it holds, oldest first
        self._labels: dict[tuple[str, int], str] = {}
        self._patches: list[tuple[Any, str, Any, Any]] = []
        self.installed = False

    # -- lifecycle ---------------------------------------------------------------
    def install(self) -> "Observer":
        """Wrap on top of whatever is there (another observer's wrappers too: each records into its own
        trace)."""
        if self._patches:
            raise RuntimeError("this observer is already installed")
        self.installed = True
        locks, pool = asyncio.locks, concurrent.futures.ThreadPoolExecutor
        self._patch(locks.Lock, "acquire", _async_acquire(self, locks.Lock.acquire, "asyncio.Lock"))
        self._patch(locks.Lock, "release", _release(self, locks.Lock.release, "asyncio.Lock"))
        self._patch(locks.Semaphore, "acquire", _async_acquire(self, locks.Semaphore.acquire, "asyncio.Semaphore"))
        self._patch(locks.Semaphore, "release", _release(self, locks.Semaphore.release, "asyncio.Semaphore"))
        self._patch(threading, "Lock", _lock_factory(self, threading.Lock))
        self._patch(pool, "submit", _submit(self, pool.submit))
        self._patch(threading.Thread, "start", _thread_start(self, threading.Thread.start))
        self._patch(asyncio.tasks, "Task", _observed_task_class(self, asyncio.tasks.Task))
        return self

    def uninstall(self) -> None:
        """Put every patched attribute back, newest first; safe to call twice. Where another observer
        wrapped ours since, ours stays in place and only passes through."""
        self.installed = False
        for owner, attr, original, wrapper in reversed(self._patches):
            if vars(owner).get(attr) is wrapper:
                setattr(owner, attr, original)
        self._patches.clear()

    def attach(self, trace: Trace) -> None:
        """Record into a fresh trace (one per scenario); what is held goes on being held."""
        self.trace = trace

    def _patch(self, owner: Any, attr: str, value: Any) -> None:
        self._patches.append((owner, attr, vars(owner)[attr], value))
        setattr(owner, attr, value)

    # -- records -----------------------------------------------------------------
    def record(self, kind: str, name: str, info: dict[str, Any], stack: tuple[str, ...] = ()) -> Event:
        event = self.trace.record(kind, name, info=info, stack=stack)
        if self._emit is not None:
            self._emit(event)
        return event

    def acquired(self, lock: Any, kind: str, holder: tuple[str, int], label: str, hold: Optional[int] = None) -> None:
        with self._guard:
            self._held.setdefault(holder, []).append(id(lock))
            self._labels[holder] = label
        self.record("sync", "acquire", {"lock": id(lock), "type": kind, "holder": label,
                                        **({"hold": hold} if hold is not None else {})})

    def released(self, lock: Any, kind: str, holder: tuple[str, int], label: str,
                 hold: Optional[int] = None) -> None:
        with self._guard:
            held = self._held.get(holder)
            if held is None or id(lock) not in held:  # a semaphore released by another task than took it
                holder, held = next(((h, ids) for h, ids in self._held.items() if id(lock) in ids), (holder, None))
                label = self._labels.get(holder, label)
            if held is not None:
                held.remove(id(lock))
                if not held:
                    del self._held[holder]
                    self._labels.pop(holder, None)
        unwinding = sys.exc_info()[0]
        # Released while an exception unwinds: the holder stopped waiting for whatever it held the lock over.
        self.record("sync", "release", {"lock": id(lock), "type": kind, "holder": label,
                                        "unwinding": unwinding.__name__ if unwinding else None,
                                        **({"hold": hold} if hold is not None else {})},
                    stack=capture_stack(3) if unwinding else ())

    def waited(self, lock: Any, since: float, holder: tuple[int, str, int]) -> None:
        """An event loop's thread waited from `since` for a `threading.Lock` that `holder` (thread token, name,
        hold number) took last: what that thread did while it still held it, every request on the loop waited
        for. The hold's own acquire and release (the same number) bound that."""
        self.record("sync", "wait", {"lock": id(lock), "type": "threading.Lock", "since": since,
                                     "holder_thread": holder[0], "holder_hold": holder[2],
                                     "holder": f"thread #{holder[0]} ({holder[1]})"},
                    stack=capture_stack(3))

    def submitted(self, via: str, target: Any) -> int:
        """A job handed to a thread: by whom, and under which locks, each with its holder. A task holds
        what the task that created it held then too (`wait_for(to_thread(...))` runs it in a new task),
        and the loop thread's `threading` locks."""
        holder, label = _current_holder()
        holders = [holder, *_ancestors(), ("thread", threading.get_ident())]
        with self._guard:
            under = [{"lock": lock, "holder": self._labels.get(h, label)} for h in dict.fromkeys(holders)
                     for lock in self._held.get(h, ())]
        work = next(self._ids)
        self.record("work", "submit", {"work": work, "via": via, "by": label, "under": under,
                                       "fn": getattr(target, "__qualname__", type(target).__name__)})
        return work

    def running(self, work: int, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run `fn` as job `work`, on the thread that runs it, between its start and finish events."""
        self.record("work", "start", {"work": work})
        try:
            return fn(*args, **kwargs)
        finally:
            self.record("work", "finish", {"work": work})


def _current_holder() -> tuple[tuple[str, int], str]:
    """The task running on this thread, or else the thread: who holds what it acquires."""
    try:
        task = asyncio.current_task()
    except RuntimeError:
        task = None
    if task is not None:
        return ("task", _task_id(task)), f"task {task.get_name()} #{_task_id(task)}"
    return _thread_holder()


def _ancestors() -> list[tuple[str, int]]:
    """The tasks that created the running task, nearest first (as far as they are still alive)."""
    try:
        task = asyncio.current_task()
    except RuntimeError:
        return []
    found = []
    parent = getattr(task, "_observed_parent", None)
    while parent is not None and (task := parent()) is not None and len(found) < 16:
        found.append(("task", _task_id(task)))
        parent = getattr(task, "_observed_parent", None)
    return found


def _thread_holder() -> tuple[tuple[str, int], str]:
    ident = threading.get_ident()
    return ("thread", ident), f"thread {threading.current_thread().name} #{ident}"


def _task_id(task: Any) -> int:
    return getattr(task, "_observed_id", None) or id(task)


# -- the wrappers: each passes straight through once its observer is uninstalled ------------------
def _async_acquire(observer: Observer, original: Callable[..., Any], kind: str) -> Callable[..., Any]:
    async def acquire(self: Any) -> bool:
        result = await original(self)
        if observer.installed:
            observer.acquired(self, kind, *_current_holder())
        return result
    acquire.__wrapped__ = original  # type: ignore[attr-defined]
    return acquire


def _release(observer: Observer, original: Callable[..., Any], kind: str) -> Callable[..., Any]:
    def release(self: Any) -> None:
        original(self)
        if observer.installed:
            observer.released(self, kind, *_current_holder())
    release.__wrapped__ = original  # type: ignore[attr-defined]
    return release


def _lock_factory(observer: Observer, original: Callable[[], Any]) -> Callable[[], Any]:
    def Lock() -> Any:  # noqa: N802  (stands in for threading.Lock)
        if not observer.installed or _library_code(sys._getframe(1).f_code.co_filename):
            return original()
        return ObservedThreadLock(observer, original())
    Lock.__wrapped__ = original  # type: ignore[attr-defined]
    return Lock


class ObservedThreadLock:
    """A `threading.Lock` whose acquire and release are recorded, held by a thread."""

    def __init__(self, observer: Observer, inner: Any):
        self._observer, self._inner = observer, inner
        self._holds = 0  # how many times it was taken: the number of each hold, on its acquire and release
        self._holder: tuple[int, str, int] = (0, "", 0)  # the last taker's thread token and name, and its hold

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        on_loop = blocking and self._observer.installed and asyncio_events._get_running_loop() is not None
        waited_since = None
        if on_loop and self._inner.acquire(False):
            got = True  # free: nothing was waited for
        else:
            if on_loop:
                waited_since, holder = self._observer.trace.now(), self._holder
            got = self._inner.acquire(blocking, timeout)
        if got and self._observer.installed:
            if waited_since is not None:  # an event loop's thread stood still until another thread let go
                self._observer.waited(self, waited_since, holder)
            self._holds += 1
            self._holder = (thread_token(), threading.current_thread().name, self._holds)
            self._observer.acquired(self, "threading.Lock", *_thread_holder(), hold=self._holds)
        return got

    def release(self) -> None:
        hold = self._holds
        self._inner.release()
        if self._observer.installed:
            self._observer.released(self, "threading.Lock", *_thread_holder(), hold=hold)

    def locked(self) -> bool:
        return self._inner.locked()

    __enter__ = acquire

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _at_fork_reinit(self) -> None:
        self._inner._at_fork_reinit()


def _submit(observer: Observer, original: Callable[..., Any]) -> Callable[..., Any]:
    def submit(self: Any, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        if not observer.installed:
            return original(self, fn, *args, **kwargs)
        via, frame = "submit", sys._getframe(1)
        for _ in range(3):  # to_thread -> run_in_executor -> [an executor's own submit] -> here
            if frame is None:
                break
            via = _VIA.get(frame.f_code.co_name, via)
            frame = frame.f_back
        work = observer.submitted(via, getattr(fn, "func", fn))
        return original(self, observer.running, work, fn, *args, **kwargs)
    submit.__wrapped__ = original  # type: ignore[attr-defined]
    return submit


def _thread_start(observer: Observer, original: Callable[..., Any]) -> Callable[..., Any]:
    def start(self: threading.Thread) -> None:
        if observer.installed and not _library_code(sys._getframe(1).f_code.co_filename):
            work = observer.submitted("thread", self)
            run = self.run
            self.run = lambda: observer.running(work, run)  # type: ignore[method-assign]
        original(self)
    start.__wrapped__ = original  # type: ignore[attr-defined]
    return start


def _canceller(task: Any) -> str:
    """Who is cancelling `task`: "self" (the task itself, or a task it started, directly or not: a cancel it
    arranged for itself), "task" (another task: a caller, a TaskGroup's parent, a server shutting down) or
    "callback" (no task is running: a timer, a transport's callback)."""
    try:
        current = asyncio.current_task()
    except RuntimeError:
        current = None
    if current is None:
        return "callback"
    while current is not None:
        if current is task:
            return "self"
        parent = getattr(current, "_observed_parent", None)
        current = parent() if parent is not None else None
    return "task"


def _waits_for_result(fn: Any) -> bool:
    """Whether a done callback is something waiting for the task's outcome (a task awaiting it, `gather`,
    `wait`, `wait_for`, a TaskGroup), not a bookkeeping callback such as a server's connection cleanup."""
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, asyncio.Future) or type(owner).__name__ == "TaskGroup":
        return True
    inner = getattr(fn, "func", fn)  # functools.partial (wait_for's _release_waiter)
    name = getattr(inner, "__qualname__", "")
    return any(part in name for part in ("gather", "_on_completion", "_release_waiter", "wait"))


def _observed_task_class(observer: Observer, base: type) -> type:
    watched: "weakref.WeakSet[Any]" = weakref.WeakSet()  # tasks whose end this observer records

    def ended(task: Any) -> None:
        if not observer.installed:
            return
        if task.cancelled():
            outcome = "cancelled"
        else:
            outcome = "returned" if task._exception is None else "raised"  # exception() would mark it retrieved
        observer.record("task", "end", {"task": task._observed_id, "name": task.get_name(), "outcome": outcome,
                                        "coro": getattr(task.get_coro(), "__qualname__", ""),
                                        "awaited": getattr(task, "_observed_awaited", False)})

    class ObservedTask(base):  # type: ignore[valid-type, misc]
        """A task whose delivered cancels, uncancels and (once cancelled) end are recorded."""

        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            if not hasattr(self, "_observed_id"):  # an observer installed earlier numbered it already
                self._observed_id = next(_task_ids)
                try:
                    parent = asyncio.current_task()
                except RuntimeError:  # built off the loop (no running loop on this thread)
                    parent = None
                self._observed_parent = weakref.ref(parent) if parent is not None else None

        def cancel(self, msg: Any = None) -> bool:
            delivered = super().cancel(msg)
            if delivered and observer.installed:
                if self not in watched:
                    watched.add(self)
                    self.add_done_callback(ended)
                observer.record("task", "cancel", {"task": self._observed_id, "name": self.get_name(),
                                                   "by": _canceller(self)})
            return delivered

        def add_done_callback(self, fn: Any, *, context: Any = None) -> None:
            if _waits_for_result(fn):
                self._observed_awaited = True
            super().add_done_callback(fn, context=context)

        def uncancel(self) -> int:
            left = super().uncancel()
            if observer.installed:
                observer.record("task", "uncancel", {"task": self._observed_id, "name": self.get_name()})
            return left

    ObservedTask.__qualname__ = ObservedTask.__name__ = "Task"  # reprs read as plain asyncio tasks
    ObservedTask.__module__ = base.__module__
    return ObservedTask
