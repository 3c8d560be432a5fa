"""The simple reference engine with planted findings that a fresh engine does not repeat, for the
confirmation tests (`make_*` are `--engine tests.fuzz.flaky_engine:make_*` factories).

- `make_leaky`: the first engine made in this process reports a held slot from its third scenario
  on; no other engine does (`slot-leaked` seen once, then in 0 of 3 re-runs on fresh engines).
- `make_busy`: the first engine refuses the follow-up request as busy from its third scenario on
  (`followup-differs`, whose cause is a busy refusal; fresh engines answer).
- `make_late`: every engine reports the last request's slot as held on the first status check after
  a scenario and released on the next: a release that lands within the grace, not a leak.
- `make_broken`: an engine that never starts (a setup error, not a finding).
Call `reset()` before each use: the engine count is per process.
"""

from __future__ import annotations

import itertools

from mlx_invariants.fuzz.adapters.reference import reference_engine
from mlx_invariants.fuzz.errors import Refused

_engines = itertools.count(1)


def reset() -> None:
    global _engines
    _engines = itertools.count(1)


def make_leaky():
    adapter = reference_engine("simple")()
    if next(_engines) == 1:
        status, checks = adapter.status, itertools.count(1)
        adapter.status = lambda: {**status(), "active": 1} if next(checks) >= 3 else status()
    return adapter


def make_busy():
    adapter = reference_engine("simple")()
    submit = adapter.submit
    first, followups = next(_engines) == 1, itertools.count(1)

    async def maybe_busy(spec):
        if first and spec.rid.startswith("followup") and next(followups) >= 3:
            raise Refused("busy", "all slots are taken")
        return await submit(spec)
    adapter.submit = maybe_busy
    return adapter


def make_late():
    adapter = reference_engine("simple")()
    submit, status = adapter.submit, adapter.status
    late = [False]

    async def submit_then_release_late(spec):
        late[0] = True
        return await submit(spec)

    def status_released_on_second_look():
        held = dict(status())
        if late[0]:
            late[0] = False
            held["active"] = held.get("active", 0) + 1
        return held
    adapter.submit, adapter.status = submit_then_release_late, status_released_on_second_look
    return adapter


def make_broken():
    """An engine that never starts: its model is missing."""
    adapter = reference_engine("simple")()

    async def start():
        raise FileNotFoundError("model weights not found at /nonexistent/model")
    adapter.start = start
    return adapter
