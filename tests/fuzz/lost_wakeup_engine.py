"""The batched reference engine with an owner whose idle wait clears its wake-up event itself, in one of two
orders: `make_forgetful` clears it after deciding to sleep, so a request posted between that check and the
wait is forgotten and waits until some later post wakes the owner (a lost wake-up); `make_watchful` clears it
before the check, so such a post sets it again and the wait ends at once. Both mark `OWNER_IDLE` between the
check and the wait, as the reference owner does, which is where the fuzzer posts an arrival to catch it
(`--engine tests.fuzz.lost_wakeup_engine:make_forgetful`, tests/fuzz/test_owner_idle.py)."""

from __future__ import annotations

from mlx_invariants.engine import BatchedEngine, EngineConfig
from mlx_invariants.engine.batched import BatchOwner


class _SelfClearingOwner(BatchOwner):
    def _nothing_to_do(self) -> bool:
        if self._active or self._waiting:
            return False
        with self.lock:
            return not self._pending and not self._aborts


class ForgetfulOwner(_SelfClearingOwner):
    def _wait_if_idle(self) -> None:
        if self._nothing_to_do():
            self.going_idle()
            self._wake.clear()  # a post since the check set it: forgotten here
            self._wake.wait()
            self.beat()


class WatchfulOwner(_SelfClearingOwner):
    def _wait_if_idle(self) -> None:
        self._wake.clear()  # from here on every post sets it again, so the wait below cannot miss one
        if self._nothing_to_do():
            self.going_idle()
            self._wake.wait()
            self.beat()


class _OwnedBy(BatchedEngine):
    owner_class = BatchOwner

    def _make_owner(self, loop):
        return self.owner_class(self.name, self.config.model, loop, self._deliver, self.config.warmup,
                                max_batch=self.config.max_batch, pad_prefill=self.config.pad_prefill)


class ForgetfulEngine(_OwnedBy):
    owner_class = ForgetfulOwner


class WatchfulEngine(_OwnedBy):
    owner_class = WatchfulOwner


def make_forgetful():
    return ForgetfulEngine(EngineConfig())


def make_watchful():
    return WatchfulEngine(EngineConfig())
