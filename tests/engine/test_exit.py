"""A process that ran engines exits with its own status, not a crash in MLX's per-thread teardown.

MLX keeps a compile cache, a random key and streams per thread; the cache's
entries and the key hold Python objects whose destructors take the GIL. Left
to the thread's own exit they crash the process: an owner thread's, destroyed
while the interpreter shuts down, abort it ("terminate called without an
active exception", 134); the main thread's, destroyed after it, segfault (139:
`pytest tests/engine` printed "131 passed" and exited so). The engine releases
each owner's state on the owner before it reports stopped, and the main
thread's at exit (engine/owner.py).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from mlx_invariants.engine import BatchedEngine, EngineConfig, SimpleEngine, StartupError
from mlx_invariants.engine import owner as owner_module

from ..conftest import wait_for
from .conftest import run_engine

# The order that crashed `pytest tests/engine`: MLX first imported on an owner thread (so MLX's
# own exit hook watches that thread's compile cache), compiled model code run on the main thread
# (test_prefill.py does), then an engine whose owner runs the same code last.
TWO_ENGINES = textwrap.dedent("""
    import asyncio, sys
    from mlx_invariants.engine import EngineConfig, SimpleEngine

    async def start_and_stop():
        engine = SimpleEngine(EngineConfig(model=sys.argv[1]))  # warmup runs the model on the owner
        await engine.start()
        await engine.shutdown(grace_s=1.0)

    asyncio.run(start_and_stop())
    import mlx.core as mx
    from mlx_lm.models.activations import swiglu  # the tiny llama's compiled MLP activation
    mx.eval(swiglu(mx.ones((1, 4)), mx.ones((1, 4))))
    asyncio.run(start_and_stop())
    print("exiting", flush=True)
""")


def test_a_process_that_started_and_stopped_two_engines_exits_0(tiny_model):
    done = subprocess.run([sys.executable, "-c", TWO_ENGINES, tiny_model], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}{done.stderr}"
    assert "exiting" in done.stdout


@pytest.fixture
def releases(monkeypatch) -> list[str]:
    """The threads that released their MLX state, each recorded a moment after its release, so a
    release made after `stopped` resolved is not yet recorded when `shutdown()` returns."""
    released: list[str] = []
    release = owner_module.release_mlx_thread_state

    def late_release() -> None:
        release()
        time.sleep(0.2)
        released.append(threading.current_thread().name)

    monkeypatch.setattr(owner_module, "release_mlx_thread_state", late_release)
    return released


@pytest.mark.parametrize("engine_cls", [SimpleEngine, BatchedEngine])
def test_the_owner_releases_its_mlx_state_before_shutdown_returns(engine_cls, releases):
    async def ready_only(engine):
        assert engine.healthy

    run_engine(engine_cls, ready_only)
    assert releases == [f"mlx-owner-{engine_cls.name}"]


def test_an_owner_that_never_got_ready_releases_its_mlx_state_too(tmp_path, releases):
    async def main():
        with pytest.raises(StartupError):
            await SimpleEngine(EngineConfig(model=str(tmp_path))).start()

    asyncio.run(main())
    assert wait_for(lambda: releases == ["mlx-owner-simple"]), releases
