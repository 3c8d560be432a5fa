"""The fuzz adapter for `toy_engine`, written from docs/fuzz-adapters.md ("Your engine") against the engine's
public API only: it marks the points a client sees (ADMITTED once the request is handed over, CHUNK_SENT
per streamed token), declares no MLX owner, and knows nothing of the engine's lock or worker."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Optional

from mlx_invariants.fuzz.adapters.base import Outcome, PointHook, prompt_text
from mlx_invariants.fuzz.scenario import RequestSpec
from mlx_invariants.fuzz.target import Target, TargetKind

from tests.fuzz.toy_engine import ToyEngine


class _ClientPoint:
    def __init__(self, name: str):
        self.name = name


class ToyHandle:
    def __init__(self, adapter: "ToyAdapter", spec: RequestSpec):
        self.adapter, self.spec = adapter, spec
        self._stream: Optional[AsyncIterator[int]] = None

    def __aiter__(self) -> AsyncIterator[int]:
        return self._tokens()

    async def _tokens(self) -> AsyncIterator[int]:
        self._stream = self.adapter.engine.stream(prompt_text(self.spec), self.spec.max_tokens)
        index = 0
        async for token in self._stream:
            self.adapter.reach("CHUNK_SENT", self.spec.rid, index=index)
            index += 1
            await asyncio.sleep(0)  # a fault delivered at this chunk lands here
            yield token

    async def wait_ended(self) -> None:
        await self.adapter.engine.generate(prompt_text(self.spec), self.spec.max_tokens)

    def outcome(self) -> Outcome:
        return Outcome("completed", reason="length")

    def abort(self) -> bool:
        return False  # the toy engine has no abort

    async def close(self) -> None:
        if self._stream is not None:
            await self._stream.aclose()


class ToyAdapter:
    owner = None           # the toy engine promises no owner thread
    busy_bound_s = 5.0     # it never refuses: requests wait for the lock

    def __init__(self, wait: str, prep_s: float = 0.0):
        self.name = f"toy-{wait}"
        self.engine = ToyEngine(wait, prep_s)
        self._hook: Optional[PointHook] = None

    def set_point_hook(self, hook: Optional[PointHook]) -> None:
        self._hook = hook

    def reach(self, point: str, rid: str, **info: Any) -> None:
        if self._hook is not None:
            self._hook(_ClientPoint(point), rid, info)

    async def start(self) -> None:
        await self.engine.start()

    async def submit(self, spec: RequestSpec) -> ToyHandle:
        handle = ToyHandle(self, spec)
        self.reach("ADMITTED", spec.rid)
        return handle

    async def shutdown(self) -> None:
        await self.engine.shutdown()

    def status(self) -> dict[str, int]:
        return {}


def make_plain() -> ToyAdapter:
    return ToyAdapter("plain")


def make_drain_once() -> ToyAdapter:
    return ToyAdapter("drain-once")


def make_drain() -> ToyAdapter:
    return ToyAdapter("drain")


def make_prepped_drain_once() -> ToyAdapter:
    """The drain-once engine, tokenizing on its worker for 20 ms before each non-streamed decode."""
    return ToyAdapter("drain-once", prep_s=0.02)


def make_prepped_drain() -> ToyAdapter:
    return ToyAdapter("drain", prep_s=0.02)


def target(factory: str, kinds: tuple[str, ...] = ("cancel", "disconnect")) -> Target:
    """The toy engine as a fuzz target: client-side points only, and the faults a client can deliver."""
    return Target(TargetKind.FACTORY, f"tests.fuzz.toy_adapter:{factory}", fault_kinds=kinds,
                  points=("ADMITTED", "CHUNK_SENT"))
