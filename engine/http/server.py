"""Run an engine behind uvicorn: start the engine, then listen; on stop, drain, then exit.

Order of a run:
1. `engine.start()`; if it fails the process reports one line and exits 1,
   having never listened, so `/health` never answered 200.
2. Bind and listen; print `listening on http://HOST:PORT` (the real port if 0).
3. Serve until SIGTERM/SIGINT (or `request_stop()`).
4. `engine.shutdown(grace)`: new requests get 503 `engine_shutting_down`,
   running ones may finish within the grace, the rest end with finish reason
   "abort" (streams then get `[DONE]`). Then uvicorn closes connections.

The signals are ours, not uvicorn's: uvicorn would stop the listener and
re-raise the signal after serving, so the process would die by the signal
instead of draining and exiting 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
import threading
from typing import Callable, Iterator, Optional

import uvicorn

from mlx_invariants.engine.base import Engine
from mlx_invariants.engine.errors import StartupError
from mlx_invariants.engine.http.app import build_app
from mlx_invariants.engine.http.telemetry import Counters, LoopLag

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 5  # after the engine drained, how long uvicorn may take to finish the last responses


class _Uvicorn(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # `Server` handles SIGTERM/SIGINT itself, see the module docstring


class Server:
    """One engine served on one socket; `run()` returns the process exit code."""

    def __init__(self, engine: Engine, host: str = "127.0.0.1", port: int = 8000, shutdown_grace_s: float = 5.0,
                 log_level: str = "warning", announce: Callable[[str], None] = print):
        self.engine = engine
        self.host = host
        self.port = port
        self.shutdown_grace_s = shutdown_grace_s
        self.log_level = log_level
        self.announce = announce
        self.counters = Counters()
        self.url: Optional[str] = None
        self.abandoned = 0  # requests the engine still held when the server stopped (a stuck owner thread)
        self.start_failed = False
        self.listening = threading.Event()  # for callers on another thread (tests)
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._stop: Optional[asyncio.Event] = None
        self._stop_reason = ""  # what asked for the stop, for the log line that says it is stopping

    def request_stop(self) -> None:
        """Begin the drain; callable from any thread and from a signal handler."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop_for, "request_stop()")

    def _stop_for(self, reason: str) -> None:
        self._stop_reason = self._stop_reason or reason
        self._stop.set()

    async def run(self, handle_signals: bool = True) -> int:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._loop.add_signal_handler(sig, self._stop_for, sig.name)
        try:
            return await self._run()
        finally:
            if handle_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    self._loop.remove_signal_handler(sig)

    async def _run(self) -> int:
        if not await self._start_engine():
            return 1 if not self._stop.is_set() else 0
        try:
            sock = _listen(self.host, self.port)
        except OSError as exc:
            print(f"invariants serve: cannot listen on {self.host}:{self.port}: {exc}", file=sys.stderr)
            await self.engine.shutdown(0)
            return 1
        lag = LoopLag()
        lag.start()
        config = uvicorn.Config(build_app(self.engine, self.counters, lag), lifespan="off",
                                log_level=self.log_level, access_log=False,
                                timeout_graceful_shutdown=CLOSE_TIMEOUT_S)
        web = _Uvicorn(config)
        serving = asyncio.ensure_future(web.serve(sockets=[sock]))
        host, port = sock.getsockname()[:2]
        self.url = f"http://{host}:{port}"
        self.announce(f"invariants serve: {self.engine.name} engine, model {self.engine.model_id}, "
                      f"listening on {self.url}")
        self.listening.set()
        try:
            stopping = asyncio.ensure_future(self._stop.wait())
            await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            # Why, in the log: a harness reading it must tell a stop it asked for from one it did not.
            why = self._stop_reason if self._stop.is_set() else "the listener ended"
            self.announce(f"invariants serve: stopping ({why}); draining for up to {self.shutdown_grace_s:g}s")
            await self.engine.shutdown(self.shutdown_grace_s)
        finally:
            web.should_exit = True
            await asyncio.gather(serving, return_exceptions=True)
            await lag.stop()
            sock.close()
        self.abandoned = self.counters.open_generations
        if self.abandoned:
            self.announce(f"invariants serve: {self.abandoned} request(s) still held by a stuck owner thread; "
                          "exiting anyway")
        self.announce("invariants serve: stopped")
        return 0

    async def _start_engine(self) -> bool:
        """True once the engine is ready; False if it failed (reported) or a stop came first."""
        model = self.engine.config.model or "the embedded tiny model"
        self.announce(f"invariants serve: starting the {self.engine.name} engine on {model}")
        starting = asyncio.ensure_future(self.engine.start())
        stopping = asyncio.ensure_future(self._stop.wait())
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not starting.done():
            self.announce("invariants serve: stopped while the engine was starting")
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
            await self.engine.shutdown(0)
            return False
        try:
            starting.result()
        except StartupError as exc:
            print(f"invariants serve: the engine failed to start: {exc}", file=sys.stderr)
            self.start_failed = True
            return False
        return True


def run_until_stopped(server: Server) -> int:
    """`server.run()` on a fresh loop, in the main thread; returns its exit code.

    Unlike `asyncio.run`, this does not wait at exit for tasks still closing
    requests: such a task waits, by design and through cancellation, for an
    owner thread that may be stuck inside MLX, and the process must exit anyway.
    """
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(server.run())
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def _listen(host: str, port: int) -> socket.socket:
    family, kind, proto = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)[0][:3]
    # proto must say TCP: asyncio sets TCP_NODELAY only on such sockets, and without it a response
    # written as headers + body waits out the client's delayed ACK (~40 ms per keep-alive request).
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock
