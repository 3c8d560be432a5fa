"""Shared fixtures: the tiny model once per session, a free loopback port, a real HTTP server."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any, Callable, Optional

import pytest

# How long a fuzz run in a test may take before the clock, not its example count, ends it. run_fuzz falls back
# to the profile's budget (120 s for ci) when only `examples` is given, so a loaded machine cut runs short of
# their count (216 of 300 examples once); tests pass this instead, a backstop no run reaches: pytest-timeout
# stops a hung test first. Shrinking gets it too (`shrink_s`), so what a test checks about a shrunk finding
# does not depend on how fast the box is.
BACKSTOP_S = 3600.0
# How long a test waits for a condition that holds in milliseconds on an idle box: long enough for a
# loaded 2-core CI machine, and reached only when something is broken.
WAIT_S = 60.0


@pytest.fixture(scope="session")
def tiny_model() -> str:
    from mlx_invariants.engine.model import tiny_model_path

    return str(tiny_model_path())


@pytest.fixture
def free_port() -> int:
    """A port free on 127.0.0.1 a moment ago; prefer `--port 0` and the announced URL where possible."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(condition: Callable[[], bool], timeout: float = WAIT_S, interval: float = 0.005) -> bool:
    """Poll `condition` until it holds; False on timeout (callers assert it)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


class ServerThread:
    """`engine.http.Server` on 127.0.0.1:0 in a background thread with its own event loop.

    The engine's owner thread and the points hook are the real ones, so tests
    can hold the owner at a point while talking HTTP to the server.
    """

    def __init__(self, engine_name: str = "simple", **config: Any):
        from mlx_invariants.engine import ENGINES, EngineConfig
        from mlx_invariants.engine.http.server import Server

        self.engine = ENGINES[engine_name](EngineConfig(**config))
        self.server = Server(self.engine, "127.0.0.1", 0, shutdown_grace_s=2.0, announce=lambda line: None)
        self.exit_code: Optional[int] = None
        self._thread = threading.Thread(target=self._main, name="http-server-under-test", daemon=True)

    def _main(self) -> None:
        self.exit_code = asyncio.run(self.server.run(handle_signals=False))

    def __enter__(self) -> "ServerThread":
        self._thread.start()
        assert wait_for(lambda: self.server.listening.is_set() or not self._thread.is_alive(), 120), \
            "the server did not start listening within 120s"
        assert self.server.listening.is_set(), f"the server exited with {self.exit_code} before listening"
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.request_stop()
        self._thread.join(WAIT_S)
        assert not self._thread.is_alive(), f"the server did not stop within {WAIT_S:g}s"

    @property
    def url(self) -> str:
        assert self.server.url is not None
        return self.server.url

    @property
    def model_id(self) -> str:
        return self.engine.model_id

    def status(self) -> dict[str, Any]:
        import httpx

        return httpx.get(self.url + "/v1/status", timeout=WAIT_S).json()

    def wait_idle(self, timeout: float = WAIT_S) -> bool:
        """True once no request is admitted, queued or being relayed."""
        def idle() -> bool:
            status = self.status()
            return (status["active"] == 0 and status["queued"] == 0 and not status["requests"]
                    and status["server"]["open_generations"] == 0)
        return wait_for(idle, timeout, interval=0.01)


@pytest.fixture(scope="session")
def http_server_session(tiny_model):
    with ServerThread("simple", model=tiny_model) as running:
        yield running


@pytest.fixture
def http_server(http_server_session: ServerThread) -> ServerThread:
    """The session's SimpleEngine server (fail-fast), idle at the start of the test."""
    assert http_server_session.wait_idle(), "a previous test left a request running"
    return http_server_session
