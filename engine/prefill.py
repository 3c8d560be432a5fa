"""A request's prompt run through its own KV cache and its first token sampled: owner thread only.

Why the batched route prefills here instead of leaving it to `BatchGenerator`:
mlx-lm 0.32 hands a newly inserted prompt its first token only from the third
`next()` (all but the last prompt token; the last token and the first sample;
the step that returns it), and each of those also decodes the running batch.
Prefilling here gives the first token before the next step; the primed cache is
then inserted with `caches=` (the path mlx-lm's own server takes for its prompt
cache), so the request decodes with the batch from the following step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

PREFILL_STEP = 2048  # prompt tokens per forward pass, mlx-lm's default: bounds peak memory on long prompts


@dataclass
class FirstToken:
    """What a prefill leaves: the cache holding the whole prompt, and the token sampled after it."""

    cache: list[Any]
    token: int
    logprobs: Any  # an mlx array over the vocabulary; never leaves the owner thread


def prefill(model: Any, prompt: Sequence[int], sampler: Callable[[Any], Any], stream: Any) -> FirstToken:
    """Forward `prompt` through a fresh cache on `stream` and sample one token with `sampler`.

    Two forward passes, as mlx-lm's own prefill does: the prompt but its last
    token (in chunks of PREFILL_STEP), then the last token, whose logits alone
    are computed.
    """
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    with mx.stream(stream):
        cache = make_prompt_cache(model)
        tokens = mx.array(list(prompt))[None]
        # All but the last token fill the cache only: their logits (prompt x vocabulary, 1.2 GB for
        # 2,000 tokens of a 150k vocabulary) are never evaluated, so never computed.
        while tokens.shape[1] > 1:
            n = min(PREFILL_STEP, tokens.shape[1] - 1)
            model(tokens[:, :n], cache=cache)
            mx.eval([c.state for c in cache])
            tokens = tokens[:, n:]
        logits = model(tokens, cache=cache)[:, -1, :]
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        token = sampler(logprobs)
        mx.eval(token, logprobs, [c.state for c in cache])
    return FirstToken(cache, int(token.item()), logprobs[0])
