"""The simple reference engine with a "fast path" that runs MLX on the event-loop thread for one-token
requests: an `mlx-off-owner` finding on the first scenario with such a request (the seed corpus's first
has one), in every process that fuzzes it. For the `--jobs` tests (`--engine tests.fuzz.fastpath_engine:make`)."""

from __future__ import annotations

import mlx.core as mx

from mlx_invariants.engine import EngineConfig, SimpleEngine


class FastPathEngine(SimpleEngine):
    async def submit(self, pending):
        if pending.params.max_tokens == 1:
            mx.eval(mx.array(list(pending.prompt)))
        return await super().submit(pending)


def make():
    return FastPathEngine(EngineConfig())
