"""Adapter for engines with the reference API: `submit(Pending) -> RequestStream`, `shutdown`, `status`.

Works on every route of `mlx_invariants.engine` (its `ENGINES` registry), and on any copy of the
engine package under another import path (the fuzz-kill tests, `invariants
mutants`): the engine package's public surface (`set_point_hook`, `Pending`,
`SamplingParams`, `EngineError`) is looked up in the package of the engine
class (or of the nearest base class whose package has it: a user's subclass in
a plain module), so a copy is fuzzed through its own `set_point_hook`, and
nothing here reaches into the engine's modules.
"""

from __future__ import annotations

import asyncio
import importlib
from types import ModuleType
from typing import Any, Callable, Optional

from mlx_invariants.fuzz.adapters.base import Outcome, PointHook, Returned, prompt_text
from mlx_invariants.fuzz.defaults import ENGINE_PACKAGE, REFERENCE_OWNER
from mlx_invariants.fuzz.errors import Refused, TargetError
from mlx_invariants.fuzz.rest import held_counts
from mlx_invariants.fuzz.scenario import RequestSpec

# How the fuzzer configures a route beyond the engine's defaults: the serialized route waits for its
# slot behind a short queue, so admission's waiting and busy paths are fuzzed too.
FUZZ_CONFIG: dict[str, dict[str, Any]] = {"simple": {"admission": "wait", "max_queue": 4}}


class StreamHandle:
    """One `RequestStream`, yielding token ids; `leads` has, per token, how far its likeliest token led the
    second in log-probability (None where the engine reported no top log-probabilities), and `returned` the
    text and log-probabilities each token came with."""

    def __init__(self, stream: Any):
        self.stream = stream
        self.leads: list[Optional[float]] = []
        self.returned = Returned()

    def __aiter__(self) -> "StreamHandle":
        return self

    async def __anext__(self) -> int:
        token = await self.stream.__anext__()
        top = getattr(token, "top_logprobs", ())
        self.leads.append(top[0][1] - top[1][1] if len(top) > 1 else None)
        self.returned.add(getattr(token, "text", ""), getattr(token, "logprob", None) is not None, len(top))
        return token.token

    async def wait_ended(self) -> None:
        await self.stream.wait_ended()

    def outcome(self) -> Outcome:
        result = self.stream.result
        if result is None:
            return Outcome("error", message="stream ended without a terminal event")
        if hasattr(result, "reason"):
            return Outcome("aborted" if result.reason == "abort" else "completed", reason=result.reason)
        return Outcome("error", message=result.message)

    def abort(self) -> bool:
        return self.stream.abort()

    async def close(self) -> None:
        await self.stream.aclose()


