"""The simple reference engine with its owner-liveness watch planted out, for the "worker-dies" tests
(`--engine tests.fuzz.dead_owner_engine:make_deaf`): as mlx-lm's server before its fix (mlx-lm #1505),
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
