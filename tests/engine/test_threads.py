"""Every MLX call of both routes happens on the engine's owner thread, under load, cancels and aborts."""

from __future__ import annotations

import asyncio
import threading

import pytest

from mlx_invariants.engine import BatchedEngine, SimpleEngine
from mlx_invariants.fuzz.oracles import mlx_never_concurrent, mlx_only_on_owner, no_stream_errors
from mlx_invariants.fuzz.sentinel import Sentinel

from ..conftest import WAIT_S
from .conftest import consume, request, run_engine


def test_cross_thread_stream_use_fails_on_this_platform():
    """The failure the owner thread prevents is real here: a generation-stream array evaluated elsewhere raises."""
    import mlx.core as mx
    from mlx_lm.generate import generation_stream

    made: list = []
    built, evaluated = threading.Event(), threading.Event()

    def build() -> None:
        with mx.stream(generation_stream):
            made.append(mx.ones((4,)) * 2)
        built.set()
        evaluated.wait(10)  # stay alive: a finished thread's id (and its streams) can be reused

    builder = threading.Thread(target=build)
    builder.start()
    assert built.wait(WAIT_S)
    errors: list[BaseException] = []

    def evaluate() -> None:
        try:
            mx.eval(made[0])
        except RuntimeError as exc:
            errors.append(exc)

    evaluator = threading.Thread(target=evaluate)
    evaluator.start()
    evaluator.join()
    evaluated.set()
    builder.join()
    assert errors and "There is no Stream(" in str(errors[0])


@pytest.mark.parametrize("engine_cls", [SimpleEngine, BatchedEngine])
def test_every_mlx_call_is_on_the_owner_thread(engine_cls):
    async def body(engine):
        first = await engine.submit(request(engine, "a", max_tokens=30))
        reader = asyncio.create_task(consume(first))
        if engine_cls is BatchedEngine:
            second = await engine.submit(request(engine, "b", max_tokens=30))
            third = await engine.submit(request(engine, "c", max_tokens=30))
            third.abort()
            await asyncio.gather(consume(second), consume(third))
        await reader
        cancelled = await engine.submit(request(engine, "d", max_tokens=300))
        task = asyncio.create_task(consume(cancelled))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with Sentinel(owner="mlx-owner*") as sentinel:
        run_engine(engine_cls, body)
    trace = sentinel.trace
    spans = trace.of("mlx")
    assert len(spans) > 30, "the sentinel saw too little MLX to judge"
    assert {span.thread_name for span in spans} == {f"mlx-owner-{engine_cls.name}"}
    assert len({span.thread for span in spans}) == 1
    assert not [*mlx_only_on_owner(trace), *mlx_never_concurrent(trace), *no_stream_errors(trace)]


def record_prefills(monkeypatch) -> list[int]:
    """The prompt length of every prefill the batched route makes from now on."""
    from mlx_invariants.engine import batched

    prefilled: list[int] = []
    prefill = batched.prefill

    def recording_prefill(model, prompt, *args, **kwargs):
        prefilled.append(len(prompt))
        return prefill(model, prompt, *args, **kwargs)
    monkeypatch.setattr(batched, "prefill", recording_prefill)
    return prefilled


def test_warmup_prefills_before_ready_so_no_request_pays_a_first_compile(monkeypatch):
    """A GPU compiles kernels on first use (9.5 s for the first prefill, 7.8 s for the first padded
    pair on MLX's CUDA backend): before ready, the batched warmup must prefill a multi-token prompt
    and decode two caches of different lengths together."""
    from mlx_lm.generate import BatchGenerator

    prefilled = record_prefills(monkeypatch)
    inserted: list[list[int]] = []   # cache lengths of each insert made before ready
    insert = BatchGenerator.insert

    def recording_insert(self, prompts, *args, all_tokens=None, **kwargs):
        inserted.append([len(t) for t in all_tokens or prompts])
        return insert(self, prompts, *args, all_tokens=all_tokens, **kwargs)
    monkeypatch.setattr(BatchGenerator, "insert", recording_insert)

    async def ready_only(engine):
        assert engine.healthy

    run_engine(BatchedEngine, ready_only)
    assert any(n >= 2 for n in prefilled), f"warmup never prefilled: {prefilled}"
    assert any(len(set(lengths)) >= 2 for lengths in inserted), f"warmup never decoded a padded batch: {inserted}"


def test_padded_warmup_prefills_every_bucket_before_ready(monkeypatch):
    """With padded prefill, a request's passes take the shapes `warmup_lengths()` runs
    (tests/engine/test_prefill.py); warmup must run them all before ready."""
    from mlx_invariants.engine import prefill as prefill_module

    monkeypatch.setattr(prefill_module, "PREFILL_STEP", 64)
    prefilled = record_prefills(monkeypatch)

    async def ready_only(engine):
        assert engine.healthy

    run_engine(BatchedEngine, ready_only, pad_prefill=True)
    assert set(prefill_module.warmup_lengths()) <= set(prefilled), f"warmup prefilled {sorted(prefilled)}"


@pytest.mark.parametrize("cls", [SimpleEngine, BatchedEngine])
def test_warmup_takes_the_sampled_paths_before_ready(cls, monkeypatch):
    """Top-p, a seeded draw and top log-probabilities compile kernels of their own on a GPU (a first request
    with them stalled a launched server past its 10 s stall bound): before ready, warmup samples through each
    and reads the log-probabilities as such a request does."""
    import sys

    from mlx_invariants.engine import sampling

    route = sys.modules[cls.__module__]
    made, read = [], []
    make, top = route.make_request_sampler, sampling.top_logprobs_of
    monkeypatch.setattr(route, "make_request_sampler", lambda params: made.append(params) or make(params))
    monkeypatch.setattr(sampling, "top_logprobs_of", lambda logprobs, k: read.append(k) or top(logprobs, k))

    async def ready_only(engine):
        assert engine.healthy

    run_engine(cls, ready_only)
    assert any(p.temperature > 0 and p.top_p < 1 and p.seed is None for p in made), made
    assert any(p.temperature > 0 and p.seed is not None for p in made), made
    assert read and all(k > 0 for k in read), read
