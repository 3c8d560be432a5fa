"""What is fuzzed, as one value: a `Target`, and the `Engines` that build its adapters.

A target is a route of the reference engine (in its own package or in a copy
of it elsewhere), a module factory ("pkg.mod:make"), a server already running
at a loopback URL, or a server command the fuzzer starts. It travels as one
JSON object (`to_dict`/`from_dict`): to child processes, into every report
and every scenario file, so `invariants fuzz --replay FILE` rebuilds it with
no other flag. `build()` is the one way to turn it into adapters.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Optional

from mlx_invariants.fuzz.adapters.base import Adapter
from mlx_invariants.fuzz.adapters.http import HTTP_KINDS, HTTP_POINTS, HttpAdapter, ServerProcess, check_loopback
from mlx_invariants.fuzz.adapters.reference import ReferenceAdapter, reference_engine
from mlx_invariants.fuzz.adapters.served import SERVED_CLIENT_POINTS, SERVED_KINDS, SERVED_PREFIX, served_engine
from mlx_invariants.fuzz.defaults import ENGINE_PACKAGE, HTTP_MODEL
from mlx_invariants.fuzz.errors import TargetError
from mlx_invariants.fuzz.scenario import (CLIENT_POINTS, DEFAULT_KINDS, FAULT_KINDS, POINTS, ROUTES, WORKER_FAULTS,
                                           FaultKind)

# The reference engine's stall bound when "worker-wedges" is asked for (its default, 120 s, is a server's):
# long enough that the injector's own pauses at points (up to `cap_s`, 2 s) never read as a stall.
WEDGE_STALL_TIMEOUT_S = 3.0


class TargetKind(Enum):
    ROUTE = "route"        # a route of the reference engine package (`ENGINES`): simple, batched
    FACTORY = "factory"    # "pkg.mod:make": a callable returning an adapter or a reference-API engine
    URL = "url"            # an OpenAI-compatible server already running on a loopback address
    SERVER = "server"      # a server command with {port}, started with the sentinel injected
    SERVED = "served"      # a route of the reference engine package behind its own HTTP app, served in-process

    @property
    def http(self) -> bool:
        """A server in another process: its owner, model, routes, body and health route are declared."""
        return self in (TargetKind.URL, TargetKind.SERVER)

    @property
    def over_http(self) -> bool:
        """Requests go over HTTP (a served route's too, though its engine runs in this process)."""
        return self.http or self is TargetKind.SERVED

    @property
    def engine_package(self) -> bool:
        """A route of an engine package (`package` applies), served in-process or not."""
        return self in (TargetKind.ROUTE, TargetKind.SERVED)


@dataclass(frozen=True)
class Target:
    """One thing to fuzz. Build it with `reference`, `module_factory`, `url`, `server` or `from_dict`.

    `package` belongs to routes; `owner` (the server's MLX owner thread-name glob, default: the
    first thread to enter MLX), `model` (the model field sent) and `routes` (the OpenAI routes the
    server answers: a chat-only server 404s on completions, and the follow-up must not be sent
    there) and `request_body` (JSON object text merged into every request body: sampling fields a server
    requires, extra fields; it wins over what the fuzzer sends) and `health` (the server's health route,
    "/health": read after a worker fault, and between scenarios) to HTTP targets. `fault_kinds` and
    `points` are what scenarios may aim at it (a run aims its default points only where the target reaches:
    `fuzz.aims`): a server is not restarted per scenario (only after one
    that showed a violation, or lost its worker) and shows only the points a client sees; a launched one
    also takes the worker faults, armed in its sentinel (fuzz/worker_switch.py).
    """

    kind: TargetKind
    name: str
    package: str = ENGINE_PACKAGE
    owner: Optional[str] = None
    model: str = HTTP_MODEL
    fault_kinds: tuple[str, ...] = DEFAULT_KINDS
    points: tuple[str, ...] = POINTS
    routes: tuple[str, ...] = ROUTES
    request_body: str = ""
    health: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.kind, TargetKind):
            raise TargetError(f"target kind must be one of {[k.value for k in TargetKind]}, got {self.kind!r}")
        if not self.name:
            raise TargetError(f"a {self.kind.value} target needs a name")
        if self.kind is TargetKind.FACTORY:
            module, sep, attr = self.name.partition(":")
            if not (module and sep and attr):
                raise TargetError(f"{self.name!r}: a module factory is MODULE:FACTORY (e.g. mypkg.fuzzing:make)")
        if self.kind is TargetKind.URL:
            check_loopback(self.name)
        if self.kind is TargetKind.SERVER and "{port}" not in self.name:
            raise TargetError("a server command needs a {port} placeholder, e.g. "
                              "\"python -m mlx_lm.server --model DIR --port {port}\"")
        if self.package != ENGINE_PACKAGE and not self.kind.engine_package:
            raise TargetError("only a route target names an engine package")
        if (self.owner is not None or self.model != HTTP_MODEL) and not self.kind.http:
            raise TargetError("an owner glob and a model name apply to HTTP targets (--url, --server-cmd) only")
        if self.request_body:
            if not self.kind.http:
                raise TargetError("a request body applies to HTTP targets (--url, --server-cmd) only")
            extra_body(self.request_body)
        if not self.routes or not set(self.routes) <= set(ROUTES):
            raise TargetError(f"routes must be some of {ROUTES}, got {self.routes}")
        if set(self.routes) != set(ROUTES) and not self.kind.http:
            raise TargetError("routes apply to HTTP targets (--url, --server-cmd) only")
        if not self.fault_kinds or not set(self.fault_kinds) <= set(FAULT_KINDS):
            raise TargetError(f"fault kinds must be some of {FAULT_KINDS}, got {self.fault_kinds}")
        if self.kind.http and "restart" in self.fault_kinds:
            raise TargetError("a server cannot be restarted inside a scenario: leave out the restart fault kind")
        takes = HTTP_KINDS + (WORKER_FAULTS if self.kind is TargetKind.SERVER else ())
        if self.kind is TargetKind.SERVED and FaultKind.ABORT.value in self.fault_kinds:
            raise TargetError("a served route takes no abort fault: an HTTP client can only go away (cancel, "
                              "disconnect)")
        if self.kind.http and not set(self.fault_kinds) <= set(takes):
            raise TargetError(f"an HTTP target takes the fault kinds {', '.join(HTTP_KINDS)}, and a launched server "
                              f"(--server-cmd) {', '.join(WORKER_FAULTS)} too; "
                              f"not {', '.join(sorted(set(self.fault_kinds) - set(takes)))}")
        if self.health and (not self.kind.http or not self.health.startswith("/")):
            raise TargetError(f"a health route is a path such as /health, for HTTP targets only; got {self.health!r}")
        known = POINTS + (CLIENT_POINTS if self.kind.over_http else ())  # only a client of a server reaches those
        if not self.points or not set(self.points) <= set(known):
            raise TargetError(f"points must be some of {known}, got {self.points}")

    # -- the ways to name one ---------------------------------------------------------
    @classmethod
    def reference(cls, route: str, package: str = ENGINE_PACKAGE) -> "Target":
        """A route of the reference engine, or of a copy of it importable as `package`."""
        return cls(TargetKind.ROUTE, route, package=package)

    @classmethod
    def served(cls, route: str, package: str = ENGINE_PACKAGE) -> "Target":
        """A route of the reference engine (or of a copy) behind the package's own HTTP app, served by uvicorn
        on a 127.0.0.1 socket inside the fuzzing process (fuzz/adapters/served.py)."""
        kinds, points = _aims(TargetKind.SERVED)
        return cls(TargetKind.SERVED, route, package=package, fault_kinds=kinds, points=points)

    @classmethod
    def module_factory(cls, spec: str) -> "Target":
        return cls(TargetKind.FACTORY, spec)

    @classmethod
    def engine(cls, spec: str) -> "Target":
        """What `--engine` names: a route ("simple"), the route behind its HTTP app ("http-simple"), or
        MODULE:FACTORY if it has a colon."""
        if ":" in spec:
            return cls.module_factory(spec)
        return cls.served(spec[len(SERVED_PREFIX):]) if spec.startswith(SERVED_PREFIX) else cls.reference(spec)

    @classmethod
    def url(cls, url: str, owner: Optional[str] = None, model: str = HTTP_MODEL,
            routes: tuple[str, ...] = ROUTES, request_body: str = "", health: str = "") -> "Target":
        kinds, points = _aims(TargetKind.URL)
        return cls(TargetKind.URL, url, owner=owner, model=model, fault_kinds=kinds, points=points,
                   routes=tuple(routes), request_body=request_body, health=health)

    @classmethod
    def server(cls, command: str, owner: Optional[str] = None, model: str = HTTP_MODEL,
               routes: tuple[str, ...] = ROUTES, request_body: str = "", health: str = "") -> "Target":
        kinds, points = _aims(TargetKind.SERVER)
        return cls(TargetKind.SERVER, command, owner=owner, model=model, fault_kinds=kinds, points=points,
                   routes=tuple(routes), request_body=request_body, health=health)

    # -- JSON -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The JSON form: kind and name, and the fields that belong to the kind."""
        data: dict[str, Any] = {"kind": self.kind.value, "name": self.name}
        if self.kind.engine_package:
            data["package"] = self.package
        if self.kind.http:
            data.update(owner=self.owner, model=self.model, routes=list(self.routes))
            if self.request_body:
                data["request_body"] = self.request_body
            if self.health:
                data["health"] = self.health
        data.update(fault_kinds=list(self.fault_kinds), points=list(self.points))
        return data

    @classmethod
    def from_dict(cls, data: Any) -> "Target":
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            raise TargetError(f"a target is an object with a kind and a name, got {data!r}")
        try:
            kind = TargetKind(data.get("kind"))
        except ValueError:
            raise TargetError(f"target kind must be one of {[k.value for k in TargetKind]}, "
                              f"got {data.get('kind')!r}") from None
        kinds, points = _aims(kind)
        try:
            return cls(kind, data["name"], data.get("package", ENGINE_PACKAGE), data.get("owner"),
                       data.get("model", HTTP_MODEL), tuple(data.get("fault_kinds", kinds)),
                       tuple(data.get("points", points)), tuple(data.get("routes", ROUTES)),
                       data.get("request_body", ""), data.get("health", ""))
        except TypeError as exc:
            raise TargetError(f"not a target: {data!r} ({exc})") from None

    @property
    def points_given(self) -> bool:
        """Whether `points` were chosen rather than left at the kind's default: a test's, or the points a run
        aimed at and recorded (`fuzz.aims`), which a run uses as they are instead of narrowing them."""
        return set(self.points) != set(_aims(self.kind)[1])

    @property
    def arms_worker_faults(self) -> bool:
        """Whether worker faults are armed in a launched server's sentinel: it was asked for one."""
        return self.kind is TargetKind.SERVER and bool(set(WORKER_FAULTS) & set(self.fault_kinds))

    # -- what it is called, what it builds ----------------------------------------------
    @property
    def label(self) -> str:
        """A short name for summaries and report folders."""
        if self.kind.engine_package:
            route = SERVED_PREFIX + self.name if self.kind is TargetKind.SERVED else self.name
            return route if self.package == ENGINE_PACKAGE else f"{self.package}.{route}"
        return f"http:{self.name}" if self.kind.http else self.name

    def describe(self) -> str:
        """One line for people: the kind, the name, and what else the JSON form holds besides the aims."""
        skip = ("kind", "name", "fault_kinds", "points") + (("routes",) if set(self.routes) == set(ROUTES) else ())
        extra = {k: v for k, v in self.to_dict().items() if k not in skip}
        return f"{self.kind.value} {self.name}" + "".join(f", {k} {v}" for k, v in extra.items() if v is not None)

    def check(self) -> None:
        """Fail now (TargetError) if this target builds nothing. An HTTP target was checked when it was
        made; its server starts only when a run first uses it."""
        if not self.kind.http:
            self.build()

    def build(self) -> "Engines":
        """The adapter factory for this target; a route or a module factory is imported now, so a name
        that builds nothing fails before anything runs."""
        if self.kind.engine_package:
            # Asked to wedge its worker, the reference engine gets a stall bound a scenario can wait out.
            wedges = FaultKind.WORKER_WEDGES.value in self.fault_kinds
            config = {"stall_timeout_s": WEDGE_STALL_TIMEOUT_S} if wedges else {}
            make = reference_engine(self.name, self.package, **config)
            if self.kind is TargetKind.SERVED:
                return Engines(self, served_engine(self.package, make))
            return Engines(self, make)
        if self.kind is TargetKind.FACTORY:
            return Engines(self, _module_factory(self.name))
        server = ServerProcess(self.name, self.owner, switch=self.arms_worker_faults) \
            if self.kind is TargetKind.SERVER else None
        url = check_loopback(self.name) if self.kind is TargetKind.URL else ""
        body = extra_body(self.request_body)
        return Engines(self, lambda: HttpAdapter(url, server, self.model, self.routes, body, self.health), server)


