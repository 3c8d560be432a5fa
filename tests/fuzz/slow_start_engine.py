"""The simple reference engine with a slow or a hung first `start()`, as an in-process engine whose first
start imports and loads for a minute (vllm-mlx's took 45 to 80 s on a loaded 2-core box):
`--engine tests.fuzz.slow_start_engine:make` (its first start waits `START_S` first) or `:make_hung` (its
first start never returns). Correct once started: a slow start must not read as its baseline's
follow-up never ending, and a hung one is named as the start."""

from __future__ import annotations

import asyncio
from typing import Optional

from mlx_invariants.engine import EngineConfig, SimpleEngine

START_S = 6.0  # past the scenario backstop tests/fuzz/test_setup_errors.py gives it (5 s)


class SlowStartEngine(SimpleEngine):
    delay: Optional[float] = START_S  # None: the first start never returns
    started_once = False

    async def start(self) -> None:
        if not self.started_once:
            self.started_once = True
            if self.delay is None:
                await asyncio.Event().wait()  # set by nothing
            await asyncio.sleep(self.delay)
        await super().start()


def make() -> SlowStartEngine:
    return SlowStartEngine(EngineConfig())


def make_hung() -> SlowStartEngine:
    engine = SlowStartEngine(EngineConfig())
    engine.delay = None
    return engine
