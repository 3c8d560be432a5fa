"""A request's prompt run through its own KV cache and its first token sampled: owner thread only.

Why the batched route prefills here instead of leaving it to `BatchGenerator`:
mlx-lm 0.32 hands a newly inserted prompt its first token only from the third
`next()` (all but the last prompt token; the last token and the first sample;
the step that returns it), and each of those also decodes the running batch.
Prefilling here gives the first token before the next step; the primed cache is
then inserted with `caches=` (the path mlx-lm's own server takes for its prompt
cache), so the request decodes with the batch from the following step.

Why prompt lengths are rounded up on CUDA: MLX's CUDA backend builds kernels,
cuDNN attention graphs and GEMM plans for every new prefill shape (a new prompt
length cost 92-103 ms against 14-16 ms for a seen one on an H100), on the owner
thread, stalling every running stream. A chunk padded
at its end to a power of two, then trimmed off the cache, reuses a handful of
shapes that warmup has already built. Causal attention keeps the padding out of
the real positions. Metal and the CPU build no per-shape kernels; there padding
would only add work, so they run exact lengths.

Why a short padded prompt takes one pass: on a GPU a short forward pass costs
its kernel launches, not its arithmetic, so the second pass (the last token
alone) is a third of a short prompt's prefill. Up to SINGLE_PASS_MAX tokens the
whole padded prompt goes through at once and the logits of its last real
position are kept; beyond, the logits of every position would cost real memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

PREFILL_STEP = 2048  # prompt tokens per forward pass, mlx-lm's default: bounds peak memory on long prompts
SMALLEST_BUCKET = 16
SINGLE_PASS_MAX = 256  # padded prompts up to this many tokens: one pass, logits of every position computed


def bucket(n: int) -> int:
    """The padded length of an `n`-token chunk: the next power of two, at least SMALLEST_BUCKET."""
    return max(SMALLEST_BUCKET, 1 << (n - 1).bit_length())


def buckets() -> list[int]:
    """Every length `bucket` returns for a chunk of at most PREFILL_STEP tokens."""
    return [b for b in (SMALLEST_BUCKET << k for k in range(PREFILL_STEP.bit_length())) if b <= PREFILL_STEP]


def warmup_lengths() -> list[int]:
    """Prompt lengths whose padded prefills run every shape a prompt of up to PREFILL_STEP + 1
    tokens can take from a fresh cache: each one-pass bucket, then each first-chunk bucket."""
    return ([b for b in buckets() if b <= SINGLE_PASS_MAX]
            + [b + 1 for b in buckets() if b >= SINGLE_PASS_MAX])


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
    are computed. With `pad` (and a cache that can be trimmed), each pass is
    padded to `bucket(n)` tokens and the padding trimmed off the cache after
    it, and a prompt that pads to at most SINGLE_PASS_MAX takes one pass.
    The cache tracks its rows' padding on the host once batched (`kv_cache`),
    so an unpadded decode step keeps attention on MLX's fused kernel.
    """
    import mlx.core as mx
    from mlx_lm.models.cache import can_trim_prompt_cache

    from mlx_invariants.engine.kv_cache import make_decode_cache

    with mx.stream(stream):
        cache = make_decode_cache(model)
        pad = pad and can_trim_prompt_cache(cache)
        tokens = mx.array(list(prompt))[None]
        if pad and bucket(tokens.shape[1]) <= SINGLE_PASS_MAX:
            logits = _forward(model, tokens, cache, pad)[:, tokens.shape[1] - 1, :]
        else:
            # All but the last token fill the cache only: their logits (prompt x vocabulary, 1.2 GB
            # for 2,000 tokens of a 150k vocabulary) are never evaluated, so never computed.
            while tokens.shape[1] > 1:
                n = min(PREFILL_STEP, tokens.shape[1] - 1)
                _forward(model, tokens[:, :n], cache, pad)
                mx.eval([c.state for c in cache])
                tokens = tokens[:, n:]
            logits = model(tokens, cache=cache)[:, -1, :]
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        token = sampler(logprobs)
        mx.eval(token, logprobs, [c.state for c in cache])
    return FirstToken(cache, int(token.item()), logprobs[0])


def _forward(model: Any, tokens: Any, cache: list[Any], pad: bool) -> Any:
    """`model(tokens)` into `cache`; with `pad`, at `bucket(n)` tokens, the padding trimmed off after."""
    import mlx.core as mx
    from mlx_lm.models.cache import trim_prompt_cache

    n = tokens.shape[1]
    if pad and bucket(n) > n:  # repeats of the last token: any id does, causality hides them
        tokens = mx.concatenate([tokens, mx.repeat(tokens[:, -1:], bucket(n) - n, axis=1)], axis=1)
    logits = model(tokens, cache=cache)
    trim_prompt_cache(cache, tokens.shape[1] - n)
    return logits