def extra_body(text: str) -> dict[str, Any]:
    """The JSON object `text` names ({} for ""); anything else is a `TargetError`."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise TargetError(f"the request body must be a JSON object, got {text!r} ({exc})") from None
    if not isinstance(value, dict):
        raise TargetError(f"the request body must be a JSON object, got {text!r}")
    return value


def _aims(kind: TargetKind) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The fault kinds and points a target of `kind` takes unless told otherwise: a server is not
    restarted per scenario (no shutdown, no restart, no raise) and shows only the points a client sees;
    an in-process one takes every kind but the opt-in ones (`OPT_IN_KINDS`);
    SERVER_STEP counts the MLX calls a launched server's sentinel records, so a bare URL never reaches it."""
    if kind is TargetKind.SERVED:
        return SERVED_KINDS, POINTS + SERVED_CLIENT_POINTS
    if not kind.http:
        return DEFAULT_KINDS, POINTS
    points = HTTP_POINTS if kind is TargetKind.SERVER else tuple(p for p in HTTP_POINTS if p != "SERVER_STEP")
    return HTTP_KINDS, points


class Engines:
    """Builds a fresh adapter for `target` each time it is called (once per engine the run starts).

    An HTTP target's server starts on first use and serves every adapter; `close()` stops it and removes its
    log (it is also stopped at exit), and `retire_server()` stops it so that the next adapter starts a new one.
    """

    def __init__(self, target: Target, make: Callable[[], Adapter], server: Optional[ServerProcess] = None):
        self.target = target
        self._make = make
        self._server = server

    def __call__(self) -> Adapter:
        return self._make()

    def prepare(self) -> float:
        """Start what is shared (a server) now, so a server that cannot start is a setup error
        (`ServerError`, with its log) before any scenario runs; the seconds it took to answer (0.0 if
        nothing needed starting)."""
        if self._server is None:
            return 0.0
        self._server.ensure()
        return self._server.ready_s

    @property
    def server_log(self) -> Optional[Path]:
        """The started server's log file (stdout and stderr), if this target starts one."""
        return self._server.log if self._server is not None else None

    def retire_server(self) -> bool:
        """Stop a launched server after a scenario that showed a violation, as an in-process engine is
        retired then: a server a scenario wedged (a leaked slot) would stall every later scenario for the
        whole stall bound, and re-runs on it are no independent evidence. False when there is none."""
        if self._server is None or self._server.process is None:
            return False
        self._server.stop()
        return True

    @property
    def sees_server_mlx(self) -> bool:
        """Whether the sentinel records the MLX calls of what this target runs: a server launched here
        (a bare URL's server is out of sight; an in-process engine's MLX is seen directly)."""
        return self._server is not None

    def log_tail(self, lines: int = 30) -> str:
        """The server's last log lines ("" when there is no server), for reports."""
        return self._server.log_tail(lines) if self._server is not None else ""

    def close(self) -> None:
        if self._server is not None:
            self._server.close()


def _module_factory(spec: str) -> Callable[[], Adapter]:
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise TargetError(f"{spec!r}: cannot import {module_name} ({exc}); is it on PYTHONPATH?") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise TargetError(f"{spec!r}: {module_name} has no callable {attr}")

    def make() -> Adapter:
        made: Any = factory()
        if hasattr(made, "set_point_hook"):
            return made
        return ReferenceAdapter(lambda: made, name=spec)
    return make
