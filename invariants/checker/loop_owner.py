"""An engine loop that made the event loop's thread its MLX owner, and what a handed-over callable runs.

MLX's streams belong to the thread that makes them, and a server picks one thread to own its
model, caches and generation streams. Most pick a worker; some pick the loop: an `async def`
that binds the generation streams on its own thread (`mx.new_stream`, `mx.set_default_stream`,
or a helper named like stream-binders, called in it or in the sync defs it calls inline) and
steps in a `while` loop there, for the server's life. Where no code of the file hands MLX to any
thread, the loop's thread is the one MLX owner the server has: that def's MLX is the owner's, and
handing it
to another thread would move it off the streams and arrays it belongs to (issue 23:
vllm-mlx's MLLM scheduler, whose model is built on the loop, steps on it by design, graded
arguable blind). Blocking the loop is that design's cost, not a thread bug. A loop whose file
also steps on a worker (a fallback that switches between the two) is not an owner: its MLX is
on two threads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import libcst as cst

from mlx_invariants.checker import mlx_api
from mlx_invariants.checker.facts import CallSite
from mlx_invariants.checker.globs import matches_name
from mlx_invariants.checker.names import dotted
from mlx_invariants.checker.offload import handed_target
from mlx_invariants.checker.nodes import children
from mlx_invariants.checker.walker import OWN_BODY_STOP

if TYPE_CHECKING:
    from mlx_invariants.checker.walker import FileContext



def handed_reaches(target: cst.BaseExpression, ctx: FileContext,
                   kind: Callable[[CallSite, FileContext], str | None]) -> str | None:
    """The first call of `kind` that handing `target` (a callable) to a thread runs there: itself
    (`mx.eval`, `self.model`), or in the lambda or def of this file it names."""
    direct = lambda site: kind(site, ctx)  # noqa: E731
    if isinstance(target, cst.Lambda):
        facts = ctx.function_facts(target)
        return ctx.facts.first_reaching(facts, direct) if facts else None
    if isinstance(target, cst.Name | cst.Attribute):
        # Handing over `mx.eval` or `self.model` itself is as good as calling it there. The probe carries the
        # target's key, so a def of this file named like a loader is judged by its body (mlx_api.blocking).
        key = ctx.key(target)
        found = kind(CallSite(cst.Call(func=target), ctx.resolve(target), dotted(target), key), ctx)
        if found:
            return found
        for function in ctx.facts.by_key.get(key or "", ()):
            found = ctx.facts.first_reaching(function, direct)
            if found:
                return found
    return None


class LoopOwner:
    """Which `async def`s of a file are engine loops owning MLX on the loop's thread: a `while` in
    its own body, a stream binding on its way, and no hand-off of MLX anywhere in the file."""

    def __init__(self, ctx: FileContext) -> None:
        self.ctx = ctx
        self._hands_off: bool | None = None
        self._owners: dict[int, bool] = {}

    def owns(self, function: cst.CSTNode) -> bool:
        """`function` is an engine loop owning MLX on the loop's thread: its MLX is that owner's."""
        if not isinstance(function, cst.FunctionDef) or function.asynchronous is None:
            return False
        if id(function) not in self._owners:
            self._owners[id(function)] = (_has_while(function) and self._binding(function)
                                          and not self._file_hands_off())
        return self._owners[id(function)]

    def _binding(self, function: cst.FunctionDef) -> bool:
        facts = self.ctx.function_facts(function)
        return bool(facts and self.ctx.facts.first_reaching(facts, self._binder))

    def _binder(self, site: CallSite) -> str | None:
        if site.qual in mlx_api.STREAM_BINDING or matches_name(site.text, self.ctx.shared["stream-binders"]):
            return site.text
        return None

    def _file_hands_off(self) -> bool:
        """Some code of the file hands a callable that runs MLX to a thread."""
        if self._hands_off is None:
            self._hands_off = any(self._handed(site) for f in self.ctx.facts.functions.values() for site in f.calls)
        return self._hands_off

    def _handed(self, site: CallSite) -> bool:
        target = handed_target(site, self.ctx)
        return target is not None and handed_reaches(target, self.ctx, mlx_api.reaches) is not None


def _has_while(function: cst.FunctionDef) -> bool:
    """A `while` in the def's own body: a loop that runs for the server's life, not one request's."""
    stack: list[cst.CSTNode] = [function.body]
    while stack:
        current = stack.pop()
        if isinstance(current, cst.While):
            return True
        stack.extend(child for child in children(current) if not isinstance(child, OWN_BODY_STOP))
    return False
