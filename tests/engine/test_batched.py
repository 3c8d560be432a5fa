"""The batched route: per-step admission, aborts applied on the owner thread, failing steps contained."""

from __future__ import annotations

import asyncio

import pytest

from mlx_invariants.engine import BatchedEngine, Busy, Failed, SimpleEngine, StartupError
from mlx_invariants.engine.points import Point

from ..conftest import WAIT_S
from .conftest import consume, request, run_engine, wait_until


async def occupy_owner(engine, points, step: int, max_tokens: int):
    """Stop the owner before a "busy" request's decode step `step`: what is posted meanwhile lands in one inbox."""
    hold = points.hold(Point.BEFORE_DECODE, "busy", step=step)
    reader = asyncio.create_task(consume(await engine.submit(request(engine, "busy", max_tokens=max_tokens))))
    assert await wait_until(hold.reached.is_set)
    return hold, reader


async def delivered_while_held(stream) -> list:
    """The tokens the loop delivers to `stream` while the owner is held: waits for the first one (an empty
    list after the backstop if none comes), since the owner posted it before reaching the hold."""
    early: list = []

    def arrived() -> bool:
        early.extend(stream.tokens_nowait())
        return bool(early)

    await wait_until(arrived)
    return early


def test_batched_output_matches_serialized_output():
    """Greedy decoding is deterministic: both routes must produce the same tokens for the same prompt."""
    outputs = {}

    for cls in (SimpleEngine, BatchedEngine):
        async def body(engine, cls=cls):
            outputs[cls.name] = [t.token for t in await consume(await engine.submit(request(engine, "a", 20)))]

        run_engine(cls, body)
    assert outputs["simple"] == outputs["batched"]
    assert len(outputs["simple"]) == 20


async def submitted(engine, pending) -> list:
    return await consume(await engine.submit(pending))


def test_a_seeded_request_samples_the_same_tokens_alone_beside_others_and_on_both_routes():
    """A seed is the request's own: sampled beside other sampling requests (its batch rows draw in turn) it
    returns what it returns alone, and both routes return the same."""
    seeded = {"temperature": 1.0, "top_p": 0.9, "seed": 7}
    outputs = {}

    for cls in (SimpleEngine, BatchedEngine):
        async def body(engine, cls=cls):
            alone = await consume(await engine.submit(request(engine, "a", 16, **seeded)))
            beside = (request(engine, "b", 16, **seeded),
                      request(engine, "c", 16, "other words", temperature=1.0, seed=99),
                      request(engine, "d", 16, "more words", temperature=0.8))
            together = await asyncio.gather(*(submitted(engine, p) for p in beside))
            outputs[cls.name] = [t.token for t in alone]
            assert [t.token for t in together[0]] == outputs[cls.name]

        run_engine(cls, body, admission="wait", max_queue=4, max_wait_ms=60_000)
    assert outputs["simple"] == outputs["batched"]
    assert len(outputs["simple"]) == 16


def test_concurrent_requests_all_complete_in_one_batch(points):
    async def body(engine):
        streams = [await engine.submit(request(engine, f"r{i}", 10 + i)) for i in range(6)]
        results = await asyncio.gather(*(consume(s) for s in streams))
        assert [len(r) for r in results] == [10 + i for i in range(6)]
        assert all(s.result.reason == "length" for s in streams)
        assert engine.status()["active"] == 0

    run_engine(BatchedEngine, body)


def test_late_arrival_gets_first_token_within_one_step(points):
    """Inserted between two steps and prefilled there: the running batch decodes at most once before
    the newcomer's first token (mlx-lm's own prefill would take three of its steps)."""

    async def body(engine):
        hold = points.hold(Point.BEFORE_DECODE, "long", step=10)
        long = await engine.submit(request(engine, "long", max_tokens=300))
        reader = asyncio.create_task(consume(long))
        assert await wait_until(hold.reached.is_set)
        short = await engine.submit(request(engine, "short", max_tokens=3))
        steps_before = points.count(Point.BEFORE_DECODE, "long")
        hold.release.set()
        await consume(short)
        prefill_at = next(i for i, (p, r, _, _) in enumerate(points.events)
                          if p is Point.PREFILL_DONE and r == "short")
        steps_waited = sum(1 for p, r, _, _ in points.events[:prefill_at]
                           if p is Point.BEFORE_DECODE and r == "long") - steps_before
        assert steps_waited <= 1, f"short request waited {steps_waited} decode steps"
        assert not long.ended
        long.abort()
        await reader

    run_engine(BatchedEngine, body)


