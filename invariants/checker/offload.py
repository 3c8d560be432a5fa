"""Thread handoffs: `asyncio.to_thread`, `loop.run_in_executor`, `executor.submit`,
and which thread each one lands on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

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
    """A configured owner executor, or a pool built in this file with exactly one worker thread."""
    if executor is None:
        return False
    if matches_name(dotted(executor), ctx.shared["owner-executors"]):
        return True
    for assignment in ctx.facts.assigned.get(ctx.key(executor) or "", ()):
        value = assignment.value
        if assignment.call_qual in THREAD_POOLS and isinstance(value, cst.Call):
            workers = keyword(value, "max_workers") or positional(value, 0)
            if isinstance(workers, cst.Integer) and workers.value == "1":
                return True
    return False


def unwrap_callable(expr: cst.BaseExpression | None, ctx: FileContext) -> cst.BaseExpression | None:
    """`functools.partial(f, ...)` -> `f`; anything else unchanged."""
    while isinstance(expr, cst.Call) and ctx.resolve(expr.func) in ("functools.partial", "contextvars.copy_context"):
        expr = positional(expr, 0)
    return expr
