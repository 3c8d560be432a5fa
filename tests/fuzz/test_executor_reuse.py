"""A reused engine keeps the executor it started with, as a deployed engine keeps its default pool.

The fuzzer once installed a new executor for every scenario while it kept the engine, so an engine that
hands MLX to `asyncio.to_thread` met a brand-new thread in every scenario after the first, a condition
no deployment creates, and the MLX thread oracles then reported it.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Optional

import mlx.core as mx

from mlx_invariants.fuzz.adapters.base import Outcome
from mlx_invariants.fuzz.oracles import judge
from mlx_invariants.fuzz.scenario import RequestSpec, Scenario
from mlx_invariants.fuzz.sentinel import Sentinel
from mlx_invariants.fuzz.session import EngineSession

ONE = Scenario((RequestSpec("r0", 2, 2, True),), executor="owner")


def _step(token: int) -> int:
    return int(mx.sum(mx.arange(8) * token).item()) % 7


class _Handle:
    def __init__(self, adapter: "ToThreadAdapter", count: int):
        self.adapter, self.count = adapter, count

    def __aiter__(self) -> AsyncIterator[int]:
        return self._tokens()

    async def _tokens(self) -> AsyncIterator[int]:
        for i in range(self.count):
            async with self.adapter.lock:  # held until the worker returns: it is awaited, not left behind
                yield await asyncio.to_thread(_step, i)

    async def wait_ended(self) -> None:
        async for _ in self:
            pass

    def outcome(self) -> Outcome:
        return Outcome("completed", reason="length")

    def abort(self) -> bool:
        return False

    async def close(self) -> None:
        pass


class ToThreadAdapter:
    """MLX through `asyncio.to_thread` (the loop's default executor) under one lock."""

    name, owner, busy_bound_s = "to-thread", None, 5.0

    def __init__(self) -> None:
        self.lock: Optional[asyncio.Lock] = None

    def set_point_hook(self, hook: Any) -> None:
        pass

    async def start(self) -> None:
        self.lock = asyncio.Lock()

    async def submit(self, spec: RequestSpec) -> _Handle:
        return _Handle(self, spec.max_tokens)

    async def shutdown(self) -> None:
        pass

    def status(self) -> dict[str, int]:
        return {}


def test_a_kept_engine_meets_the_same_executor_thread_in_every_scenario():
    with Sentinel() as sentinel:
        session = EngineSession(ToThreadAdapter, sentinel)
        try:
            traces = [session.run(ONE) for _ in range(4)]
        finally:
            session.close()
    assert [t.meta["reused"] for t in traces] == [0, 1, 2, 3]
    threads = {span.thread for t in traces for span in t.of("mlx")}  # tokens: a new thread may reuse a name
    assert len(threads) == 1, threads
    assert all(judge(t) == [] for t in traces), [judge(t) for t in traces]
