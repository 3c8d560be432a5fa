"""The simple reference engine whose first request first waits `COMPILE_S` on a busy thread that records
nothing, as MLX's CUDA backend compiles its kernels on first use (seconds each, more with other processes
compiling beside it): `--engine tests.fuzz.slow_first_engine:make`. Correct; its baseline must not read as
stalled."""

from __future__ import annotations

import asyncio
import time

from mlx_invariants.engine import EngineConfig, SimpleEngine

COMPILE_S = 6.5  # past the unpaced no-progress backstop (DriverSettings.stall_s, 5 s)


class SlowFirstEngine(SimpleEngine):
    compiled = False

    async def submit(self, pending):
        if not self.compiled:
            await asyncio.to_thread(time.sleep, COMPILE_S)
            self.compiled = True
        return await super().submit(pending)


def make():
    return SlowFirstEngine(EngineConfig())
