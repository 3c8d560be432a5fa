from __future__ import annotations

import libcst as cst

from invariants.names import dotted
from invariants.rule import Invalid, Rule, Valid
from invariants.rules.inv105_lock_released_before_worker import CANCELLED
from invariants.walker import OWN_BODY_STOP, descendants

_BROAD = frozenset({"Exception", "BaseException", "builtins.Exception", "builtins.BaseException"})
_SUPPRESS = frozenset({"contextlib.suppress"})


class CancellationDrainHidesErrors(Rule):
    """The drain in a cancellation handler (`except CancelledError: await task`)
    is where a worker that crashed inside MLX reports it; swallowing that error
    there (`except Exception: pass`) makes an MLX failure invisible, and the next
    request meets a broken model with no trace of why. `except BaseException: pass`
    is worse: it also eats a second cancellation, so shutdown hangs. Log the
    error, keep draining, and re-raise the CancelledError."""

    id = "INV106"
    catches = "an error swallowed without logging inside an `except CancelledError` drain"
    message = "{what} swallows the worker's error inside a cancellation handler: log it (exc_info=True), then re-raise the CancelledError"
    known_problems = (
        "Only looks inside handlers that catch CancelledError (or everything); a helper called from "
        "there that swallows errors is not followed. A handler counts as logging if it calls anything."
    )
    triggers = (("CancelledError",),)

    INVALID = [
        Invalid('''
            import asyncio

            async def run(task):
                try:
                    return await asyncio.shield(task)
                except asyncio.CancelledError:
                    try:
                        await task
                    except Exception:  # expect: INV106
                        pass
                    raise
        '''),
        Invalid('''
            import asyncio
            import contextlib

            async def run(task):
                try:
                    return await asyncio.shield(task)
                except asyncio.CancelledError:
                    with contextlib.suppress(BaseException):  # expect: INV106
                        await task
                    raise
        '''),
    ]
    VALID = [
        Valid('''
            import asyncio

            async def run(task):
                try:
                    return await asyncio.shield(task)
                except asyncio.CancelledError:
                    try:
                        await task
                    except Exception:
                        logger.warning("worker failed while draining a cancelled request", exc_info=True)
                    raise
        '''),
        Valid('''
            import asyncio
            import contextlib

            async def run(task):
                try:
                    return await asyncio.shield(task)
                except asyncio.CancelledError:
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                    raise
        '''),
        Valid('''
            import asyncio

            async def stop(task):
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        '''),
    ]

    def visit_ExceptHandler(self, node: cst.ExceptHandler) -> None:
        if not self._catches_cancelled(node):
            return
        for inner in descendants(node.body, OWN_BODY_STOP):
            if isinstance(inner, cst.ExceptHandler) and self._broad(inner.type) and _swallows(inner):
                kind = "`except:`" if inner.type is None else f"`except {dotted(inner.type) or '(...)'}:`"
                self.report(inner, what=kind)
            elif isinstance(inner, cst.WithItem) and isinstance(inner.item, cst.Call):
                call = inner.item
                if self.ctx.resolve(call.func) in _SUPPRESS and any(self._broad(a.value) for a in call.args):
                    self.report(inner, what="`contextlib.suppress` of every error")

    def _catches_cancelled(self, handler: cst.ExceptHandler) -> bool:
        if handler.type is None:
            return False
        kinds = [e.value for e in handler.type.elements] if isinstance(handler.type, cst.Tuple) else [handler.type]
        return any((self.ctx.resolve(k) or dotted(k)) in CANCELLED for k in kinds)

    def _broad(self, kind: cst.BaseExpression | None) -> bool:
        if kind is None:
            return True
        kinds = [e.value for e in kind.elements] if isinstance(kind, cst.Tuple) else [kind]
        return any((self.ctx.resolve(k) or dotted(k)) in _BROAD for k in kinds)


def _swallows(handler: cst.ExceptHandler) -> bool:
    """The handler neither calls anything (logging), raises, nor uses the error."""
    bound = handler.name.name.value if handler.name is not None and isinstance(handler.name.name, cst.Name) else None
    for node in descendants(handler.body, OWN_BODY_STOP):
        if isinstance(node, cst.Call | cst.Raise):
            return False
        if bound and isinstance(node, cst.Name) and node.value == bound:
            return False
    return True
