"""Adapter for engines with the reference API: `submit(Pending) -> RequestStream`, `shutdown`, `status`.

Works on `engine.SimpleEngine`, `engine.BatchedEngine`, and on any copy of the
`engine` package under another import path (the planted-bug tests, `invariants
mutants`): the messages, errors and points modules are looked up next to the
engine class, so a copy is fuzzed through its own `points.set_hook`.
"""

from __future__ import annotations

import asyncio
import importlib
from typing import Any, Callable, Optional

from mlx_invariants.fuzz.adapters.base import Outcome, PointHook, Refused, prompt_text
from mlx_invariants.fuzz.scenario import RequestSpec


class StreamHandle:
    """One `RequestStream`, yielding token ids."""

    def __init__(self, stream: Any):
        self.stream = stream

    def __aiter__(self) -> "StreamHandle":
        return self

    async def __anext__(self) -> int:
        token = await self.stream.__anext__()
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
    """Builds a fresh engine with `factory()` inside `start()` (so its locks are built under the lock watch).

    One adapter serves scenario after scenario while the fuzzer reuses its engine; `status()` and
    `healthy` are what it checks between them.
    """

    def __init__(self, factory: Callable[[], Any], name: str = "", owner: Optional[str] = "mlx-owner*",
                 busy_bound_s: float = 1.0):
        self.factory = factory
        self.name = name or getattr(factory, "__name__", "engine")
        self.owner = owner
        self.busy_bound_s = busy_bound_s
        self.engine: Any = None
        self._hook: Optional[PointHook] = None
        self._points: Any = None
        self._shutdown: Optional[asyncio.Task] = None

    def set_point_hook(self, hook: Optional[PointHook]) -> None:
        self._hook = hook
        if self._points is not None:
            self._points.set_hook(hook)

    async def start(self) -> None:
        self.engine = self.factory()
        package = type(self.engine).__module__.rsplit(".", 1)[0]
        self._points = importlib.import_module(f"{package}.points")
        self._messages = importlib.import_module(f"{package}.messages")
        self._errors = importlib.import_module(f"{package}.errors")
        self._points.set_hook(self._hook)
        await self.engine.start()

    async def submit(self, spec: RequestSpec) -> StreamHandle:
        m = self._messages
        pending = m.Pending(spec.rid, self._prompt(spec), m.SamplingParams(max_tokens=spec.max_tokens))
        try:
            stream = await self.engine.submit(pending)
        except self._errors.EngineError as exc:
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
            if self._points is not None and self._shutdown.done():
                self._points.set_hook(None)

    @property
    def healthy(self) -> bool:
        """False once the engine stopped or its owner died: the next scenario gets a fresh engine."""
        return self.engine is not None and bool(getattr(self.engine, "healthy", True))

    def status(self) -> dict[str, int]:
        if self.engine is None:
            return {}
        status = self.engine.status()
        held = {key: status[key] for key in ("active", "queued") if isinstance(status.get(key), int)}
        if isinstance(status.get("requests"), dict):
            held["requests"] = len(status["requests"])  # requests the engine still tracks
        return held


def reference_engine(kind: str, package: str = "engine", **config: Any) -> Callable[[], ReferenceAdapter]:
    """An adapter factory for `package.SimpleEngine` ("simple") or `package.BatchedEngine` ("batched")."""
    defaults = {"simple": {"admission": "wait", "max_queue": 4}, "batched": {}}
    if kind not in defaults:
        raise ValueError(f"unknown reference engine {kind!r}; use simple or batched")
    settings = {**defaults[kind], **config}

    def make_engine() -> Any:
        module = importlib.import_module(package)
        engine_class = module.SimpleEngine if kind == "simple" else module.BatchedEngine
        return engine_class(module.EngineConfig(**settings))

    def make_adapter() -> ReferenceAdapter:
        wait_s = settings.get("max_wait_ms", 250) / 1000.0 if settings.get("admission") == "wait" else 0.0
        # Refusals in wait mode are timer-driven: allow the wait plus scheduling noise on a busy runner;
        # the bug this guards against waits for minutes.
        return ReferenceAdapter(make_engine, name=f"{package}.{kind}", busy_bound_s=wait_s + 2.0)
    make_adapter.engine_label = f"{package}.{kind}"  # type: ignore[attr-defined]
    return make_adapter
