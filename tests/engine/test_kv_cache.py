"""The batched route's decode attention: no array mask when no row is padded, mlx-lm's mask otherwise.

An unpadded one-token step without a mask is what lets MLX's CUDA vector
attention kernel run (it takes no array mask); a padded row without its mask
would attend to zeros. Both are checked here on the CPU, where MLX computes
the same attention either way, so the outputs must also match the serialized
route token for token.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from mlx_invariants.engine import BatchedEngine, SimpleEngine

from .conftest import consume, request, run_engine

mx = pytest.importorskip("mlx.core")

from mlx_invariants.engine.kv_cache import HostPaddedBatchKVCache, HostPaddedKVCache  # noqa: E402


def primed(n: int) -> HostPaddedKVCache:
    cache = HostPaddedKVCache()
    cache.update_and_fetch(mx.ones((1, 2, n, 4)), mx.ones((1, 2, n, 4)))
    return cache


def assert_host_copy_matches(cache: HostPaddedBatchKVCache) -> None:
    assert cache.pads == cache.left_padding.tolist()


def test_unpadded_rows_decode_without_a_mask_padded_ones_with_mlx_lms():
    even = HostPaddedKVCache.merge([primed(5), primed(5)])
    assert isinstance(even, HostPaddedBatchKVCache)
    assert even.make_mask(1) is None
    uneven = HostPaddedKVCache.merge([primed(5), primed(3)])
    assert_host_copy_matches(uneven)
    mask = uneven.make_mask(1)  # over the five cached positions and the step's own token
    assert mask is not None and mask.tolist() == [[[[True] * 6]], [[[False, False] + [True] * 4]]]


def test_a_prompt_window_or_array_request_keeps_mlx_lms_mask():
    even = HostPaddedKVCache.merge([primed(5), primed(5)])
    assert even.make_mask(3) is not None
    assert even.make_mask(1, window_size=2) is not None
    assert even.make_mask(1, return_array=True) is not None


def test_the_host_copy_follows_merge_extend_and_filter():
    """Random batches as the generator builds them: the host copy always equals mlx-lm's array."""
    rng = random.Random(7)
    for _ in range(20):
        cache = HostPaddedKVCache.merge([primed(rng.randint(1, 9)) for _ in range(rng.randint(1, 4))])
        for _ in range(4):
            if rng.random() < 0.5:
                cache.extend(HostPaddedKVCache.merge([primed(rng.randint(1, 12)) for _ in range(rng.randint(1, 3))]))
            elif len(cache.pads) > 1:
                cache.filter(sorted(rng.sample(range(len(cache.pads)), rng.randint(1, len(cache.pads) - 1))))
            assert_host_copy_matches(cache)
            assert (cache.make_mask(1) is None) == (not any(cache.left_padding.tolist()))


def test_a_lone_survivor_is_unpadded_again():
    cache = HostPaddedKVCache.merge([primed(9), primed(4)])
    cache.filter([1])
    assert cache.pads == [0] and cache.make_mask(1) is None


def test_state_from_elsewhere_falls_back_to_the_mask():
    cache = HostPaddedKVCache.merge([primed(5), primed(5)])
    cache.state = cache.state
    assert cache.pads is None and cache.make_mask(1) is not None


@pytest.fixture
def masks(monkeypatch):
    """Every decode-step mask the batched route asks for: (query length, whether it got none)."""
    seen: list[tuple[int, bool]] = []
    original = HostPaddedBatchKVCache.make_mask

    def recording(self, N, return_array=False, **kwargs):
        mask = original(self, N, return_array=return_array, **kwargs)
        seen.append((N, mask is None))
        return mask

    monkeypatch.setattr(HostPaddedBatchKVCache, "make_mask", recording)
    return seen


def test_a_lone_request_decodes_on_the_unmasked_path(masks):
    async def body(engine):
        masks.clear()  # warmup decodes two padded probes together
        await consume(await engine.submit(request(engine, "alone", 12)))

    run_engine(BatchedEngine, body)
    assert masks and all(unmasked for n, unmasked in masks if n == 1)


def test_requests_of_different_lengths_decode_masked_and_match_the_serialized_route(masks):
    texts = ["hi", "hello world, a longer prompt than the others", "cancel the stream", "one two three four"]
    serial: dict[str, list[int]] = {}
    batched: dict[str, list[int]] = {}

    async def one_by_one(engine):
        for i, text in enumerate(texts):
            serial[text] = [t.token for t in await consume(await engine.submit(request(engine, f"s{i}", 24, text)))]

    async def together(engine):
        masks.clear()
        streams = [await engine.submit(request(engine, f"b{i}", 24, text)) for i, text in enumerate(texts)]
        for text, tokens in zip(texts, await asyncio.gather(*(consume(s) for s in streams))):
            batched[text] = [t.token for t in tokens]

    run_engine(SimpleEngine, one_by_one)
    run_engine(BatchedEngine, together)
    assert batched == serial
    assert any(not unmasked for n, unmasked in masks if n == 1), "padded rows decoded without their mask"
