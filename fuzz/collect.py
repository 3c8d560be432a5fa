"""The harness's own garbage collections, told apart from the engine's.

The driver collects before it samples memory at rest and before it reads what a scenario left
unretrieved (`gc.collect()` on the loop thread). A generator that an engine left suspended in a
reference cycle is finalized there, on the harness's thread and at the harness's moment: which
thread runs its `finally` blocks then says nothing of the engine's threads (a vllm-mlx generator
collected by the rest sample read as "finalized on MainThread" in every run). The sentinel asks
`collecting()` and records such a finalization apart (`mlx-gc collected-suspended`), never as
`mlx-gc finalized-off-thread`.
"""

from __future__ import annotations

import gc
import threading

_here = threading.local()


def harness_collect() -> None:
    """`gc.collect()`, marked on this thread as the harness's while it runs."""
    _here.collecting = True
    try:
        gc.collect()
    finally:
        _here.collecting = False


def collecting() -> bool:
    """Whether this thread is inside `harness_collect()` now."""
    return getattr(_here, "collecting", False)
