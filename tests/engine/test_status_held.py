"""`status()["held"]` counts every resource an engine holds for a request, down to generator rows, jobs,
streams and inbox entries: each shows while a request is in flight and is zero once it has ended, and
the fuzzer's `nothing_leaked` oracle sees every one of them through the reference adapter."""

from __future__ import annotations

import asyncio

import pytest

from mlx_invariants.engine import BatchedEngine, SimpleEngine
from mlx_invariants.engine.points import Point
from mlx_invariants.fuzz.adapters.reference import ReferenceAdapter
from mlx_invariants.fuzz.oracles import nothing_leaked
from mlx_invariants.fuzz.trace import Trace

from .conftest import consume, request, run_engine, wait_until

IN_FLIGHT = {SimpleEngine: {"streams": 1, "jobs": 1, "inbox": 0},
             BatchedEngine: {"streams": 1, "rows": 1, "generator": 1, "running": 1, "waiting": 0, "inbox": 0,
                             "aborts": 0}}


@pytest.mark.parametrize("engine_cls", [SimpleEngine, BatchedEngine], ids=lambda c: c.name)
def test_every_held_resource_shows_in_flight_and_is_zero_after(engine_cls, points):
    async def body(engine):
        hold = points.hold(Point.BEFORE_DECODE, "a", step=2)
        reader = asyncio.create_task(consume(await engine.submit(request(engine, "a", max_tokens=6))))
        assert await wait_until(hold.reached.is_set)
        assert engine.status()["held"] == IN_FLIGHT[engine_cls]
        hold.release.set()
        await reader
        assert await wait_until(lambda: not any(engine.status()["held"].values())), engine.status()["held"]

    run_engine(engine_cls, body)


def test_an_aborted_request_leaves_no_row_in_the_generator(points):
    """The generator's own count, not the owner's books: an abort that drops the request from the books but
    not from the `BatchGenerator` leaves its row (and KV cache) there, counted as `generator`."""
    async def body(engine):
        hold = points.hold(Point.BEFORE_DECODE, "a", step=2)
        stream = await engine.submit(request(engine, "a", max_tokens=40))
        reader = asyncio.create_task(consume(stream))
        assert await wait_until(hold.reached.is_set)
        assert stream.abort()
        hold.release.set()
        await reader
        assert stream.result.reason == "abort"
        assert await wait_until(lambda: not any(engine.status()["held"].values())), engine.status()["held"]

    run_engine(BatchedEngine, body)


class _Leaky:
    """An engine whose status says a generator row is still held after every request ended."""

    def status(self) -> dict:
        return {"active": 0, "queued": 0, "requests": {}, "held": {"streams": 0, "rows": 1}}


def test_a_held_row_at_quiescence_is_a_leak_the_fuzzer_reports():
    adapter = ReferenceAdapter(_Leaky)
    adapter.engine = _Leaky()
    status = adapter.status()
    assert status == {"active": 0, "queued": 0, "requests": 0, "streams": 0, "rows": 1}
    trace = Trace()
    trace.record("check", "status", info=status)
    assert [v.kind for v in nothing_leaked(trace)] == ["slot-leaked"]