class ReferenceAdapter:
    """Builds the engine with `factory()` inside the first `start()` (so its locks are built under the lock
    watch); a later `start()`, after `shutdown()` (the "restart" fault), starts that same engine again, as
    a server restarts its engine on a config reload, so whatever its stop left behind is still there.

    One adapter serves scenario after scenario while the fuzzer reuses its engine; `status()` and
    `healthy` are what it checks between them.
    """

    def __init__(self, factory: Callable[[], Any], name: str = "", owner: Optional[str] = REFERENCE_OWNER,
                 busy_bound_s: float = 1.0):
        self.factory = factory
        self.name = name or getattr(factory, "__name__", "engine")
        self.owner = owner
        self.busy_bound_s = busy_bound_s
        self.engine: Any = None
        self._hook: Optional[PointHook] = None
        self._package: Optional[ModuleType] = None  # the engine's package: its public surface
        self._shutdown: Optional[asyncio.Task] = None

    @property
    def package(self) -> Optional[ModuleType]:
        """The engine package whose public surface this engine uses (a copy's own); None before `start()`."""
        return self._package

    def broken_invariants(self) -> list[str]:
        """The engine's own (`broken_invariants`, where its class declares them)."""
        declared = getattr(self.engine, "broken_invariants", None)
        return declared() if declared is not None else []

    def set_point_hook(self, hook: Optional[PointHook]) -> None:
        self._hook = hook
        if self._package is not None:
            self._package.set_point_hook(hook)

    async def start(self) -> None:
        if self.engine is None:
            engine = self.factory()
            self._package = _engine_package(type(engine))
            self.engine = engine
        self._shutdown = None  # a restart: the next shutdown is this run's
        self._package.set_point_hook(self._hook)
        await self.engine.start()

    async def submit(self, spec: RequestSpec) -> StreamHandle:
        return await self._submit(spec, self._params(spec))

    async def submit_scored(self, spec: RequestSpec) -> StreamHandle:
        """`submit`, with at least the two likeliest tokens' log-probabilities at each step (the handle's
        `leads`): what the concurrency oracle needs to tell a near-tie from a different answer
        (fuzz/differential.py)."""
        return await self._submit(spec, self._params(spec, top_logprobs=max(2, spec.top_logprobs)))

    def _params(self, spec: RequestSpec, **override: Any) -> Any:
        """The engine's own `SamplingParams` for what `spec` asks for."""
        return self._package.SamplingParams(**{
            "max_tokens": spec.max_tokens, "temperature": spec.temperature, "top_p": spec.top_p, "seed": spec.seed,
            "stop": spec.stop, "logprobs": spec.logprobs, "top_logprobs": spec.top_logprobs, **override})

    async def _submit(self, spec: RequestSpec, params: Any) -> StreamHandle:
        m = self._package
        pending = m.Pending(spec.rid, self._prompt(spec), params)
        try:
            stream = await self.engine.submit(pending)
        except m.EngineError as exc:
            raise Refused(exc.code, str(exc)) from None
        return StreamHandle(stream)

    def _prompt(self, spec: RequestSpec) -> tuple[int, ...]:
        tokenizer = self.engine.tokenizer
        text = prompt_text(spec)
        if spec.route == "chat":
            return tuple(tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                       add_generation_prompt=True))
        return tuple(tokenizer.encode(text))

    async def shutdown(self) -> None:
        if self.engine is None:
            return
        if self._shutdown is None:
            self._shutdown = asyncio.ensure_future(self.engine.shutdown(grace_s=2.0))
        try:
            await asyncio.shield(self._shutdown)
        finally:
            if self._package is not None and self._shutdown.done():
                self._package.set_point_hook(None)

    @property
    def healthy(self) -> bool:
        """False once the engine stopped or its owner died: the next scenario gets a fresh engine."""
        return self.engine is not None and bool(getattr(self.engine, "healthy", True))

    @property
    def stall_timeout_s(self) -> Optional[float]:
        """How long the engine lets its owner make no progress while requests are held before it ends them
        and refuses new ones (its promise about a wedged worker); None before it is built."""
        return self.engine.config.stall_timeout_s if self.engine is not None else None

    def capacity(self) -> Optional[int]:
        """Requests the engine holds at once (slots and queue), as its status reports; None if it does not."""
        value = self.engine.status().get("capacity") if self.engine is not None else None
        return value if isinstance(value, int) else None

    def status(self) -> dict[str, int]:
        if self.engine is None:
            return {}
        return held_counts(self.engine.status())


# What the adapter takes from an engine package: the reference engine's public surface, which a copy keeps.
SURFACE = ("set_point_hook", "Pending", "SamplingParams", "EngineError")


def _engine_package(engine_class: type) -> ModuleType:
    """The engine package whose public surface the engine uses: that of the nearest class in its MRO
    whose package exports `SURFACE`, so a user's subclass in a plain module (`myengine.py`) works."""
    for cls in engine_class.__mro__:
        for package in _packages_of(cls.__module__):
            if all(hasattr(package, name) for name in SURFACE):
                return package
    raise TargetError(f"{engine_class.__qualname__} is not in a package that exports {', '.join(SURFACE)} "
                      "(as mlx_invariants.engine does), nor is a base class; return an adapter from the factory "
                      "instead")


def _packages_of(module: str) -> list[ModuleType]:
    """`module` itself (a class defined in a package's `__init__`) and the package it belongs to."""
    names = [module, module.rsplit(".", 1)[0]] if "." in module else [module]
    found = []
    for name in names:
        try:
            found.append(importlib.import_module(name))  # already imported: the class came from it
        except ImportError:
            continue
    return found


def reference_engine(route: str, package: str = ENGINE_PACKAGE, **config: Any) -> Callable[[], ReferenceAdapter]:
    """An adapter factory for the `route` engine of `package` (a name in its `ENGINES` registry).

    The package is imported here, so a route it does not have fails before anything runs."""
    try:
        module = importlib.import_module(package)
    except ImportError as exc:
        raise TargetError(f"cannot import the engine package {package} ({exc})") from None
    routes = getattr(module, "ENGINES", {})
    if route not in routes:
        raise TargetError(f"{package} has no route {route!r}: use one of {', '.join(sorted(routes))}, "
                          "or MODULE:FACTORY (e.g. mypkg.fuzzing:make)")
    engine_class = routes[route]
    engine_config = module.EngineConfig(**{**FUZZ_CONFIG.get(route, {}), **config})
    wait_s = engine_config.max_wait_ms / 1000.0 if engine_config.admission == "wait" else 0.0

    def make_adapter() -> ReferenceAdapter:
        # Refusals in wait mode are timer-driven: allow the wait plus scheduling noise on a busy runner;
        # the bug this guards against waits for minutes.
        return ReferenceAdapter(lambda: engine_class(engine_config), name=f"{package}.{route}",
                                busy_bound_s=wait_s + 2.0)
    return make_adapter
