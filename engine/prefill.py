"""A request's prompt run through its own KV cache and its first token sampled: owner thread only.

Why the batched route prefills here instead of leaving it to `BatchGenerator`:
mlx-lm 0.32 hands a newly inserted prompt its first token only from the third
`next()` (all but the last prompt token; the last token and the first sample;
the step that returns it), and each of those also decodes the running batch.
Prefilling here gives the first token before the next step; the primed cache is
then inserted with `caches=` (the path mlx-lm's own server takes for its prompt
cache), so the request decodes with the batch from the following step.

Why prompt lengths are rounded up on CUDA: MLX's CUDA backend builds kernels,
cuDNN attention graphs and GEMM plans for every new prefill shape, 40-70 ms each
on an H100, on the owner thread, stalling every running stream. A chunk padded
at its end to a power of two, then trimmed off the cache, reuses a handful of
shapes that warmup has already built. Causal attention keeps the padding out of
the real positions. Metal and the CPU build no per-shape kernels; there padding
would only add work, so they run exact lengths.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

PREFILL_STEP = 2048  # prompt tokens per forward pass, mlx-lm's default: bounds peak memory on long prompts
SMALLEST_BUCKET = 16


def bucket(n: int) -> int:
    """The padded length of an `n`-token chunk: the next power of two, at least SMALLEST_BUCKET."""
    return max(SMALLEST_BUCKET, 1 << (n - 1).bit_length())


def buckets() -> list[int]:
    """Every length `bucket` returns for a chunk of at most PREFILL_STEP tokens: what warmup runs."""
    return [b for b in (SMALLEST_BUCKET << k for k in range(PREFILL_STEP.bit_length())) if b <= PREFILL_STEP]


def pads_prefill() -> bool:
    """Whether this process's default device builds kernels per shape (MLX's CUDA backend)."""
    import mlx.core as mx

    return mx.default_device() == mx.gpu and mx.cuda.is_available()


@dataclass
class FirstToken:
    """What a prefill leaves: the cache holding the whole prompt, and the token sampled after it."""

    cache: list[Any]
    token: int
    logprobs: Any  # an mlx array over the vocabulary; never leaves the owner thread


def prefill(model: Any, prompt: Sequence[int], sampler: Callable[[Any], Any], stream: Any,
            pad: bool = False) -> FirstToken:
    """Forward `prompt` through a fresh cache on `stream` and sample one token with `sampler`.

    Two forward passes, as mlx-lm's own prefill does: the prompt but its last
    token (in chunks of PREFILL_STEP), then the last token, whose logits alone
    are computed. With `pad` (and a cache that can be trimmed), each chunk is
    padded to `bucket(n)` tokens and the padding trimmed off the cache after it.
    """
    import mlx.core as mx
    from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache

    with mx.stream(stream):
        cache = make_prompt_cache(model)
        pad = pad and can_trim_prompt_cache(cache)
        tokens = mx.array(list(prompt))[None]
        # All but the last token fill the cache only: their logits (prompt x vocabulary, 1.2 GB for
        # 2,000 tokens of a 150k vocabulary) are never evaluated, so never computed.
        while tokens.shape[1] > 1:
            n = min(PREFILL_STEP, tokens.shape[1] - 1)
            chunk = tokens[:, :n]
            if pad and bucket(n) > n:  # repeats of the chunk's last token: any id does, causality hides them
                chunk = mx.concatenate([chunk, mx.repeat(chunk[:, -1:], bucket(n) - n, axis=1)], axis=1)
            model(chunk, cache=cache)
            trim_prompt_cache(cache, chunk.shape[1] - n)
            mx.eval([c.state for c in cache])
            tokens = tokens[:, n:]
        logits = model(tokens, cache=cache)[:, -1, :]
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        token = sampler(logprobs)
        mx.eval(token, logprobs, [c.state for c in cache])
    return FirstToken(cache, int(token.item()), logprobs[0])
