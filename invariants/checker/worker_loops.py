"""The one fixpoint behind "a coroutine on a worker's own event loop", shared by the package
model (model/graph.py) and the per-file rules (private_loops.py), which name functions
differently (a module and name; a libcst node's id) but decide the same way.

A coroutine function a worker starts on its own thread (`@work(thread=True)`) runs on that
worker's loop, and so does one that only such coroutines call: the greatest set of coroutine
functions whose every caller is a worker's start or a member, reached from a start. A cycle of
members no start reaches is no worker's.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import TypeVar

F = TypeVar("F", bound=Hashable)


def on_worker_loops(callers: dict[F, list[F | None]], calls: Callable[[F], Iterable[F]]) -> set[F]:
    """`callers`: each coroutine function with its callers, None for a worker's start; `calls`: what
    a function calls. The coroutine functions that run only on a worker's own loop."""
    members = set(callers)
    changed = True
    while changed:  # the greatest set whose every caller is a worker's start or a member
        changed = False
        for function in list(members):
            if any(caller is not None and caller not in members for caller in callers[function]):
                members.discard(function)
                changed = True
    starts = [function for function in members if None in callers[function]]
    reached = set(starts)
    while starts:
        for callee in calls(starts.pop()):
            if callee in members and callee not in reached:
                reached.add(callee)
                starts.append(callee)
    return reached
