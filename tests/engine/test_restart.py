"""An engine starts again after its shutdown returned (a server restarts its engine on a config reload),
and then serves as a fresh one does; a start while it runs is refused."""

from __future__ import annotations

import asyncio

import pytest

from mlx_invariants.engine import BatchedEngine, EngineConfig, SimpleEngine, StartupError

from tests.engine.conftest import consume, request


@pytest.mark.parametrize("engine_cls", [SimpleEngine, BatchedEngine])
def test_an_engine_serves_again_after_shutdown_and_start(engine_cls):
    async def main() -> None:
        engine = engine_cls(EngineConfig(admission="wait"))
        await engine.start()
        try:
            first = [t.token for t in await consume(await engine.submit(request(engine, "a", max_tokens=5)))]
            with pytest.raises(StartupError, match="running"):
                await engine.start()
            await engine.shutdown(grace_s=1.0)
            assert not engine.healthy
            await engine.start()
            assert engine.healthy
            again = [t.token for t in await consume(await engine.submit(request(engine, "b", max_tokens=5)))]
            assert again == first
            status = engine.status()
            assert status["active"] == status["queued"] == 0 and not any(status["held"].values()), status
        finally:
            await engine.shutdown(grace_s=1.0)

    asyncio.run(main())
