"""The simple reference engine with a "fast path" that runs MLX on the event-loop thread for one-token
requests: an `mlx-off-owner` finding on the first scenario with such a request (the seed corpus's first
has one), in every process that fuzzes it; `make_clean` beside it builds the engine without the fast path, and
`make_rare` one whose fast path takes only three-token requests, which no scenario of the seed corpus sends: generation has to
find that one (the shared-database test, tests/fuzz/test_database.py).
The `--jobs` tests fuzz it in place (`--engine tests.fuzz.fastpath_engine:make`); the replay, pytest-API and
workflow tests copy this file (`SOURCE`) into a scratch project as a user's own engine module."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx

from mlx_invariants.engine import EngineConfig, SimpleEngine


class FastPathEngine(SimpleEngine):
    fast = 1   # the budget of the requests that take the fast path

    async def submit(self, pending):
        if self._takes_fast_path(pending):
            mx.eval(mx.array(list(pending.prompt)))
        return await super().submit(pending)

    def _takes_fast_path(self, pending) -> bool:
        return pending.params.max_tokens == self.fast


class RarePathEngine(FastPathEngine):
    """Only while no other request holds the engine: its MLX on the loop is then always `mlx-off-owner` and never
    also `mlx-concurrent` (the owner busy beside it), so every replay of the failure shows the same oracle (a
    loaded box once replayed it without the overlap: Hypothesis called the failure flaky and saved nothing)."""

    fast = 3

    def _takes_fast_path(self, pending) -> bool:
        return super()._takes_fast_path(pending) and not self._admission.holders


def make():
    return FastPathEngine(EngineConfig())


def make_rare():
    return RarePathEngine(EngineConfig())


def make_clean():
    return SimpleEngine(EngineConfig())


SOURCE = Path(__file__).read_text()
