from __future__ import annotations

import libcst as cst

from mlx_invariants.checker.names import dotted, terminal
from mlx_invariants.checker.offload import positional
from mlx_invariants.checker.rule import Invalid, Rule, Valid
from mlx_invariants.checker.cancellers import catches_cancellation
from mlx_invariants.checker.walker import OWN_BODY_STOP, descendants

_SHIELDS = frozenset({"asyncio.shield", "asyncio.tasks.shield"})
# Calls whose result is a task or future that carries the worker's exception.
_TASK_MAKERS = frozenset({"create_task", "ensure_future", "run_in_executor", "to_thread", "wrap_future"})


class ShieldReawaitedAfterCancel(Rule):
    """The drain that keeps a slot until the worker is done (INV105, INV106)
    re-shields the worker after each cancellation. From CPython 3.14,
    `asyncio.shield` treats a cancelled shield as abandoned: it adds a callback to
    the inner task that hands the task's exception to the loop's exception
    handler ("... exception in shielded future"), whether or not anyone awaits the
    task afterwards. A drain that re-shields, and so does retrieve the error, still
    gets every worker failure after a disconnect logged as unhandled, and test
    harnesses that fail on loop errors fail. vllm-mlx hit it in three places at
    7c7232a (engine/base.py, lifecycle.py, engine/simple.py) and fixed it in
    b135cd8 with a `shield_task` helper that waits on a plain future fed by one
    done-callback on the task. Before 3.14 the same code is quiet, so the bug
    appears on an interpreter upgrade.

    Opt-in (`select = ["INV", "INV117"]`): what follows is a log line, nothing more,
    unless something treats the loop's exception handler as a failure (vllm-mlx fixed
    its three because pytest-anyio failed its tests on them). CPython's own tracker
    calls the log spurious (python/cpython#156321, open: the callback `shield` adds on
    cancellation stays on the task for good). Its one finding on the HEADs of ten MLX
    servers, vllm-mlx's `_run_blocking_engine_cache_io` (server.py@4b654c0:1367, the
    shape vllm-mlx fixed elsewhere but left there), was graded arguable blind for
    exactly that reason, and every site it has caught is that one repository's."""

    id = "INV117"
    catches = "a worker task shielded with `asyncio.shield` and shielded again after a cancellation (CPython 3.14+)"
    message = (
        "`asyncio.shield({task})` is shielded again after a cancellation: from CPython 3.14 a cancelled shield "
        "hands `{task}`'s later exception to the loop's exception handler even though this drain retrieves it; "
        "wait through a helper that parks on a plain future fed by one done-callback on `{task}` (a `shield_task`)"
    )
    known_problems = (
        "Judges tasks made in the same function (create_task/ensure_future/run_in_executor/to_thread/"
        "wrap_future); a task or future passed in is not judged, nor a drain that awaits the task directly "
        "instead of shielding it again (on 3.14 the cancelled shield logs there too). Harmless before "
        "CPython 3.14, and for a task that never raises."
    )
    # Opt-in: the consequence is a log line from the loop's exception handler (see the docstring).
    default_enabled = False
    triggers = (("shield",), ("CancelledError", "except:", "BaseException"))

    INVALID = [
        Invalid('''
            import asyncio

            async def run_blocking_startup_work(work, executor=None):
                loop = asyncio.get_running_loop()
                task = asyncio.ensure_future(loop.run_in_executor(executor, work))
                try:
                    await asyncio.shield(task)  # expect: INV117
                except asyncio.CancelledError:
                    with suspend_cancellation():
                        while not task.done():
                            try:
                                await asyncio.shield(task)
                            except asyncio.CancelledError:
                                continue
                            except Exception:
                                break
                    raise
        '''),
        Invalid('''
            import asyncio

            async def drain(step):
                task = asyncio.create_task(asyncio.to_thread(step))
                cancelled = False
                while not task.done():
                    try:
                        await asyncio.shield(task)  # expect: INV117
                    except asyncio.CancelledError:
                        cancelled = True
                if cancelled:
                    raise asyncio.CancelledError()
                return task.result()
        '''),
    ]
    VALID = [
        Valid('''
            import asyncio

            async def run_blocking_startup_work(work, executor=None):
                loop = asyncio.get_running_loop()
                task = asyncio.ensure_future(loop.run_in_executor(executor, work))
                try:
                    await shield_task(task)
                except asyncio.CancelledError:
                    with suspend_cancellation():
                        while not task.done():
                            try:
                                await shield_task(task)
                            except asyncio.CancelledError:
                                continue
                            except Exception:
                                break
                    raise
        '''),
        Valid('''
            import asyncio

            async def drain(step):
                task = asyncio.create_task(asyncio.to_thread(step))
                cancelled = False
                while not task.done():
                    try:
                        await shield_task(task)
                    except asyncio.CancelledError:
                        cancelled = True
                if cancelled:
                    raise asyncio.CancelledError()
                return task.result()
        '''),
        Valid('''
            import asyncio

            async def save(step):
                task = asyncio.create_task(asyncio.to_thread(step))
                try:
                    return await asyncio.shield(task)
                except asyncio.CancelledError:
                    task.add_done_callback(log_failure)
                    raise
        '''),
    ]

    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        self.tasks: dict[int, set[str]] = {}
        self.loops: list[int] = []  # the frame of each open `while`
        self.reported: set[tuple[int, str]] = set()  # one finding per task per function

    def visit_Assign(self, node: cst.Assign) -> None:
        value = node.value
        if isinstance(value, cst.Call) and terminal(value.func) in _TASK_MAKERS:
            names = self.tasks.setdefault(id(self.ctx.scope.top.node), set())
            names.update(d for t in node.targets if (d := dotted(t.target)) is not None)

    def visit_While(self, node: cst.While) -> None:
        self.loops.append(id(self.ctx.scope.top.node))

    def leave_While(self, node: cst.While) -> None:
        self.loops.pop()

    def visit_Try(self, node: cst.Try) -> None:
        frame = id(self.ctx.scope.top.node)
        tasks = self.tasks.get(frame)
        if not tasks:
            return
        handlers = [h for h in node.handlers if catches_cancellation(h, self.ctx)]
        if not handlers:
            return
        # An open `while` of this same def encloses the try: a handler that goes round shields again.
        round_again = bool(self.loops) and self.loops[-1] == frame and any(_goes_round(h) for h in handlers)
        for shield, task in self._shields(node.body, tasks):
            again = round_again or any(task in {t for _, t in self._shields(h.body, tasks)} for h in handlers)
            if again and (frame, task) not in self.reported:
                self.reported.add((frame, task))
                self.report(shield, task=task)

    def _shields(self, body: cst.CSTNode, tasks: set[str]) -> list[tuple[cst.Call, str]]:
        found = []
        for node in descendants(body, OWN_BODY_STOP):
            if isinstance(node, cst.Call) and self.ctx.resolve(node.func) in _SHIELDS:
                inner = positional(node, 0)
                name = dotted(inner) if inner is not None else None
                if name in tasks:
                    found.append((node, name))
        return found


def _goes_round(handler: cst.ExceptHandler) -> bool:
    """The handler neither raises, returns nor breaks: the enclosing loop tries again."""
    return not any(isinstance(n, cst.Raise | cst.Return | cst.Break) for n in descendants(handler.body, OWN_BODY_STOP))
