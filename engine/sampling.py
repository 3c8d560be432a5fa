"""Per-request sampling, stop strings and logprobs; called on the owner thread only."""

from __future__ import annotations

from typing import Any, Callable

from mlx_invariants.engine.messages import SamplingParams


def make_request_sampler(params: SamplingParams) -> Callable[[Any], Any]:
    """mlx-lm's sampler for these params; seeds MLX's RNG when a seed is given (owner thread only)."""
    import mlx.core as mx
    from mlx_lm.sample_utils import make_sampler

    if params.seed is not None:
        mx.random.seed(params.seed)
    return make_sampler(temp=params.temperature, top_p=params.top_p)


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
