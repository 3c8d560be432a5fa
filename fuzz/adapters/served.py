"""Adapter for a route of the reference engine served by its own HTTP app inside the fuzzing process.

`invariants fuzz --engine http-simple` (or `http-batched`): the engine is started in this process, as
for `--engine simple`, and the engine package's own app (`<package>.http.build_app`, the one
`invariants serve` runs) is served by uvicorn on a free 127.0.0.1 port, on the fuzzer's own event loop.
Every request then goes over a real socket through the app (parsing, tokenizing, admission answers,
streaming relay, disconnect handling), while everything the in-process routes have still holds: the
engine marks its points (the client adds BODY_PART), the sentinel sees its MLX calls in this process,
its threads and tasks are in sight of the stall watch and the rest state, and raise/worker faults land
in its owner thread.

Why the fuzzer's loop and not a server thread of its own: the engine answers on the loop it was started
on, so with the server on a second loop the engine's loop-side points, its tasks and the handlers'
reaction to a disconnect would run where the driver's "the loop is idle" cannot see them, and a worker
would be resumed before the server had taken the fault. On one loop, the driver's quiescence covers the
server as it covers an in-process engine.

Request ids: the client names each request with `X-Request-Id`, and the app names it
`cmpl-<id>` or `chatcmpl-<id>` in the engine; the point hook maps those back to the scenario's ids.

Shutdown runs as `invariants serve` stops on SIGTERM: the engine drains while the app still listens
(new requests are answered 503 over HTTP meanwhile), `/health` is read during the drain and once the
engine stopped (`stopping_health`, judged by `health-while-stopping`), then the server closes. A request
sent once it closed is refused by the adapter, as a stopped process refuses connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import re
import socket
from typing import Any, Awaitable, Callable, Optional

from mlx_invariants.fuzz.adapters.http import HttpAdapter, HttpHandle
from mlx_invariants.fuzz.adapters.reference import ReferenceAdapter
from mlx_invariants.fuzz.errors import Refused, TargetError
from mlx_invariants.fuzz.faults import wait_loop_idle
from mlx_invariants.fuzz.scenario import DEFAULT_KINDS, FaultKind, RequestSpec
from mlx_invariants.points import Point

# What the app's X-Request-Id accepts (engine/http/app.py); a scenario id's other characters become "_".
_NOT_IN_ID = re.compile(r"[^A-Za-z0-9._:-]")
# The engine ids the app makes of an X-Request-Id, one per route (engine/http/app.py `GenerationRoute`).
_PREFIXES = ("cmpl-", "chatcmpl-")
# How long uvicorn may take to finish the last responses once the engine drained (`invariants serve`'s).
CLOSE_TIMEOUT_S = 5
# `--engine http-simple`: the route's name after this prefix.
SERVED_PREFIX = "http-"
# Points the client itself reaches: the engine marks every other one, where it happens (SERVER_STEP needs a
# launched server's records; here the engine's own points say more).
CLIENT_MARKS = frozenset({Point.BODY_PART})
SERVED_CLIENT_POINTS: tuple[str, ...] = tuple(point.name for point in Point if point in CLIENT_MARKS)
# The fault kinds a served route takes unless told otherwise: the in-process ones (its engine runs here),
# but not those an HTTP client cannot do (an abort call: it can only go away) or that do nothing more over
# HTTP than a cancel (a second cancel lands on the client's own task, not on the server's handler).
SERVED_KINDS: tuple[str, ...] = tuple(kind for kind in DEFAULT_KINDS
                                      if kind not in (FaultKind.ABORT.value, FaultKind.CANCEL_TWICE.value))


class ServedAdapter(HttpAdapter):
    """An HTTP client of the reference engine's app, served here by uvicorn on this loop; the engine itself
    is `inner`'s (a `ReferenceAdapter`): started, stopped, restarted and asked for status, capacity, its
    stall bound and its own invariants as in-process."""

    def __init__(self, inner: ReferenceAdapter):
        super().__init__("", None, model="", health="/health")
        self.inner = inner
        self.name = f"http {inner.name}"
        self.owner = inner.owner
        self.busy_bound_s = inner.busy_bound_s
        # The app hears of a gone client from its socket, a loop turn or two after the client left.
        self.release_grace_s = 1.0
        # /health as read while the engine drained and once it stopped, for the driver to record.
        self.stopping_health: list[dict[str, Any]] = []
        self._engine_hook: Optional[Callable[[Any, str, dict], None]] = None
        self._rids: dict[str, str] = {}  # engine request id -> the scenario's
        self._web: Any = None            # the uvicorn server while it serves
        self._serving: Optional[asyncio.Task] = None

    # An in-process engine: the sentinel sees its MLX directly, so there are no server records to collect
    # (the driver tells a launched server by this attribute).
    collect = None

    # -- points ---------------------------------------------------------------------------
    def set_point_hook(self, hook: Optional[Callable[[Any, str, dict], None]]) -> None:
        super().set_point_hook(hook)
        self._engine_hook = hook
        self.inner.set_point_hook(self._from_engine if hook is not None else None)

    def _from_engine(self, point: Any, rid: str, info: dict) -> None:
        hook = self._engine_hook
        if hook is not None:
            hook(point, self._rids.get(rid, rid), info)

    def reach(self, point: Point, rid: str, **info: Any) -> Optional[Awaitable[None]]:
        if point in CLIENT_MARKS:  # ADMITTED and CHUNK_SENT come from the engine, not from the client
            return super().reach(point, rid, **info)
        return None

    def request_headers(self, spec: RequestSpec) -> dict[str, str]:
        """X-Request-Id, so the engine's points name the scenario's request."""
        sent = _NOT_IN_ID.sub("_", spec.rid)[:64]
        for prefix in _PREFIXES:
            self._rids[prefix + sent] = spec.rid
        return {"X-Request-Id": sent}

    # -- the engine and its server ----------------------------------------------------------
    async def start(self) -> None:
        await self.inner.start()
        engine = self.inner.engine
        http = _http_package(self.inner.package.__name__)
        import uvicorn

        sock = _listen()
        config = uvicorn.Config(http.build_app(engine), lifespan="off", log_level="warning", access_log=False,
                                timeout_graceful_shutdown=CLOSE_TIMEOUT_S)
        self._web = _quiet_server(config)
        # Named as the fuzzer's: its housekeeping tick (every 0.1 s) is not the engine doing anything.
        self._serving = asyncio.get_running_loop().create_task(self._web.serve(sockets=[sock]),
                                                               name="fuzz-served-uvicorn")
        while not self._web.started:  # uvicorn says so once its listener is up
            if self._serving.done():
                self._serving.result()
                raise TargetError("the engine's HTTP app stopped before it listened")
            await asyncio.sleep(0.005)  # waiting for our own server to start; no scenario event is ordered by it
        self.url = "http://127.0.0.1:%d" % sock.getsockname()[1]
        self.model = engine.model_id
        await super().start()
        # A readiness probe reads /health before traffic is sent, as a load balancer does; not judged here
        # (the engine is ready), but a health route that remembers answers holds one from now on.
        await self.read_health()

    async def submit(self, spec: RequestSpec, scored: Optional[dict[str, Any]] = None) -> HttpHandle:
        if self._web is None:
            raise Refused("engine_shutting_down", "the engine's server has stopped (connection refused)")
        return await super().submit(spec, scored)

    async def shutdown(self) -> None:
        """The engine drains while the app still answers, as `invariants serve` stops; then the server closes."""
        draining = asyncio.ensure_future(self.inner.shutdown())
        if self._web is not None:
            await wait_loop_idle()  # the drain has begun (its first steps ran): the engine is shutting down
            self.stopping_health.append({"during": "drain" if not draining.done() else "stopped",
                                         "healthy": await self.read_health()})
        await draining
        if self._web is not None:
            self.stopping_health.append({"during": "stopped", "healthy": await self.read_health()})
            web, serving, self._web, self._serving = self._web, self._serving, None, None
            web.should_exit = True
            await asyncio.gather(serving, return_exceptions=True)
        await super().shutdown()

    async def read_health(self) -> Optional[bool]:
        """Whether the app's `/health` answers 200 now, over HTTP; None while the server is not up."""
        if self._web is None or self._client is None:
            return None
        import httpx

        try:
            response = await asyncio.wait_for(self._client.get(self.health), 2.0)
        except (httpx.HTTPError, asyncio.TimeoutError):
            return False
        return response.status_code == 200

    # -- what the engine says of itself, read in-process -----------------------------------
    @property
    def healthy(self) -> bool:
        return self.inner.healthy

    @property
    def stall_timeout_s(self) -> Optional[float]:
        return self.inner.stall_timeout_s

    def capacity(self) -> Optional[int]:
        return self.inner.capacity()

    def status(self) -> dict[str, int]:
        return self.inner.status()

    def broken_invariants(self) -> list[str]:
        return self.inner.broken_invariants()

    @property
    def rest_series(self) -> None:
        return None  # in-process: the driver samples the rest state itself


