"""Thread handoffs: `asyncio.to_thread`, `loop.run_in_executor`, `executor.submit`,
and which thread each one lands on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from mlx_invariants.checker.facts import number
from mlx_invariants.checker.globs import matches_name
from mlx_invariants.checker.names import dotted, terminal

if TYPE_CHECKING:
    from mlx_invariants.checker.walker import FileContext

TO_THREAD = frozenset({
    "asyncio.to_thread", "asyncio.threads.to_thread", "anyio.to_thread.run_sync", "trio.to_thread.run_sync",
})
THREAD_POOLS = frozenset({"concurrent.futures.ThreadPoolExecutor", "concurrent.futures.thread.ThreadPoolExecutor"})
POOLS = THREAD_POOLS | {"concurrent.futures.ProcessPoolExecutor", "concurrent.futures.process.ProcessPoolExecutor"}
# Cheap first test: a call can only be a handoff if its callee ends in one of these.
HANDOFF_NAMES = frozenset({"to_thread", "run_sync", "run_in_executor", "submit"})
EXECUTOR_NAMES = ["*executor*", "*pool*"]  # a receiver of `.submit` known by name as a pool


@dataclass(frozen=True)
class Handoff:
    """`call` runs `target` on another thread: `executor`'s, or the default pool's when None."""

    call: cst.Call
    how: str
    target: cst.BaseExpression | None
    executor: cst.BaseExpression | None


def positional(call: cst.Call, index: int) -> cst.BaseExpression | None:
    args = [a for a in call.args if a.keyword is None and not a.star]
    return args[index].value if index < len(args) else None


def keyword(call: cst.Call, name: str) -> cst.BaseExpression | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg.value
    return None


def handoff(call: cst.Call, ctx: FileContext) -> Handoff | None:
    """The thread handoff `call` makes, or None."""
    name = terminal(call.func)
    if name not in HANDOFF_NAMES:
        return None
    if name == "run_in_executor" and isinstance(call.func, cst.Attribute):
        executor = positional(call, 0)
        if isinstance(executor, cst.Name) and executor.value == "None":
            executor = None
        return Handoff(call, "run_in_executor", positional(call, 1), executor)
    if name == "submit" and isinstance(call.func, cst.Attribute):
        receiver = call.func.value
        key = ctx.key(receiver)
        if ctx.facts.constructed_by(key) & POOLS or matches_name(
            dotted(receiver), EXECUTOR_NAMES + ctx.shared["owner-executors"]
        ):
            return Handoff(call, "submit", positional(call, 0), receiver)
        return None
    qual = ctx.resolve(call.func)
    if qual in TO_THREAD:
        return Handoff(call, qual.rsplit(".", 2)[-2] + "." + qual.rsplit(".", 1)[-1], positional(call, 0), None)
    return None


def is_owner_executor(executor: cst.BaseExpression | None, ctx: FileContext) -> bool:
    """A configured owner executor, or a pool built in this file with exactly one worker thread:
    assigned to the same name or attribute, or kept under the same key of a mapping
    (`app[MLX] = ThreadPoolExecutor(1)`, used as `request.app[MLX]`)."""
    if executor is None:
        return False
    if matches_name(dotted(executor), ctx.shared["owner-executors"]):
        return True
    for assignment in ctx.facts.assigned.get(ctx.key(executor) or "", ()):
        if assignment.call_qual in THREAD_POOLS and _one_worker(assignment.value, ctx):
            return True
    slot = _slot(executor)
    return slot is not None and slot in _one_worker_slots(ctx)


def _one_worker(value: cst.BaseExpression, ctx: FileContext) -> bool:
    """A `ThreadPoolExecutor(...)` call whose worker count is the constant 1."""
    if not isinstance(value, cst.Call):
        return False
    workers = keyword(value, "max_workers") or positional(value, 0)
    return workers is not None and number(workers, ctx.facts.constants) == 1


def _slot(expr: cst.BaseExpression) -> str | None:
    """The key of `mapping[KEY]` when it is a name, an attribute or a string: what names the slot
    whichever object holds the mapping (`app[MLX]` and `request.app[MLX]` are one slot)."""
    if not isinstance(expr, cst.Subscript) or len(expr.slice) != 1:
        return None
    index = expr.slice[0].slice
    if not isinstance(index, cst.Index):
        return None
    if isinstance(index.value, cst.SimpleString):
        return repr(index.value.evaluated_value)  # 'mlx' and "mlx" are one key
    return dotted(index.value)


def _one_worker_slots(ctx: FileContext) -> set[str]:
    """Mapping keys this file stores a one-worker thread pool under; computed once per file."""
    found = ctx.facts.memo.get("one-worker-slots")
    if found is None:
        found = set()
        stack: list[cst.CSTNode] = [ctx.module]
        while stack:
            node = stack.pop()
            stack.extend(node.children)
            if isinstance(node, cst.Assign):
                targets = [t.target for t in node.targets]
            elif isinstance(node, cst.AnnAssign) and node.value is not None:
                targets = [node.target]
            else:
                continue
            value = node.value
            if not (isinstance(value, cst.Call) and ctx.resolve(value.func) in THREAD_POOLS
                    and _one_worker(value, ctx)):
                continue
            found.update(slot for slot in map(_slot, targets) if slot is not None)
        ctx.facts.memo["one-worker-slots"] = found
    return found


def unwrap_callable(expr: cst.BaseExpression | None, ctx: FileContext) -> cst.BaseExpression | None:
    """`functools.partial(f, ...)` -> `f`; anything else unchanged."""
    while isinstance(expr, cst.Call) and ctx.resolve(expr.func) in ("functools.partial", "contextvars.copy_context"):
        expr = positional(expr, 0)
    return expr


def forwarders(ctx: FileContext) -> dict[str, int]:
    """Defs of this file that hand one of their parameters to a worker thread, by key -> argument index.

    `async def _run_blocking_serialized(self, func, *args)` that runs `func` through
    `asyncio.to_thread` (directly, through `functools.partial`, or inside a nested def or
    lambda it hands over) is itself a handoff: `await self._run_blocking_serialized(work)`
    runs `work` on a worker thread. The index counts call arguments, so `self` is left out.
    Computed once per file, from the calls the walk recorded.
    """
    found = ctx.facts.memo.get("forwarders")
    if found is not None:
        return found
    found = {}
    facts = ctx.facts
    candidates = []
    for function in facts.functions.values():
        node = function.node
        if not isinstance(node, cst.FunctionDef) or not function.key:
            continue
        params = [p.name.value for p in (*node.params.posonly_params, *node.params.params)]
        if function.key.count(".") == 1 and params[:1] in (["self"], ["cls"]):
            params = params[1:]
        if params:
            candidates.append((function, params))
    changed = True
    while changed:  # a helper that forwards to a forwarder forwards too
        changed = False
        for function, params in candidates:
            if function.key in found:
                continue
            for site in function.calls:
                if terminal(site.node.func) in HANDOFF_NAMES:
                    work = handoff(site.node, ctx)
                else:
                    index = found.get(ctx.key(site.node.func) or "")
                    work = None if index is None else Handoff(site.node, "", positional(site.node, index), None)
                target = unwrap_callable(work.target, ctx) if work is not None else None
                name = _forwarded(target, params, ctx)
                if name is not None:
                    found[function.key] = params.index(name)
                    changed = True
                    break
    ctx.facts.memo["forwarders"] = found
    return found


def _forwarded(target: cst.BaseExpression | None, params: list[str], ctx: FileContext) -> str | None:
    """The parameter `target` is, or calls (a lambda, or a nested def handed over by name)."""
    if isinstance(target, cst.Name) and target.value in params:
        return target.value
    bodies = []
    if isinstance(target, cst.Lambda):
        bodies = [ctx.function_facts(target)]
    elif isinstance(target, cst.Name):
        bodies = list(ctx.facts.by_key.get(target.value, ()))
    for body in bodies:
        for site in body.calls if body is not None else ():
            if isinstance(site.node.func, cst.Name) and site.node.func.value in params:
                return site.node.func.value
    return None


def forwarded_handoff(call: cst.Call, ctx: FileContext) -> Handoff | None:
    """`helper(work, ...)` where `helper` is one of this file's forwarders: a handoff of `work`."""
    index = forwarders(ctx).get(ctx.key(call.func) or "")
    if index is None:
        return None
    return Handoff(call, dotted(call.func) or "a helper", positional(call, index), None)
