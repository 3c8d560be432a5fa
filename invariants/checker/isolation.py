"""Bound the analysis of one file in time, so a file that stalls it is reported, not waited on.

Two mechanisms, by what can be interrupted:

- `map_limited`: Python code. The items are worked through in one thread with a big stack; the
  calling thread watches the process's CPU time and, once the current item is past the limit,
  raises `Stopped` in the worker thread (`PyThreadState_SetAsyncExc`). It lands at the
  worker's next Python instruction, so a native call that holds the GIL (libcst's parser) is
  stopped only once it returns.
- `Worker`: a child process for work that may stall (or crash) in native code. Each request
  runs under a CPU-time rlimit; the kernel ends a child that runs past it with SIGXCPU, and
  the request is answered with the reason. The next request starts a new child.

Limits are CPU seconds, not wall-clock seconds: a file is not stopped because the machine
is busy with something else.
"""

from __future__ import annotations

import ctypes
import faulthandler
import math
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

try:
    import resource
except ImportError:  # pragma: no cover - Windows: the child is bounded by the wall clock instead
    resource = None  # type: ignore[assignment]

T = TypeVar("T")
# libcst's parser recurses natively, and its code generation (positions) and the rules recurse in
# Python: a 5 000-branch `if/elif` chain needs about 20 000 frames. A big thread stack turns
# deep nesting into a clean RecursionError (or a success) instead of a crash.
STACK_BYTES = 256 * 1024 * 1024
RECURSION_LIMIT = 50_000
_POLL_S = 0.1
STOPPED = "stopped"  # `Worker.ask`'s reason for a child that ran past its limit


class Stopped(BaseException):
    """Raised in the worker thread when the item it works on runs past the time limit (a
    BaseException, so the analysis's own `except Exception` handlers do not swallow it).
    Each firing raises a subclass whose `index` names the item it was meant for: it may land
    only after that item is done."""

    index = -1


