"""`OwnerThread`: the one thread per engine that touches MLX."""

from __future__ import annotations

import asyncio
import atexit
import functools
import logging
import sys
import threading
import time
from typing import Callable, Optional

from mlx_invariants.engine.errors import StartupError
from mlx_invariants.engine.messages import Event, Failed, Finished
from mlx_invariants.engine.model import LoadedModel, load
from mlx_invariants.engine.points import Point, reach

log = logging.getLogger(__name__)


class OwnerThread(threading.Thread):
    """Loads the model, builds and warms the generator, then runs the owner loop; nothing else enters MLX.

    Threads: this thread runs `_start()` (load, realize weights, build, warm
    up), then `_iteration()` until `stop()`, then `_finish()`, which ends every
    request it still holds. Subclasses hold all MLX state as attributes that
    only this thread reads or writes.

    Handoffs: the loop posts plain messages under `self.lock` and calls
    `wake()`; results go back as lists of plain events through
    `loop.call_soon_threadsafe(deliver, events)`. `ready` and `stopped` are loop
    futures resolved the same way, so the loop never blocks on this thread.

    Costs: an idle owner sleeps on an Event (never spins) and wakes at once
    when work, an abort or a stop arrives. Before it sleeps it marks
    `OWNER_IDLE` (`going_idle`): a post may land from there until the wait
    begins, the window in which a lost wake-up loses it.

    Liveness: `progress_at` (a monotonic time, one float written only here) moves
    at every iteration, wake-up and emitted batch of events; the loop reads it to
    tell a busy owner from a wedged one. `crashed` holds what escaped the loop.

    Exit: the thread's own MLX state is released on it before `stopped`
    resolves (`release_mlx_thread_state`), so nothing of it is left for the
    thread's exit, which may overlap the interpreter's shutdown.
    """

    def __init__(self, name: str, source: Optional[str], loop: asyncio.AbstractEventLoop,
                 deliver: Callable[[list[Event]], None], warmup: bool = True):
        super().__init__(name=f"mlx-owner-{name}", daemon=True)
        self.source = source
        self.loop = loop
        self.warmup_enabled = warmup
        self._deliver = deliver
        self.lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self.loaded: Optional[LoadedModel] = None
        self.ready: asyncio.Future[LoadedModel] = loop.create_future()
        self.stopped: asyncio.Future[None] = loop.create_future()
        # Resolved by a shutdown that gave up waiting for this thread to stop (it is stuck inside a call):
        # what waits for the thread to let go of a request lets go instead.
        self.abandoned: asyncio.Future[None] = loop.create_future()
        self.crashed: Optional[BaseException] = None
        self.progress_at = time.monotonic()
        self.last_ended: Optional[str] = None  # the request of the last terminal event emitted; only this thread
        _release_main_thread_at_exit()

    # -- lifecycle, on the owner thread ------------------------------------
    def run(self) -> None:
        try:
            if self._become_ready():
                self._serve()
        finally:
            try:
                release_mlx_thread_state()
            finally:
                self._to_loop(self._resolve, self.stopped, None)

    def _become_ready(self) -> bool:
        """`_start()`, then readiness resolved either way; False if the engine never got ready."""
        try:
            self._start()
        except BaseException as exc:  # readiness must report every startup failure, then the thread ends
            log.error("engine startup failed on %s: %s", self.name, exc, exc_info=True)
            self._to_loop(self._fail_ready, StartupError(f"engine startup failed: {type(exc).__name__}: {exc}"))
            return False
        self._to_loop(self._resolve, self.ready, self.loaded)
        return True

    def _serve(self) -> None:
        """Iterate until `stop()`; `_finish()` ends whatever is still held, even after a crash."""
        try:
            while not self._stopping.is_set():
                self.beat()
                self._iteration()
        except BaseException as exc:  # a bug in the loop itself: die loudly, health goes 503
            self.crashed = exc
            log.critical("owner loop of %s crashed", self.name, exc_info=True)
        finally:
            self._finish()

    def _start(self) -> None:
        """Load and realize the model here, so its arrays and streams belong to this thread."""
        self.loaded = load(self.source)

    def _iteration(self) -> None:
        raise NotImplementedError

    def _finish(self) -> None:
        raise NotImplementedError

    # -- helpers ----------------------------------------------------------------
    def emit(self, events: list[Event]) -> None:
        """Hand plain events to the loop; one call per batch keeps the loop's work per step constant."""
        if events:
            self.beat()
            for event in events:
                if isinstance(event, (Finished, Failed)):
                    self.last_ended = event.rid
            self._to_loop(self._deliver, events)

    def beat(self) -> None:
        """The owner moved on: the loop's stall watch measures from here."""
        self.progress_at = time.monotonic()

    def going_idle(self) -> None:
        """The caller found nothing to do and will wait next: `OWNER_IDLE`, named for the request it ended last
        (none before its first), so a fault or arrival can be posted between the check and the wait."""
        if self.last_ended is not None:
            reach(Point.OWNER_IDLE, self.last_ended)

    def wait_for_work(self) -> None:
        """Sleep until `wake()`; callers re-check their inbox afterwards. A `wake()` since their check, even
        one made while `going_idle` is marked, ends the wait at once: the event is cleared only after it."""
        self.going_idle()
        self._wake.wait()
        self._wake.clear()
        self.beat()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        """Ask the loop to end after the current iteration; safe from any thread."""
        self._stopping.set()
        self.wake()

    def held(self) -> dict[str, int]:
        """What this owner holds for requests, by kind, for `status()`; all zero once every request ended.
        Read from the loop while the owner runs: each count is one `len`, a snapshot, never a lock held
        across owner work."""
        return {}

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def _to_loop(self, fn: Callable[..., None], *args: object) -> None:
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: nobody is left to tell
            log.debug("event loop closed; dropped %s", getattr(fn, "__name__", fn))

    @staticmethod
    def _resolve(future: asyncio.Future, value: object) -> None:
        if not future.done():
            future.set_result(value)

    def _fail_ready(self, error: BaseException) -> None:
        if not self.ready.done():
            self.ready.set_exception(error)


def release_mlx_thread_state() -> None:
    """Free the calling thread's MLX state (compile cache, random key, streams) while Python still runs.

    Why: MLX keeps these per thread, in C++ thread-locals, and compile-cache
    entries and the random key hold Python objects whose destructors take the
    GIL. Left alone, they are destroyed when the thread really exits, after
    `Thread.join()` has already returned: if the interpreter is shutting down
    by then, taking the GIL ends the thread inside a noexcept destructor, and
    the process aborts ("terminate called without an active exception",
    exit 134); the main thread's own are destroyed after the interpreter is
    gone (SIGSEGV, exit 139). `mx.clear_streams()` is MLX's cleanup for a
    thread that is done with it. A no-op where MLX was never imported.
    """
    mx = sys.modules.get("mlx.core")
    if mx is not None:
        mx.clear_streams()


@functools.cache
def _release_main_thread_at_exit() -> None:
    """Release the main thread's MLX state at exit, once per process, before the interpreter goes.

    MLX's own exit hook clears only the compile cache of the thread that
    imported `mlx.core`; engines import it on their owner thread, so a main
    thread that also ran compiled MLX code (a test, a planted engine on the
    event loop) would keep its entries until after the interpreter is gone.
    """
    atexit.register(release_mlx_thread_state)
