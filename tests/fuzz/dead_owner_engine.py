"""The simple reference engine with its owner-liveness watch planted out, for the "worker-dies" and
"worker-wedges" tests (`--engine tests.fuzz.dead_owner_engine:make_deaf`, `:make_stall_deaf`): as mlx-lm's server before its fix (mlx-lm #1505),
an exception that escapes the generation thread leaves the server up, healthy as long as it started,
and every request in flight or sent later waits forever for a thread that is gone.
"""

from __future__ import annotations

from mlx_invariants.engine import SimpleEngine
from mlx_invariants.fuzz.adapters.reference import ReferenceAdapter


class DeafEngine(SimpleEngine):
    """Never notices that its owner thread died: no request is ended, and new ones are still taken."""

    def _owner_ended(self, owner) -> None:
        pass

    @property
    def unavailable(self):
        return None

    @property
    def healthy(self) -> bool:
        owner = self._owner
        return owner is not None and owner.ready.done() and not self._shutting_down


def make_deaf() -> ReferenceAdapter:
    return ReferenceAdapter(DeafEngine, name="deaf-to-owner-death")


class StallDeafEngine(SimpleEngine):
    """Watches only whether its owner thread is alive, as most servers' health does: an owner wedged inside
    an MLX call is alive, so nothing is ended, new requests are taken and health stays 200 (mlx-lm #1834)."""

    def _watch_stall(self) -> None:
        pass


def make_stall_deaf() -> ReferenceAdapter:
    from mlx_invariants.engine import EngineConfig
    from mlx_invariants.fuzz.target import WEDGE_STALL_TIMEOUT_S

    return ReferenceAdapter(lambda: StallDeafEngine(EngineConfig(stall_timeout_s=WEDGE_STALL_TIMEOUT_S)),
                            name="deaf-to-a-wedged-owner")