def in_deep_stack(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` in a thread with a large stack and a higher recursion limit."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        old = sys.getrecursionlimit()
        sys.setrecursionlimit(max(old, RECURSION_LIMIT))
        try:
            outcome["value"] = fn(*args)
        except BaseException as exc:  # re-raised in the caller's thread below
            outcome["error"] = exc
        finally:
            sys.setrecursionlimit(old)

    thread = _start(target)
    if thread is None:  # a platform that refuses big stacks: run here
        return fn(*args)
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def map_limited(fn: Callable[[Any], T], items: list[Any], limit: float) -> list[T | None]:
    """`[fn(item) for item in items]` in a thread with a large stack, each item allowed `limit`
    seconds of CPU time (0: no limit); the result of an item stopped past it is None."""
    if not limit:
        return in_deep_stack(lambda: [fn(item) for item in items])
    watch = _Watch()
    results: list[T | None] = [None] * len(items)

    def run() -> None:
        done = 0
        while done < len(items):
            try:
                try:
                    while done < len(items):
                        watch.begin(done)
                        value = fn(items[done])
                        watch.end()
                        results[done] = value
                        done += 1
                except Stopped as exc:  # meant for item `index`, which is done with either way
                    watch.end()
                    results[exc.index] = None
                    done = max(done, exc.index + 1)
            except Stopped as exc:  # a second firing that landed in the handler above
                watch.end()
                results[exc.index] = None
                done = max(done, exc.index + 1)

    outcome: dict[str, BaseException] = {}

    def target() -> None:
        old = sys.getrecursionlimit()
        sys.setrecursionlimit(max(old, RECURSION_LIMIT))
        try:
            run()
        except BaseException as exc:  # re-raised in the caller's thread below
            outcome["error"] = exc
        finally:
            sys.setrecursionlimit(old)

    thread = _start(target)
    if thread is None:  # a platform that refuses big stacks: run here, unbounded
        return [fn(item) for item in items]
    while thread.is_alive():
        thread.join(_POLL_S)
        watch.check(thread, limit)
    if "error" in outcome:
        raise outcome["error"]
    return results


class _Watch:
    """Which item the worker thread is on and since when (CPU time); fires `Stopped` past the limit."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.index: int | None = None
        self.started = 0.0

    def begin(self, index: int) -> None:
        with self.lock:
            self.index, self.started = index, time.process_time()

    def end(self) -> None:
        with self.lock:
            self.index = None

    def check(self, thread: threading.Thread, limit: float) -> None:
        with self.lock:  # the worker cannot move to another item while this fires
            if self.index is not None and thread.ident is not None and time.process_time() - self.started > limit:
                # Again at each poll while the item goes on, should something swallow it.
                stop = type("Stopped", (Stopped,), {"index": self.index})
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(stop))


def _start(target: Callable[[], None]) -> threading.Thread | None:
    previous = threading.stack_size()
    try:
        threading.stack_size(STACK_BYTES)
        thread = threading.Thread(target=target, name="invariants-check", daemon=True)
        thread.start()
    except (ValueError, RuntimeError):
        return None
    finally:
        threading.stack_size(previous)
    return thread


class Worker:
    """A child process that answers requests one at a time with `handler(request)`, each under
    `limit` seconds of CPU time (0: none). `ask` returns (answer, None), or (None, why) when the
    request failed: STOPPED past the limit, else how the child crashed; after a death the next
    request starts a new child."""

    def __init__(self, handler: Callable[[Any], Any], limit: float) -> None:
        self.handler = handler
        self.limit = limit
        self._process: Any = None
        self._connection: Any = None
        self._timed_out = False

    def _start(self) -> None:
        import multiprocessing

        methods = multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("fork" if "fork" in methods else None)
        ours, theirs = context.Pipe()
        self._process = context.Process(target=_serve, args=(theirs, self.handler, self.limit),
                                        name="invariants-check-isolated", daemon=True)
        self._process.start()
        theirs.close()
        self._connection = ours

    def ask(self, request: Any) -> tuple[Any, str | None]:
        if self._process is None:
            self._start()
        try:
            self._connection.send(request)
            # Without rlimits the wall clock bounds the child instead.
            wait = None if resource is not None or not self.limit else self.limit + 1
            if self._connection.poll(wait):
                answered, answer = self._connection.recv()
                return (answer, None) if answered else (None, answer)
            self._timed_out = True
        except (EOFError, OSError):  # the child died: its exit code says why
            pass
        return None, self._end()

    def _end(self) -> str:
        process = self._process
        if process.is_alive():
            process.kill()
        process.join()
        self._connection.close()
        self._process = self._connection = None
        code = process.exitcode
        if self._timed_out or (code == -getattr(signal, "SIGXCPU", 0) and self.limit):
            self._timed_out = False
            return STOPPED
        if code is not None and code < 0:
            try:
                return f"crashed (killed by {signal.Signals(-code).name})"
            except ValueError:
                return f"crashed (killed by signal {-code})"
        return f"crashed (exit code {code})"

    def close(self) -> None:
        if self._process is not None:
            try:
                self._connection.send(None)
            except OSError:
                pass
            self._process.join(5)
            if self._process.is_alive():
                self._process.kill()
                self._process.join()
            self._connection.close()
            self._process = self._connection = None


def _serve(connection: Any, handler: Callable[[Any], Any], limit: float) -> None:
    """The child's loop: a request, its answer, until told to stop (None) or the pipe closes."""
    faulthandler.disable()  # a crash here is reported as one INV000 line, not a traceback on stderr
    if resource is not None:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # SIGXCPU must not leave a core file behind
    while True:
        try:
            request = connection.recv()
        except (EOFError, OSError):
            return
        if request is None:
            return
        if resource is not None and limit:
            # Past the in-process watchdog's limit (which stops Python code cleanly), the kernel
            # ends the child: the margin leaves the watchdog the first word.
            used = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
            _, hard = resource.getrlimit(resource.RLIMIT_CPU)
            soft = math.ceil(used + limit) + 1
            if hard == resource.RLIM_INFINITY or soft <= hard:
                resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
        try:
            answer = (True, handler(request))
        except Exception as exc:  # noqa: BLE001 - one request's failure is its answer, not the child's end
            answer = (False, f"crashed ({type(exc).__name__})")
        connection.send(answer)
