"""MLX work that holds still where a test wants it: extra sentinel targets for the sentinel tests."""

from __future__ import annotations

import threading

import mlx.core as mx


def hold(entered: threading.Event, release: threading.Event) -> None:
    """Enter MLX, say so, and stay inside until released."""
    mx.eval(mx.arange(4) * 2)
    entered.set()
    release.wait(timeout=10)


def nested() -> int:
    """One entry that makes further MLX calls on the same thread."""
    mx.eval(mx.ones(3))
    return int(mx.sum(mx.ones(3)).item())


def steps(count: int):
    """A generator doing MLX work between yields, like mlx-lm's generate_step."""
    for i in range(count):
        mx.eval(mx.full((2,), i))
        yield i


def generate_step(count: int) -> list[int]:
    """A stand-in for mlx-lm's decode loop: its sentinel span is named like one (`mlx_work.generate_step`)."""
    return [int(mx.sum(mx.full((4,), i)).item()) for i in range(count)]
