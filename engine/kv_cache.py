"""KV caches for the batched route that know, on the host, whether any row is padded: owner thread only.

Why: mlx-lm's `BatchKVCache.make_mask` always returns an array mask, even for
one row with no padding, and MLX's CUDA vector attention kernel (one query
token) takes no array mask; so every batched decode step ran attention
unfused, a batch of one included (10.0 ms a step against the serialized
route's 5.2 ms on an H100). A one-token decode step over rows without left
padding needs no mask at all: the new token sees every cached position, which
is what the all-true mask said. These caches keep a host copy of each row's
left padding, updated from the host integers mlx-lm already computes it from
(no device sync), and return no mask for such a step; with any padding, or
any other query length, the mask is mlx-lm's own.

Rows get left padding when caches of different lengths merge (two requests
with different prompts); when the batch shrinks, mlx-lm shifts the smallest
padding away, so a lone survivor is unpadded again and takes the fused path.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from mlx_lm.models.cache import BatchKVCache, KVCache, make_prompt_cache


class HostPaddedBatchKVCache(BatchKVCache):
    """`BatchKVCache` plus `pads`, a host list equal to `left_padding`; None where it is not known."""

    def __init__(self, left_padding: list[int]):
        super().__init__(left_padding)
        self.pads: Optional[list[int]] = [int(p) for p in left_padding]
        self._right: Optional[list[int]] = None

    def make_mask(self, N: int, return_array: bool = False, **kwargs: Any) -> Any:
        if N == 1 and not return_array and kwargs.get("window_size") is None and self.pads is not None \
                and not any(self.pads):
            return None
        return super().make_mask(N, return_array=return_array, **kwargs)

    def prepare(self, *, left_padding: Any = None, lengths: Any = None, right_padding: Any = None) -> None:
        super().prepare(left_padding=left_padding, lengths=lengths, right_padding=right_padding)
        if left_padding is not None and self.pads is not None:
            self.pads = [p + int(q) for p, q in zip(self.pads, left_padding)]
        if right_padding is not None and max(right_padding) > 0:
            self._right = [int(q) for q in right_padding]

    def finalize(self) -> None:
        super().finalize()
        if self._right is not None and self.pads is not None:
            self.pads = [p + q for p, q in zip(self.pads, self._right)]
        self._right = None

    def filter(self, batch_indices: Sequence[int]) -> None:
        super().filter(batch_indices)
        if self.pads is not None:
            kept = [self.pads[int(i)] for i in batch_indices]
            least = min(kept, default=0)
            self.pads = [p - least for p in kept]

    def extend(self, other: Any) -> None:
        both_empty = self.keys is None and other.keys is None
        mine, theirs = self.pads, getattr(other, "pads", None)
        mine_idx, their_idx = self._idx, other._idx
        super().extend(other)
        if mine is None or theirs is None:
            self.pads = None
        elif both_empty:
            self.pads = mine + theirs
        else:  # each side right-justified to the longer one: its rows gain the difference as left padding
            top = max(mine_idx, their_idx)
            self.pads = [p + top - mine_idx for p in mine] + [p + top - their_idx for p in theirs]

    @property
    def state(self) -> Any:
        return super().state

    @state.setter
    def state(self, value: Any) -> None:  # arrays from elsewhere: the host copy is no longer known
        BatchKVCache.state.fset(self, value)
        self.pads = None


class HostPaddedKVCache(KVCache):
    """A plain `KVCache` whose batch merge is a `HostPaddedBatchKVCache`."""

    @classmethod
    def merge(cls, caches: list[Any]) -> Any:
        return HostPaddedBatchKVCache.merge(caches)


def make_decode_cache(model: Any) -> list[Any]:
    """mlx-lm's cache for `model`, each plain `KVCache` replaced by a `HostPaddedKVCache` (all empty)."""
    return [HostPaddedKVCache() if type(c) is KVCache else c for c in make_prompt_cache(model)]
