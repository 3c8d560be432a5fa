"""A module the sentinel tests import only after installing the sentinel."""

import mlx.core as mx


def work() -> float:
    return float(mx.sum(mx.ones(2)).item())
