"""Padded prefill (engine/prefill.py): the same cache and first token as an exact one, on shapes warmup knows."""

from __future__ import annotations

import pytest

from engine import prefill as prefill_module
from engine.prefill import bucket, buckets, prefill

LENGTHS = (1, 2, 3, 17, 40, 64, 65, 100, 150)  # with PREFILL_STEP 64: one chunk, a full chunk, several chunks


@pytest.fixture
def model_and_stream():
    import mlx.core as mx
    from mlx_lm import load

    from engine.model import tiny_model_path

    model, _ = load(str(tiny_model_path("tiny")))
    return model, mx.new_stream(mx.default_device())


def test_every_chunk_length_pads_to_a_bucket_warmup_runs(monkeypatch):
    monkeypatch.setattr(prefill_module, "PREFILL_STEP", 64)
    assert buckets() == [16, 32, 64]
    assert {bucket(n) for n in range(1, 65)} == set(buckets())


@pytest.mark.parametrize("n", LENGTHS)
def test_padded_prefill_leaves_what_an_exact_one_leaves(monkeypatch, model_and_stream, n):
    """Padding at the end of a chunk, trimmed after it, must not reach the real positions: the
    first token, its logprobs and every cached key and value match the exact prefill's."""
    import mlx.core as mx
    from mlx_lm.sample_utils import make_sampler

    monkeypatch.setattr(prefill_module, "PREFILL_STEP", 64)
    model, stream = model_and_stream
    prompt = [5 + (k * 7) % 400 for k in range(n)]
    exact = prefill(model, prompt, make_sampler(temp=0.0), stream)
    padded = prefill(model, prompt, make_sampler(temp=0.0), stream, pad=True)
    assert padded.token == exact.token
    assert mx.allclose(padded.logprobs, exact.logprobs, atol=1e-5).item()
    for a, b in zip(exact.cache, padded.cache):
        assert b.offset == a.offset == n
        assert mx.allclose(a.keys[..., :n, :], b.keys[..., :n, :], atol=1e-5).item()
        assert mx.allclose(a.values[..., :n, :], b.values[..., :n, :], atol=1e-5).item()
