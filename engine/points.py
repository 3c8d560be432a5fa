"""Named fault points: facts the engine marks where they happen.

`reach(point, rid, **info)` is a no-op unless a hook is installed (the fuzzer's
trace recorder and fault injector). A hook may block the calling thread (to let
the loop deliver a fault) or raise (to simulate an error inside an MLX call);
the engine treats such an exception exactly like one raised by MLX at that spot.
A hook may raise only at WORKER_STARTED, PREFILL_DONE and BEFORE_DECODE, the
points that stand for MLX work; FINISHED marks that the work is over.
Hooks called on the event loop thread (ADMITTED, SLOT_ACQUIRED, CHUNK_SENT,
SLOT_RELEASED) must neither block nor raise: they record, or schedule work.
"""

from __future__ import annotations

import enum
from typing import Any, Callable, Optional


class Point(enum.Enum):
    ADMITTED = "admitted"              # loop: admission said yes
    SLOT_ACQUIRED = "slot_acquired"    # loop: serialized slot held / batched: queued for the owner
    WORKER_STARTED = "worker_started"  # owner: the request's first MLX work begins
    PREFILL_DONE = "prefill_done"      # owner: prompt processed, first token sampled
    BEFORE_DECODE = "before_decode"    # owner: about to run decode step k, k tokens out (info: step=k; k >= 1)
    CHUNK_SENT = "chunk_sent"          # loop: chunk k handed to the consumer (info: index=k)
    FINISHED = "finished"              # owner: the request's last MLX work is over
    SLOT_RELEASED = "slot_released"    # loop: the serialized slot / batch seat is free again


Hook = Callable[[Point, str, dict[str, Any]], None]
_hook: Optional[Hook] = None


def set_hook(hook: Optional[Hook]) -> Optional[Hook]:
    """Install `hook` (or None to clear); returns the previous one so callers can restore it."""
    global _hook
    previous, _hook = _hook, hook
    return previous


def reach(point: Point, rid: str, **info: Any) -> None:
    hook = _hook
    if hook is not None:
        hook(point, rid, info)
