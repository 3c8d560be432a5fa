"""The serialized route: the slot outlives its worker, busy is immediate, errors surface."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from mlx_invariants.engine import Busy, Failed, Finished, ShuttingDown, SimpleEngine, StartupError
from mlx_invariants.engine.points import Point

from ..conftest import WAIT_S
from .conftest import consume, request, run_engine, wait_until


def test_generates_and_reports_usage(points):
    async def body(engine):
        stream = await engine.submit(request(engine, "a", max_tokens=12))
        tokens = await consume(stream)
        assert len(tokens) == 12
        assert stream.result == Finished("a", "length", stream.prompt_tokens, 12)
        assert engine.status()["active"] == 0

    run_engine(SimpleEngine, body)


def test_busy_is_refused_at_once_with_machine_readable_code(points):
    async def body(engine):
        stream = await engine.submit(request(engine, "a", max_tokens=50))
        try:
            submitting = engine.submit(request(engine, "b"))
            try:
                # One step of the coroutine, no loop turn: "at once" means it never suspends to wait for the slot.
                with pytest.raises(Busy) as refused:
                    submitting.send(None)
            finally:
                submitting.close()
            assert refused.value.code == "text_generation_busy"
            assert refused.value.retry_after > 0
            assert engine.status()["rejected_busy"] == 1
            assert Point.ADMITTED not in points.order("b")
        finally:
            await stream.aclose()

    run_engine(SimpleEngine, body)


@pytest.mark.parametrize("cancels", [1, 2, 3])
def test_cancel_keeps_slot_until_worker_returns(points, cancels):
    """Cancelling the consumer (once, or again while it drains) must not free the slot early."""

    async def body(engine):
        hold = points.hold(Point.BEFORE_DECODE, "a", step=3)
        stream = await engine.submit(request(engine, "a", max_tokens=100))
        task = asyncio.create_task(consume(stream))
        assert await wait_until(hold.reached.is_set)
        for _ in range(cancels):
            task.cancel()
            assert await wait_until(lambda: engine.status()["requests"].get("a") == "draining")
            await asyncio.sleep(0)
        assert not task.done()
        assert engine.status()["active"] == 1
        with pytest.raises(Busy):
            await engine.submit(request(engine, "b"))
        assert Point.SLOT_RELEASED not in points.order("a")
        hold.release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        order = points.order("a")
        assert order.index(Point.FINISHED) < order.index(Point.SLOT_RELEASED)
        assert stream.result.reason == "abort"
        assert engine.status()["active"] == 0
        follow_up = await engine.submit(request(engine, "c", max_tokens=2))
        assert len(await consume(follow_up)) == 2

    run_engine(SimpleEngine, body)


def test_cancel_stops_decode_within_one_token(points):
    async def body(engine):
        hold = points.hold(Point.BEFORE_DECODE, "a", step=5)
        stream = await engine.submit(request(engine, "a", max_tokens=200))
        task = asyncio.create_task(consume(stream))
        assert await wait_until(hold.reached.is_set)
        task.cancel()
        assert await wait_until(lambda: engine.status()["requests"].get("a") == "draining")
        hold.release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert stream.result.reason == "abort"
        assert stream.result.completion_tokens <= 6

    run_engine(SimpleEngine, body)


def test_wait_mode_serializes_and_never_overlaps_workers(points):
    async def body(engine):
        first = await engine.submit(request(engine, "a", max_tokens=30))
        waiting = asyncio.create_task(engine.submit(request(engine, "b", max_tokens=30)))
        assert await wait_until(lambda: engine.status()["queued"] == 1)
        await consume(first)
        await consume(await waiting)
        order = [(p, r) for p, r, _, _ in points.events if p in (Point.WORKER_STARTED, Point.FINISHED)]
        assert order == [(Point.WORKER_STARTED, "a"), (Point.FINISHED, "a"),
                         (Point.WORKER_STARTED, "b"), (Point.FINISHED, "b")]

    run_engine(SimpleEngine, body, admission="wait", max_queue=1, max_wait_ms=30_000)


def test_wait_mode_is_bounded_in_depth_and_time(points):
    async def body(engine):
        first = await engine.submit(request(engine, "a", max_tokens=400))
        try:
            waiter = asyncio.create_task(engine.submit(request(engine, "b")))
            assert await wait_until(lambda: engine.status()["queued"] == 1)
            with pytest.raises(Busy):  # queue depth 1 is full
                await engine.submit(request(engine, "c"))
            # "a" holds the slot until the `finally` below: only the 50 ms bound can end b's wait. The
            # backstop is for an unbounded wait, which would otherwise hang the test.
            with pytest.raises(Busy) as refused:
                await asyncio.wait_for(waiter, WAIT_S)
            assert "no generation slot freed within 50 ms" in str(refused.value)
            assert engine.status()["active"] == 1, "b's wait ended because the slot was freed, not by its bound"
            assert refused.value.code == "text_generation_busy"
        finally:
            await first.aclose()

    run_engine(SimpleEngine, body, admission="wait", max_queue=1, max_wait_ms=50)


def test_worker_error_fails_the_request_and_engine_recovers(points):
    async def body(engine):
        points.fail(Point.BEFORE_DECODE, "a", step=2)
        stream = await engine.submit(request(engine, "a", max_tokens=10))
        await consume(stream)
        assert isinstance(stream.result, Failed)
        assert "injected failure" in stream.result.message
        fresh = await engine.submit(request(engine, "b", max_tokens=5))
        assert len(await consume(fresh)) == 5

    run_engine(SimpleEngine, body)


def test_worker_error_while_draining_after_cancel_is_logged(points, caplog):
    async def body(engine):
        hold = points.fail(Point.BEFORE_DECODE, "a", step=2, held=True)
        stream = await engine.submit(request(engine, "a", max_tokens=10))
        task = asyncio.create_task(consume(stream))
        assert await wait_until(hold.reached.is_set)
        task.cancel()
        assert await wait_until(lambda: engine.status()["requests"].get("a") == "draining")
        hold.release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert isinstance(stream.result, Failed)

    with caplog.at_level(logging.WARNING):
        run_engine(SimpleEngine, body)
    assert any("failed while being cancelled" in r.getMessage() for r in caplog.records)


def test_shutdown_mid_stream_ends_every_client(points):
    async def body(engine):
        hold = points.hold(Point.BEFORE_DECODE, "a", step=2)
        running = await engine.submit(request(engine, "a", max_tokens=500))
        reader = asyncio.create_task(consume(running))
        waiter = asyncio.create_task(engine.submit(request(engine, "b")))
        assert await wait_until(lambda: hold.reached.is_set() and engine.status()["queued"] == 1)
        shutdown = asyncio.create_task(engine.shutdown(grace_s=0.1))
        with pytest.raises(ShuttingDown):
            await waiter
        hold.release.set()
        await shutdown
        await reader
        assert running.result.reason == "abort"
        assert not engine.healthy
        with pytest.raises(ShuttingDown):
            await engine.submit(request(engine, "c"))

    run_engine(SimpleEngine, body, admission="wait", max_queue=1, max_wait_ms=30_000)


def test_startup_failure_is_reported_and_never_healthy(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')

    async def main():
        engine = SimpleEngine(__import__("mlx_invariants.engine", fromlist=["EngineConfig"]).EngineConfig(model=str(tmp_path)))
        with pytest.raises(StartupError):
            await engine.start()
        assert not engine.healthy
        await engine.shutdown(grace_s=0.1)

    asyncio.run(main())


def test_event_loop_stays_responsive_while_decoding(points):
    """Decode runs on the owner thread: with a decode step held mid-generation the loop still turns (a
    loop-side decode would block it until the hold's backstop), and no step runs on the loop's thread.
    How long the loop lags while decoding is a figure, not a test: benchmarks/bench_responsiveness.py."""

    async def body(engine):
        loop_thread = threading.current_thread().name
        hold = points.hold(Point.BEFORE_DECODE, "a", step=5)
        stream = await engine.submit(request(engine, "a", max_tokens=300))
        reader = asyncio.create_task(consume(stream))
        assert await wait_until(hold.reached.is_set)
        ticked = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(ticked.set_result, None)
        await ticked  # the loop ran a callback while the owner sits inside the generation
        assert not reader.done() and engine.status()["requests"].get("a") == "decoding"
        hold.release.set()
        assert len(await reader) == 300
        decoding = {thread for point, rid, _, thread in points.events if point is Point.BEFORE_DECODE and rid == "a"}
        assert decoding and loop_thread not in decoding, decoding

    run_engine(SimpleEngine, body)
