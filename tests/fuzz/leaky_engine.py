"""The simple reference engine with a per-request leak that its `status()` never shows, for the rest-state
oracles (`fuzz/rest.py`): `make_thread_leak` starts a watcher thread per request that lives until shutdown
(so nothing is left once the engine stopped, and the after-shutdown checks pass), `make_memory_leak` keeps
one MiB of MLX memory per request on its owner thread until shutdown, and `make_abort_leak` 96 KiB per
aborted request only (under one scenario's tolerance: a drift over scenarios). `make_clean` is the engine
without any of them. Run as `--engine tests.fuzz.leaky_engine:make_thread_leak`."""

from __future__ import annotations

import threading

from mlx_invariants.engine import EngineConfig, SimpleEngine
from mlx_invariants.engine.serial import SerialOwner

LEAK_FLOATS = 256 * 1024  # one MiB of float32 per request


class ThreadLeakEngine(SimpleEngine):
    """Each request gets a watcher thread that waits for the engine to stop, whether or not the request ended."""

    async def start(self) -> None:
        self._stopped = threading.Event()
        await super().start()

    async def submit(self, pending):
        stream = await super().submit(pending)
        threading.Thread(target=self._stopped.wait, name=f"watch-{pending.rid}", daemon=True).start()
        return stream

    async def shutdown(self, grace_s: float = 5.0) -> None:
        try:
            await super().shutdown(grace_s)
        finally:
            self._stopped.set()


class HoardingOwner(SerialOwner):
    """Keeps an evaluated array per request it ran, made and kept on this (the owner) thread."""

    hoard: list
    floats = LEAK_FLOATS
    aborted_only = False

    def _generate(self, job):
        import mlx.core as mx

        finished = super()._generate(job)
        if finished.reason == "abort" or not self.aborted_only:
            kept = mx.zeros((self.floats,))
            mx.eval(kept)
            self.hoard = [*getattr(self, "hoard", []), kept]
        return finished


class AbortHoardingOwner(HoardingOwner):
    floats = 24 * 1024  # 96 KiB: under one scenario's tolerance
    aborted_only = True

    def _finish(self) -> None:
        self.hoard = []
        super()._finish()


class MemoryLeakEngine(SimpleEngine):
    owner = HoardingOwner

    def _make_owner(self, loop):
        return self.owner(self.name, self.config.model, loop, self._deliver, self.config.warmup)


class AbortLeakEngine(MemoryLeakEngine):
    owner = AbortHoardingOwner


def make_thread_leak():
    return ThreadLeakEngine(EngineConfig())


def make_memory_leak():
    return MemoryLeakEngine(EngineConfig())


def make_abort_leak():
    return AbortLeakEngine(EngineConfig())


def make_clean():
    return SimpleEngine(EngineConfig())