def _quiet_server(config: Any) -> Any:
    """A uvicorn server that leaves SIGINT and SIGTERM to the fuzzer, whose part it is."""
    import uvicorn

    class QuietServer(uvicorn.Server):
        def capture_signals(self) -> contextlib.AbstractContextManager:
            return contextlib.nullcontext()
    return QuietServer(config)


def _http_package(package: str) -> Any:
    """`<package>.http`, the engine package's HTTP front end (a copy's own, for a copied engine)."""
    try:
        http = importlib.import_module(f"{package}.http")
    except ImportError as exc:
        raise TargetError(f"cannot import {package}.http, the engine's HTTP app ({exc}); "
                          "pip install 'mlx-invariants[engine]'") from None
    if not callable(getattr(http, "build_app", None)):
        raise TargetError(f"{package}.http has no build_app: not the reference engine's HTTP front end")
    return http


def _listen() -> socket.socket:
    """A listening TCP socket on a free 127.0.0.1 port (TCP_NODELAY applies: proto is TCP)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


def served_engine(package: str, make_inner: Callable[[], ReferenceAdapter]) -> Callable[[], ServedAdapter]:
    """An adapter factory: the engine `make_inner` makes (a route of `package`), behind the package's app."""
    _http_package(package)  # a package without the app fails now, before anything runs
    return lambda: ServedAdapter(make_inner())
