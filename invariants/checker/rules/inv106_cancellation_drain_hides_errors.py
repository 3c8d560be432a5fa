from __future__ import annotations

from dataclasses import dataclass, replace

import libcst as cst

from mlx_invariants.checker.globs import matches_name
from mlx_invariants.checker.names import dotted, terminal
from mlx_invariants.checker.rule import Invalid, Rule, Valid
from mlx_invariants.checker.cancellers import CANCELLED, caught
from mlx_invariants.checker.nodes import children
from mlx_invariants.checker.walker import OWN_BODY_STOP, descendants

_BROAD = frozenset({"Exception", "BaseException", "builtins.Exception", "builtins.BaseException"})
_SUPPRESS = frozenset({"contextlib.suppress"})
_TASK_MAKERS = frozenset({"create_task", "ensure_future", "run_in_executor", "to_thread", "wrap_future"})
# Waits that give up on cancellation without cancelling what they wait for.
_KEEPS_WORKER = frozenset({"asyncio.shield", "asyncio.wait", "asyncio.tasks.shield", "asyncio.tasks.wait"})
# Waits that pass a cancellation on to what they wait for.
_CANCELS_WORKER = frozenset({"asyncio.gather", "asyncio.wait_for", "asyncio.tasks.gather", "asyncio.tasks.wait_for"})
LOOP_IT = ("await it until it is done, whatever cancels you meanwhile: `while not {w}.done(): try: await "
           "shield_task({w}) except asyncio.CancelledError: continue`, then re-raise (`shield_task`: a shield that "
           "waits on a plain future; `asyncio.shield` there logs {w}'s error on CPython 3.14+, see INV117)")
LOG_IT = "log it (exc_info=True), then re-raise the CancelledError"


@dataclass(frozen=True)
class _Around:
    """What surrounds a point of a cancellation handler, from the handler down."""

    helper: bool = False  # inside `with <shield helper>:`, which the project says keeps cancellation out
    looping: bool = False  # inside a `while` loop of the handler
    retried: bool = False  # ... and inside a try there whose cancellation handler goes round again
    catcher: cst.CSTNode | None = None  # the innermost except clause or suppress() around this point
    catcher_text: str = ""
    stops_cancel: bool = False  # that catcher catches CancelledError (BaseException, bare, by name)
    swallows: bool = False  # that catcher drops every error (Exception or wider) without a trace


# A spool whose `restore` drains its reader badly; the package's tier module awaits it, or never names it.
_SPOOL = '''
    import asyncio

    class Spool:
        def __init__(self, disk):
            self.disk = disk

        async def restore(self, key):
            reader = asyncio.ensure_future(asyncio.to_thread(self.disk.load, key))
            try:
                return await asyncio.shield(reader)
            except asyncio.CancelledError:
                try:
                    await reader  # expect: INV106
                except BaseException:
                    pass
                raise
'''
_TIERS = '''
    from .main import Spool

    class Tiers:
        def __init__(self, disk):
            self.spool = Spool(disk)

        def size(self):
            return self.spool.disk.size()
'''
_FETCHING = _TIERS + '''
        async def fetch(self, key):
            return await self.spool.restore(key)
'''


