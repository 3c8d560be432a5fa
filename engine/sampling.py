"""Per-request sampling, stop strings and logprobs; called on the owner thread only."""

from __future__ import annotations

from typing import Any, Callable

from mlx_invariants.engine.messages import SamplingParams


def make_request_sampler(params: SamplingParams) -> Callable[[Any], Any]:
    """mlx-lm's sampler for these params, or, with a seed, one drawing from the request's own key (owner
    thread only)."""
    from mlx_lm.sample_utils import make_sampler

    if params.seed is None or params.temperature == 0:
        return make_sampler(temp=params.temperature, top_p=params.top_p)
    return SeededSampler(params.seed, params.temperature, params.top_p)


class SeededSampler:
    """Samples as mlx-lm's sampler does (top-p, then a categorical draw at the temperature), from a key of
    its own split once a token, so a seeded request's tokens depend on its seed and its prompt alone.

    Seeding MLX's global RNG instead breaks that promise on the batched route: every row of a step draws
    from the one global state in turn, so a seeded request beside others got other tokens than alone (6 of
    6 runs on the embedded model, against 0 of 6 on the serialized route, which runs one at a time).
    """

    def __init__(self, seed: int, temperature: float, top_p: float):
        import mlx.core as mx

        self._key = mx.random.key(seed)
        self._scale = 1.0 / temperature
        self._top_p = top_p

    def __call__(self, logprobs: Any) -> Any:
        import mlx.core as mx
        from mlx_lm.sample_utils import apply_top_p

        if 0 < self._top_p < 1.0:
            logprobs = apply_top_p(logprobs, self._top_p)
        self._key, key = mx.random.split(self._key)
        return mx.random.categorical(logprobs * self._scale, key=key)


# The sampling paths a warmup takes, besides greedy: each compiles its own kernels on first use (top-p's sort
# and cumulative sum, a keyed categorical draw, the top-k of the log-probabilities), which on MLX's CUDA backend
# cost seconds; a first request that paid them stalled a launched server past a 10 s stall bound (GPU run 7).
WARMUP_SAMPLED = (SamplingParams(max_tokens=2, temperature=0.7, top_p=0.9),
                  SamplingParams(max_tokens=2, temperature=0.7, top_p=0.9, seed=0))


def read_logprobs(logprobs: Any, token: int) -> None:
    """Read a step's log-probabilities as a request that asks for them does (the sampled token's, the top two),
    for a warmup: the top-k compiles kernels of its own."""
    logprob_of(logprobs, token)
    top_logprobs_of(logprobs, 2)


def logprob_of(logprobs: Any, token: int) -> float:
    """The sampled token's log-probability as a plain float, so no array crosses to the loop."""
    return float(logprobs[token].item())


def top_logprobs_of(logprobs: Any, k: int) -> tuple[tuple[int, float], ...]:
    """The `k` most likely tokens and their log-probabilities, most likely first, as plain values."""
    import mlx.core as mx

    if k <= 0:
        return ()
    k = min(k, logprobs.shape[-1])
    ids = mx.argpartition(-logprobs, kth=k - 1)[:k]
    pairs = zip(ids.tolist(), logprobs[ids].tolist())
    return tuple(sorted(pairs, key=lambda pair: -pair[1]))


class StopMatcher:
    """Finds the first client stop string in the generated text, across token boundaries.

    `feed` returns the part of the new segment to emit (nothing from the stop
    string on) and whether generation must stop. Text emitted by earlier
    segments may end with a prefix of a stop string that later fails to match.
    """

    def __init__(self, stops: tuple[str, ...]):
        self._stops = tuple(s for s in stops if s)
        self._longest = max((len(s) for s in self._stops), default=0)
        self._text = ""

    def feed(self, segment: str) -> tuple[str, bool]:
        if not self._stops:
            return segment, False
        start = len(self._text)
        self._text += segment
        search_from = max(0, start - self._longest + 1)
        hits = [i for i in (self._text.find(s, search_from) for s in self._stops) if i >= 0]
        if not hits:
            return segment, False
        cut = min(hits)
        return self._text[start:cut] if cut > start else "", True