def test_first_token_reaches_the_stream_before_the_next_step(points):
    """The prefill's token is handed to the loop before the owner decodes again, not one step later."""

    async def body(engine):
        hold = points.hold(Point.BEFORE_DECODE, "a", step=1)
        stream = await engine.submit(request(engine, "a", max_tokens=5))
        assert await wait_until(hold.reached.is_set)
        early = await delivered_while_held(stream)
        hold.release.set()
        rest = await consume(stream)
        assert len(early) == 1, "the first token waited for the next decode step"
        assert len(early) + len(rest) == 5

    run_engine(BatchedEngine, body)


def test_a_burst_hands_out_each_first_token_when_its_prefill_ends(points):
    """Requests started in one iteration: the first one's token does not wait for the others' prefills."""

    async def body(engine):
        busy_hold, reader = await occupy_owner(engine, points, step=1, max_tokens=4)
        hold = points.hold(Point.WORKER_STARTED, "b")
        a = await engine.submit(request(engine, "a", max_tokens=3))
        b = await engine.submit(request(engine, "b", max_tokens=3))
        busy_hold.release.set()  # the owner's next iteration takes a and b together
        assert await wait_until(hold.reached.is_set)
        early = await delivered_while_held(a)
        hold.release.set()
        assert len(early) == 1, "a's first token waited for b's prefill"
        assert len(early) + len(await consume(a)) == 3 and len(await consume(b)) == 3
        await reader

    run_engine(BatchedEngine, body)


def test_abort_before_insertion_is_not_lost(points):
    """An abort recorded while the owner is between taking the request and inserting it still wins."""

    async def body(engine):
        hold = points.hold(Point.WORKER_STARTED, "a")
        stream = await engine.submit(request(engine, "a", max_tokens=200))
        assert await wait_until(hold.reached.is_set)
        assert stream.abort()
        hold.release.set()
        await consume(stream)
        assert stream.result.reason == "abort"
        assert stream.result.completion_tokens <= 1
        assert engine.status()["active"] == 0

    run_engine(BatchedEngine, body)


def test_abort_posted_with_its_request_never_enters_the_batch(points):
    """Request and abort land in the inbox together (the owner is held elsewhere): one snapshot sees both."""

    async def body(engine):
        hold, reader = await occupy_owner(engine, points, step=2, max_tokens=40)
        stream = await engine.submit(request(engine, "a", max_tokens=200))
        assert stream.abort()
        hold.release.set()
        await consume(stream)
        await reader
        assert stream.result.reason == "abort"
        assert stream.result.completion_tokens == 0
        assert Point.WORKER_STARTED not in points.order("a"), "the aborted request was inserted anyway"
        assert engine.status()["active"] == 0

    run_engine(BatchedEngine, body)


@pytest.mark.parametrize("point,step", [(Point.PREFILL_DONE, None), (Point.BEFORE_DECODE, 5)])
def test_abort_during_prefill_or_decode_frees_the_seat(points, point, step):
    async def body(engine):
        hold = points.hold(point, "a", step=step)
        stream = await engine.submit(request(engine, "a", max_tokens=200))
        other = await engine.submit(request(engine, "b", max_tokens=8))
        reader = asyncio.create_task(consume(stream))
        assert await wait_until(hold.reached.is_set)
        reader.cancel()
        assert await wait_until(lambda: engine.status()["requests"].get("a") == "draining")
        assert Point.SLOT_RELEASED not in points.order("a")
        hold.release.set()
        with pytest.raises(asyncio.CancelledError):
            await reader
        assert stream.result.reason == "abort"
        assert len(await consume(other)) == 8
        order = points.order("a")
        assert order.index(Point.FINISHED) < order.index(Point.SLOT_RELEASED)
        assert engine.status()["active"] == 0

    run_engine(BatchedEngine, body)


def test_failing_step_fails_its_requests_and_engine_recovers(points):
    async def body(engine):
        # b is posted while a waits before its first step, so b is in the batch when a's third step fails
        # (posted right after a, a loaded box let a decode three steps alone first: "failing 1 request(s)").
        joined = points.hold(Point.BEFORE_DECODE, "a", step=1)
        points.fail(Point.BEFORE_DECODE, "a", step=3)
        first = await engine.submit(request(engine, "a", max_tokens=50))
        assert await wait_until(joined.reached.is_set)
        second = await engine.submit(request(engine, "b", max_tokens=50))
        joined.release.set()
        await asyncio.gather(consume(first), consume(second))
        assert isinstance(first.result, Failed) and isinstance(second.result, Failed)
        assert "injected failure" in first.result.message
        steps = points.count(Point.BEFORE_DECODE, "a")
        after = await engine.submit(request(engine, "c", max_tokens=6))
        assert len(await consume(after)) == 6
        assert points.count(Point.BEFORE_DECODE, "a") == steps, "failed request kept decoding"
        assert engine.healthy

    run_engine(BatchedEngine, body)