class CancellationDrainHidesErrors(Rule):
    """A request that is cancelled while its worker thread runs must keep what
    it holds (the generation slot, the lock, a memory budget) until the worker
    is done: the handler `except CancelledError:` drains the worker, then
    re-raises. The drain is itself cancellable. A client disconnect cancels the
    handler once; a shutdown cancelling it again while it drains ends the drain
    early, and the slot is freed while the thread is still inside MLX, exactly
    the bug the drain was written to prevent. A single `await task` there passes
    the second cancellation into the task; `except Exception` around it lets it
    escape; `except BaseException: pass` catches it but ends the drain all the
    same, and drops the worker's error too, so an MLX failure during a cancelled
    request leaves no trace. Drain in a loop that goes round again on every
    cancellation until the worker is done, and log the worker's error.
    xinference's tokenization gate re-shields its worker future under
    `except (Exception, asyncio.CancelledError): pass` (router/tokenization.py
    @7ecec16:179): a second cancellation ends that wait, and the `finally`
    frees the admission slot that its comment says must outlast the worker."""

    id = "INV106"
    catches = "a cancellation drain that a second cancellation cuts short, or that drops the worker's error unlogged"
    message = "{problem}: {fix}"
    known_problems = (
        "Looks only inside handlers that catch CancelledError by name, at awaits of the worker: a name the "
        "try block shields (`asyncio.shield(x)`, or a helper named `*shield*`) or a task made in the same "
        "function (create_task/ensure_future/run_in_executor/to_thread). A handler that cancels the worker "
        "(`task.cancel()`) is propagating the cancellation, not draining, and is not judged. A drain counts "
        "as surviving cancellation inside a `while` loop whose try goes round again on CancelledError (and "
        "waits through `asyncio.shield`/`asyncio.wait` or a `*shield*` helper, which do not cancel the "
        "worker), or inside `with <shield-helpers>:`; in such a loop an `except Exception` is the loop's "
        "exit once the worker is done and is not reported as swallowing its error. A helper called from "
        "the handler that drains or swallows is not followed; a handler counts as logging if it calls "
        "anything. A drain inside a def its package never names is not judged (docs/checker.md, \"Code "
        "nothing in the package names\"): vllm-mlx's `SSDCacheTier.async_promote`, which only an unused "
        "`Scheduler.promote_from_ssd` called (ssd_cache.py@4b654c0:1024), was graded a false positive blind."
    )
    triggers = (("CancelledError",),)

    INVALID = [
        Invalid('''
            import asyncio

            async def run(step):
                task = asyncio.create_task(asyncio.to_thread(step))
                try:
                    return await asyncio.shield(task)
                except asyncio.CancelledError:
                    try:
                        await task  # expect: INV106
                    except BaseException:
                        pass
                    raise
        '''),
        Invalid('''
            import asyncio

            async def read_entry(read, release_budget):
                worker = asyncio.ensure_future(asyncio.to_thread(read))
                try:
                    return await shield_task(worker)
                except asyncio.CancelledError:
                    try:
                        await shield_task(worker)  # expect: INV106
                    except Exception:
                        logger.warning("read failed while draining", exc_info=True)
                    release_budget()
                    raise
        '''),
        Invalid('''
            import asyncio
            import contextlib

            async def run(task):
                try:
                    return await asyncio.shield(task)
                except asyncio.CancelledError:
                    with contextlib.suppress(asyncio.CancelledError):
                        await task  # expect: INV106
                    raise
        '''),
        Invalid('''
            import asyncio

            async def unload(task):
                try:
                    await asyncio.shield(task)
                except asyncio.CancelledError:
                    with suspend_cancellation():
                        try:
                            await asyncio.shield(task)
                        except Exception:  # expect: INV106
                            pass
                    raise
        '''),
        Invalid(_SPOOL, files={"app/tiers.py": _FETCHING}),
    ]
    VALID = [
        # Nothing in the package names `restore`: the server never runs this drain (checker/model/unreferenced.py).
        Valid(_SPOOL.replace("  # expect: INV106", ""), files={"app/tiers.py": _TIERS}),
        Valid('''
            import asyncio

            async def run(step):
                task = asyncio.create_task(asyncio.to_thread(step))
                try:
                    return await shield_task(task)
                except asyncio.CancelledError:
                    while not task.done():
                        try:
                            await shield_task(task)
                        except asyncio.CancelledError:
                            continue
                        except Exception:
                            logger.warning("worker failed while draining", exc_info=True)
                    raise
        '''),
        Valid('''
            import asyncio

            async def read_entry(read, release_budget):
                worker = asyncio.ensure_future(asyncio.to_thread(read))
                try:
                    return await shield_task(worker)
                except asyncio.CancelledError:
                    while not worker.done():
                        try:
                            await shield_task(worker)
                        except asyncio.CancelledError:
                            continue
                        except Exception:
                            break
                    release_budget()
                    raise
        '''),
        Valid('''
            import asyncio

            async def run(task):
                try:
                    return await shield_task(task)
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

            async def unload(task):
                try:
                    await asyncio.shield(task)
                except asyncio.CancelledError:
                    with suspend_cancellation():
                        try:
                            await asyncio.shield(task)
                        except Exception:
                            logger.warning("unload failed while draining", exc_info=True)
                    raise
        '''),
        Valid('''
            import asyncio
            import contextlib

            async def supervise(child):
                task = asyncio.create_task(child())
                try:
                    await asyncio.shield(task)
                except asyncio.CancelledError:
                    task.cancel()
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
        self.reported: set[int] = set()

    def visit_Assign(self, node: cst.Assign) -> None:
        value = node.value
        if isinstance(value, cst.Call) and terminal(value.func) in _TASK_MAKERS:
            names = self.tasks.setdefault(id(self.ctx.scope.top.node), set())
            names.update(t.target.value for t in node.targets if isinstance(t.target, cst.Name))

    def visit_Try(self, node: cst.Try) -> None:
        drains = [h for h in node.handlers if self._catches_cancelled(h)]
        if not drains:
            return
        workers = self._shielded(node.body) | self.tasks.get(id(self.ctx.scope.top.node), set())
        for handler in drains:
            if workers and not self._cancels_worker(handler, workers):
                self._scan(handler.body, _Around(), workers)

    def _shielded(self, body: cst.CSTNode) -> set[str]:
        """Names the try block waits for through a wait that leaves them running on cancellation."""
        found: set[str] = set()
        for node in descendants(body, OWN_BODY_STOP):
            if isinstance(node, cst.Call) and self._keeps_worker(node):
                found.update(_waited(node))
        return found

    def _cancels_worker(self, handler: cst.ExceptHandler, workers: set[str]) -> bool:
        """`task.cancel()` in the handler: it propagates the cancellation instead of draining."""
        return any(
            isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value == "cancel"
            and dotted(n.func.value) in workers
            for n in descendants(handler.body, OWN_BODY_STOP)
        )

    def _scan(self, node: cst.CSTNode, around: _Around, workers: set[str]) -> None:
        if isinstance(node, OWN_BODY_STOP):
            return
        if isinstance(node, cst.While):
            around = replace(around, looping=True, retried=False)
        elif isinstance(node, cst.Try):
            for part in [*node.handlers, node.orelse, node.finalbody]:
                if part is not None:
                    self._scan(part, around, workers)
            self._scan(node.body, self._inside_try(node, around), workers)
            return
        elif isinstance(node, cst.With):
            around = self._inside_with(node, around)
        elif isinstance(node, cst.Await):
            worker = self._awaited_worker(node.expression, workers)
            if worker is not None:
                self._judge(node, worker, around)
        for child in children(node):
            self._scan(child, around, workers)

    def _inside_try(self, node: cst.Try, around: _Around) -> _Around:
        catcher = next((h for h in node.handlers if self._catches_any_cancel(h.type)), None)
        broad = next((h for h in node.handlers if self._broad(h.type)), None)
        if catcher is not None:  # the cancellation lands here first: does the loop go round?
            around = replace(around, retried=around.looping and _goes_round(catcher))
        innermost = catcher or broad or next(iter(node.handlers), None)
        if innermost is None:
            return around
        swallowing = broad is not None and _swallows(broad)
        shown = broad if swallowing else catcher or innermost
        return replace(around, catcher=shown, catcher_text=_describe(shown), stops_cancel=catcher is not None,
                       swallows=swallowing)

    def _inside_with(self, node: cst.With, around: _Around) -> _Around:
        for item in node.items:
            call = item.item
            helper = call.func if isinstance(call, cst.Call) else call
            if matches_name(dotted(helper), self.ctx.shared["shield-helpers"]):
                around = replace(around, helper=True)
            if isinstance(call, cst.Call) and self.ctx.resolve(call.func) in _SUPPRESS:
                broad = any(self._broad(a.value) for a in call.args)
                stops = any(self._catches_any_cancel(a.value) for a in call.args)
                around = replace(around, catcher=item, catcher_text="`contextlib.suppress`", stops_cancel=stops,
                                 swallows=broad)
        return around

    def _judge(self, node: cst.Await, worker: str, around: _Around) -> None:
        passes_cancel = not (isinstance(node.expression, cst.Call) and self._keeps_worker(node.expression))
        if around.helper or (around.retried and not passes_cancel):
            if around.helper and not around.retried and around.swallows:
                self._report_once(around.catcher, problem=f"{around.catcher_text} drops the worker's error unlogged "
                                  "inside a cancellation handler", fix=LOG_IT)
            return
        if around.stops_cancel:
            problem = (f"a second cancellation ends this drain before `{worker}` finishes ({around.catcher_text} "
                       "catches it), and what the handler guards is released while the worker still runs")
        else:
            caught = f" ({around.catcher_text} does not catch CancelledError)" if around.catcher is not None else ""
            problem = (f"a second cancellation escapes this drain before `{worker}` finishes{caught}, skipping the "
                       "rest of the handler while the worker still runs")
        if passes_cancel:
            problem += f"; awaiting `{worker}` directly also cancels it"
        if around.swallows:
            problem += f"; {around.catcher_text} also drops the worker's error unlogged"
        fix = LOOP_IT.format(w=worker) + (", and log the worker's error" if around.swallows else "")
        self._report_once(node, problem=problem, fix=fix)

    def _report_once(self, node: cst.CSTNode | None, **fields: str) -> None:
        if node is not None and id(node) not in self.reported:
            self.reported.add(id(node))
            self.report(node, **fields)

    def _awaited_worker(self, expr: cst.BaseExpression, workers: set[str]) -> str | None:
        if isinstance(expr, cst.Call) and (self._keeps_worker(expr) or self.ctx.resolve(expr.func) in _CANCELS_WORKER):
            return next((w for w in sorted(_waited(expr)) if w in workers), None)
        name = dotted(expr)
        return name if name in workers else None

    def _keeps_worker(self, call: cst.Call) -> bool:
        """`asyncio.shield(x)`, `asyncio.wait({x})` or a project helper named like a shield."""
        return self.ctx.resolve(call.func) in _KEEPS_WORKER or "shield" in (terminal(call.func) or "").lower()

    def _catches_any_cancel(self, kind: cst.BaseExpression | None) -> bool:
        if kind is None:
            return True
        return any(qual in CANCELLED | {"BaseException"} for qual in caught(kind, self.ctx))

    def _catches_cancelled(self, handler: cst.ExceptHandler) -> bool:
        return any(qual in CANCELLED for qual in caught(handler.type, self.ctx))

    def _broad(self, kind: cst.BaseExpression | None) -> bool:
        if kind is None:
            return True
        kinds = [e.value for e in kind.elements] if isinstance(kind, cst.Tuple) else [kind]
        return any((self.ctx.resolve(k) or dotted(k)) in _BROAD for k in kinds)


def _describe(handler: cst.ExceptHandler) -> str:
    return "`except:`" if handler.type is None else f"`except {dotted(handler.type) or '(...)'}:`"


def _waited(call: cst.Call) -> set[str]:
    """The dotted names a wait call waits for: its positional arguments, and the items of a set/list/tuple there."""
    found = set()
    for arg in call.args:
        if arg.keyword is not None:
            continue
        items = arg.value.elements if isinstance(arg.value, cst.Set | cst.List | cst.Tuple) else [arg]
        found.update(name for item in items if (name := dotted(item.value)) is not None)
    return found


def _goes_round(handler: cst.ExceptHandler) -> bool:
    """The handler neither raises, returns nor breaks: the loop tries again."""
    return not any(isinstance(n, cst.Raise | cst.Return | cst.Break) for n in descendants(handler.body, OWN_BODY_STOP))


def _swallows(handler: cst.ExceptHandler) -> bool:
    """The handler neither calls anything (logging), raises, nor uses the error."""
    bound = handler.name.name.value if handler.name is not None and isinstance(handler.name.name, cst.Name) else None
    for node in descendants(handler.body, OWN_BODY_STOP):
        if isinstance(node, cst.Call | cst.Raise):
            return False
        if bound and isinstance(node, cst.Name) and node.value == bound:
            return False
    return True
