"""Padded prefill (engine/prefill.py): the same cache and first token as an exact one, on shapes warmup knows."""

from __future__ import annotations

import pytest

from mlx_invariants.engine import prefill as prefill_module
from mlx_invariants.engine.prefill import prefill, warmup_lengths

# With PREFILL_STEP 64 and SINGLE_PASS_MAX 32: one padded pass up to 32 tokens, then one chunk, then several.
LENGTHS = (1, 2, 3, 17, 31, 32, 33, 40, 64, 65, 66, 100, 150)


@pytest.fixture
def small_steps(monkeypatch):
    monkeypatch.setattr(prefill_module, "PREFILL_STEP", 64)
    monkeypatch.setattr(prefill_module, "SINGLE_PASS_MAX", 32)


@pytest.fixture
def model_and_stream():
    import mlx.core as mx
    from mlx_lm import load

    from mlx_invariants.engine.model import tiny_model_path

    model, _ = load(str(tiny_model_path("tiny")))
    return model, mx.new_stream(mx.default_device())


class RecordingModel:
    """The real model, recording (tokens in, cache offset before, last pass of its prefill) per call."""

    def __init__(self, model):
        self.model = model
        self.calls: list[tuple[int, int]] = []

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, tokens, cache):
        self.calls.append((tokens.shape[1], cache[0].offset))
        return self.model(tokens, cache=cache)

    def shapes(self, prompt_length, run) -> set[tuple[int, int, bool]]:
        """The multi-token passes one prefill of `prompt_length` tokens makes (one-token passes run
        the same kernels at every cache length, as decode does)."""
        self.calls = []
        run(prompt_length)
        return {(n, offset, i == len(self.calls) - 1) for i, (n, offset) in enumerate(self.calls) if n > 1}


def test_warmup_runs_every_shape_a_padded_prompt_takes(small_steps, model_and_stream):
    """Any prompt of up to PREFILL_STEP + 1 tokens must find each of its passes already run by
    warmup, or it pays the GPU's build of that shape mid-stream."""
    from mlx_lm.sample_utils import make_sampler

    model, stream = model_and_stream
    recording = RecordingModel(model)

    def run(n):
        prefill(recording, [5 + k % 400 for k in range(n)], make_sampler(temp=0.0), stream, pad=True)

    warmed = set().union(*(recording.shapes(n, run) for n in warmup_lengths()))
    for n in range(1, prefill_module.PREFILL_STEP + 2):
        assert recording.shapes(n, run) <= warmed, f"a {n}-token prompt runs a shape warmup never ran"


@pytest.mark.parametrize("n", LENGTHS)
def test_padded_prefill_leaves_what_an_exact_one_leaves(small_steps, model_and_stream, n):
    """Padding at the end of a pass, trimmed after it, must not reach the real positions: the
    first token, its logprobs and every cached key and value match the exact prefill's."""
    import mlx.core as mx
    from mlx_lm.sample_utils import make_sampler

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
