from __future__ import annotations

import libcst as cst

from mlx_invariants.checker.globs import matches_name
from mlx_invariants.checker.names import dotted, terminal
from mlx_invariants.checker.rule import Invalid, Rule, Valid
from mlx_invariants.checker.rules.inv105_lock_released_before_worker import CANCELLED
from mlx_invariants.checker.walker import OWN_BODY_STOP, children, descendants

_BROAD = frozenset({"Exception", "BaseException", "builtins.Exception", "builtins.BaseException"})
_SUPPRESS = frozenset({"contextlib.suppress"})
_TASK_MAKERS = frozenset({"create_task", "ensure_future", "run_in_executor", "to_thread", "wrap_future"})
_WAITERS = frozenset({"asyncio.shield", "asyncio.wait", "asyncio.gather", "asyncio.wait_for"})
LOG_IT = "log it (exc_info=True), then re-raise the CancelledError"
LOOP_IT = ("drain in a loop: `while not task.done(): try: await asyncio.shield(task) "
           "except asyncio.CancelledError: continue`")


class CancellationDrainHidesErrors(Rule):
    """The drain in a cancellation handler (`except CancelledError: await task`)
    is where a worker that crashed inside MLX reports it; swallowing that error
    there (`except Exception: pass`) makes an MLX failure invisible, and the next
    request meets a broken model with no trace of why. `except BaseException: pass`
    hides the error too. And a drain guarded only by `except Exception` lets a
    second cancellation (a shutdown cancelling a handler a disconnect already
    cancelled) escape mid-drain, which frees the lock while the worker runs. Drain
    in a loop that survives cancellation, log the worker's error, re-raise."""

    id = "INV106"
    catches = "an error swallowed without logging inside an `except CancelledError` drain"
    message = "{problem} inside a cancellation handler: {fix}"
    known_problems = (
        "Only looks inside handlers that catch CancelledError (or everything); a helper called from "
        "there that swallows errors is not followed. A handler counts as logging if it calls anything. "
        "The worker is recognised as a task name from create_task/ensure_future/run_in_executor in the "
        "same function; a `with` of a shield-helpers context manager counts as keeping cancellation out."
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

            async def run(step):
                task = asyncio.create_task(asyncio.to_thread(step))
                try:
                    return await asyncio.shield(task)
                except asyncio.CancelledError:
                    try:
                        await task  # expect: INV106
                    except Exception:
                        logger.warning("worker failed while draining", exc_info=True)
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

            async def run(step):
                task = asyncio.create_task(asyncio.to_thread(step))
                try:
                    return await asyncio.shield(task)
                except asyncio.CancelledError:
                    while not task.done():
                        try:
                            await asyncio.shield(task)
                        except asyncio.CancelledError:
                            continue
                        except Exception:
                            logger.warning("worker failed while draining", exc_info=True)
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

    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        self.tasks: dict[int, set[str]] = {}

    def visit_Assign(self, node: cst.Assign) -> None:
        value = node.value
        if isinstance(value, cst.Call) and terminal(value.func) in _TASK_MAKERS:
            names = self.tasks.setdefault(id(self.ctx.scope.top.node), set())
            names.update(t.target.value for t in node.targets if isinstance(t.target, cst.Name))

    def visit_ExceptHandler(self, node: cst.ExceptHandler) -> None:
        if not self._catches_cancelled(node):
            return
        tasks = self.tasks.get(id(self.ctx.scope.top.node), set())
        self._scan(node.body, protected=False, tasks=tasks)

    def _scan(self, node: cst.CSTNode, protected: bool, tasks: set[str]) -> None:
        """Report swallowing handlers, and worker awaits no CancelledError handler guards."""
        if isinstance(node, OWN_BODY_STOP):
            return
        if isinstance(node, cst.Try):
            swallowing = [h for h in node.handlers if self._broad(h.type) and _swallows(h)]
            for handler in swallowing:
                self.report(handler, problem=f"{_describe(handler)} swallows the worker's error", fix=LOG_IT)
            guarded = protected or bool(swallowing) or any(self._catches_any_cancel(h.type) for h in node.handlers)
            self._scan(node.body, guarded, tasks)
            for part in [*node.handlers, node.orelse, node.finalbody]:
                if part is not None:
                    self._scan(part, protected, tasks)
            return
        if isinstance(node, cst.With):
            for item in node.items:
                call = item.item
                helper = call.func if isinstance(call, cst.Call) else call
                if matches_name(dotted(helper), self.ctx.shared["shield-helpers"]):
                    protected = True  # a project helper that keeps cancellation out of its block
                if isinstance(call, cst.Call) and self.ctx.resolve(call.func) in _SUPPRESS:
                    if any(self._broad(a.value) for a in call.args):
                        self.report(item, problem="`contextlib.suppress` of every error swallows the worker's error",
                                    fix=LOG_IT)
                        protected = True
                    elif any(self._catches_any_cancel(a.value) for a in call.args):
                        protected = True
        if isinstance(node, cst.Await) and not protected and self._awaits_worker(node.expression, tasks):
            problem = "a second cancellation escapes this drain (`except Exception` does not catch CancelledError)"
            self.report(node, problem=problem, fix=LOOP_IT)
        for child in children(node):
            self._scan(child, protected, tasks)

    def _awaits_worker(self, expr: cst.BaseExpression, tasks: set[str]) -> bool:
        if isinstance(expr, cst.Call) and self.ctx.resolve(expr.func) in _WAITERS:
            return any(isinstance(n, cst.Name) and n.value in tasks for n in descendants(expr))
        return isinstance(expr, cst.Name) and expr.value in tasks

    def _catches_any_cancel(self, kind: cst.BaseExpression | None) -> bool:
        if kind is None:
            return True
        kinds = [e.value for e in kind.elements] if isinstance(kind, cst.Tuple) else [kind]
        return any((self.ctx.resolve(k) or dotted(k)) in CANCELLED | {"BaseException"} for k in kinds)

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


def _describe(handler: cst.ExceptHandler) -> str:
    return "`except:`" if handler.type is None else f"`except {dotted(handler.type) or '(...)'}:`"


def _swallows(handler: cst.ExceptHandler) -> bool:
    """The handler neither calls anything (logging), raises, nor uses the error."""
    bound = handler.name.name.value if handler.name is not None and isinstance(handler.name.name, cst.Name) else None
    for node in descendants(handler.body, OWN_BODY_STOP):
        if isinstance(node, cst.Call | cst.Raise):
            return False
        if bound and isinstance(node, cst.Name) and node.value == bound:
            return False
    return True
