"""What counts as a lock, a timeout, and a lock acquisition."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from mlx_invariants.checker.globs import matches_name
from mlx_invariants.checker.names import dotted

if TYPE_CHECKING:
    from mlx_invariants.checker.walker import FileContext

MUTEXES = frozenset({
    "asyncio.Lock", "asyncio.locks.Lock", "threading.Lock", "threading.RLock", "anyio.Lock",
    "asyncio.Condition", "threading.Condition", "multiprocessing.Lock", "trio.Lock",
})
# The mutexes a coroutine awaits (a thread's wait on the others blocks the thread).
AWAITED_MUTEXES = MUTEXES - {"threading.Lock", "threading.RLock", "threading.Condition", "multiprocessing.Lock"}
SEMAPHORES = frozenset({
    "asyncio.Semaphore", "asyncio.BoundedSemaphore", "asyncio.locks.Semaphore", "threading.Semaphore",
    "threading.BoundedSemaphore", "anyio.Semaphore", "anyio.CapacityLimiter", "trio.Semaphore",
})
LOCKS = MUTEXES | SEMAPHORES
TIMEOUT_SCOPES = frozenset({
    "asyncio.timeout", "asyncio.timeouts.timeout", "anyio.fail_after", "anyio.move_on_after",
    "async_timeout.timeout", "trio.fail_after", "trio.move_on_after",
})
WAIT_FOR = frozenset({"asyncio.wait_for", "asyncio.tasks.wait_for"})


def lock_classes(expr: cst.BaseExpression, ctx: FileContext) -> set[str]:
    """The lock classes `expr` was built from in this file (`{'asyncio.Lock'}`), if any."""
    return ctx.facts.constructed_by(ctx.key(expr)) & LOCKS


def is_lock(expr: cst.BaseExpression, ctx: FileContext) -> bool:
    """Built from a lock class in this file, or named like one (`lock-names`)."""
    if isinstance(expr, cst.Call):
        return ctx.resolve(expr.func) in LOCKS
    if lock_classes(expr, ctx):
        return True
    built = ctx.facts.constructed_by(ctx.key(expr))
    # Named like a lock but built from something else we know (a pool, a nullcontext): trust the value.
    if built and not built & LOCKS:
        return False
    return matches_name(dotted(expr), ctx.shared["lock-names"])


# Where a lock class lives: a lock imported from one of these is a class, not a lock some module shares.
_LOCK_LIBRARIES = frozenset({"threading", "asyncio", "multiprocessing", "anyio", "trio", "concurrent"})


def shared_lock(expr: cst.BaseExpression, ctx: FileContext) -> bool:
    """One lock for the whole process, not one per object or per call: a lock this file imports from a module
    of its project (`from app.mlx_lock import MLX_LOCK`), or a module-level name of this file built from a
    lock class (`_load_lock = threading.Lock()`)."""
    qual = ctx.resolve(expr)
    if qual:
        return qual.lstrip(".").split(".", 1)[0] not in _LOCK_LIBRARIES and is_lock(expr, ctx)
    key = ctx.key(expr) if isinstance(expr, cst.Name) else None
    return any(a.scope == id(ctx.module) and a.call_qual in LOCKS for a in ctx.facts.assigned.get(key or "", ()))


def is_timeout_scope(expr: cst.BaseExpression, ctx: FileContext) -> bool:
    return isinstance(expr, cst.Call) and ctx.resolve(expr.func) in TIMEOUT_SCOPES


def acquired_lock(expr: cst.BaseExpression) -> cst.BaseExpression | None:
    """`X` for `X.acquire()`, else None."""
    if (
        isinstance(expr, cst.Call)
        and isinstance(expr.func, cst.Attribute)
        and expr.func.attr.value == "acquire"
    ):
        return expr.func.value
    return None