def test_failing_prefill_fails_only_its_request_and_is_logged(points, caplog):
    """A new request's prefill runs on its own cache: its failure leaves the running batch alone."""

    async def body(engine):
        points.fail(Point.PREFILL_DONE, "b")
        hold, reader = await occupy_owner(engine, points, step=2, max_tokens=12)
        failing = await engine.submit(request(engine, "b", max_tokens=8))
        hold.release.set()
        await consume(failing)
        assert isinstance(failing.result, Failed) and "prefill failed" in failing.result.message
        assert len(await reader) == 12, "the running request did not finish its tokens"
        assert engine.status()["active"] == 0

    run_engine(BatchedEngine, body)
    assert any("request b failed to start" in r.getMessage() for r in caplog.records), "the failure was not logged"


def test_capacity_beyond_batch_and_queue_is_refused(points):
    async def body(engine):
        streams = [await engine.submit(request(engine, f"r{i}", max_tokens=400)) for i in range(3)]
        try:
            with pytest.raises(Busy) as refused:
                await engine.submit(request(engine, "over"))
            assert refused.value.code == "engine_overloaded"
        finally:
            for s in streams:
                await s.aclose()
        assert engine.status()["active"] == 0

    run_engine(BatchedEngine, body, max_batch=2, max_batch_queue=1)


def test_shutdown_ends_every_open_stream(points):
    async def body(engine):
        streams = [await engine.submit(request(engine, f"r{i}", max_tokens=1000)) for i in range(3)]
        readers = [asyncio.create_task(consume(s)) for s in streams]
        assert await wait_until(lambda: all(points.count(Point.PREFILL_DONE, s.rid) for s in streams))
        await engine.shutdown(grace_s=0.05)
        await asyncio.gather(*readers)
        assert [s.result.reason for s in streams] == ["abort"] * 3
        assert not engine.healthy

    run_engine(BatchedEngine, body)


def test_shutdown_with_its_owner_stuck_in_a_call_ends_every_stream_and_frees_every_seat(points):
    """A seat is kept until the owner lets go of its row, even when the stall watch ended the stream: but an
    owner stuck for good never will, so a shutdown that gave up waiting for it lets every seat go."""
    async def body(engine):
        stuck = points.hold(Point.BEFORE_DECODE, "r0", step=2)
        streams = [await engine.submit(request(engine, f"r{i}", max_tokens=1000)) for i in range(2)]
        readers = [asyncio.create_task(consume(s)) for s in streams]
        assert await asyncio.to_thread(stuck.reached.wait, WAIT_S)
        try:
            await engine.shutdown(grace_s=0.05)  # the owner never stops: the shutdown gives up on it
            await asyncio.wait_for(asyncio.gather(*readers), WAIT_S)  # each reader's close returned: seats free
            assert all(s.ended for s in streams) and engine.status()["active"] == 0, engine.status()
        finally:
            stuck.release.set()

    run_engine(BatchedEngine, body)


def test_batched_startup_failure_is_reported(tmp_path):
    async def main():
        engine = BatchedEngine(__import__("mlx_invariants.engine", fromlist=["EngineConfig"]).EngineConfig(model=str(tmp_path)))
        with pytest.raises(StartupError):
            await engine.start()
        assert not engine.healthy

    asyncio.run(main())


def test_padded_prefill_decodes_what_the_serialized_route_decodes(monkeypatch):
    """The batched route with padded prefill (on by default on CUDA) must not change a token: prompts
    of one chunk and of several (PREFILL_STEP 64 here), decoding together, against the serialized route."""
    from mlx_invariants.engine import prefill as prefill_module

    monkeypatch.setattr(prefill_module, "PREFILL_STEP", 64)
    texts = ["hi", "hello world " * 5, "the quick brown fox " * 20]
    outputs: dict[str, list[list[int]]] = {}

    async def one(engine, rid, text):
        return [t.token for t in await consume(await engine.submit(request(engine, rid, 12, text)))]

    async def serial(engine):
        outputs["simple"] = [await one(engine, str(i), text) for i, text in enumerate(texts)]

    async def batched(engine):
        outputs["batched"] = list(await asyncio.gather(*(one(engine, str(i), t) for i, t in enumerate(texts))))

    run_engine(SimpleEngine, serial)
    run_engine(BatchedEngine, batched, pad_prefill=True)
    assert outputs["batched"] == outputs["simple"]
    assert all(len(tokens) == 12 for tokens in outputs["simple"]), "a prompt ended early: pick longer-lived texts"
