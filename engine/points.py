"""Named fault points: facts the engine marks where they happen.

The points themselves are declared once, in the base layer (`mlx_invariants.points.Point`, re-exported
here and as `mlx_invariants.engine.Point`): each member says on which side it is marked, whether a hook
may raise there and whether it takes an index. This module is the engine's half: the hook.

`reach(point, rid, **info)` is a no-op unless a hook is installed (the fuzzer's
trace recorder and fault injector, through `mlx_invariants.engine.set_point_hook`).
A hook may block the calling thread (to let the loop deliver a fault) or raise (to
simulate an error inside an MLX call); the engine treats such an exception exactly
like one raised by MLX at that spot. A hook may raise only at the points whose
`may_raise` is set (WORKER_STARTED, PREFILL_DONE, BEFORE_DECODE), the points that
stand for MLX work; FINISHED marks that the work is over. Hooks called on the event
loop thread (`Side.LOOP`: ADMITTED, SLOT_ACQUIRED, CHUNK_SENT, SLOT_RELEASED) must
neither block nor raise: they record, or schedule work.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from mlx_invariants.points import Point, Side

__all__ = ["Hook", "Point", "Side", "reach", "set_hook"]

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
