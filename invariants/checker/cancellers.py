"""Who cancels a coroutine, and which `except` catches it.

Several rules ask the same two questions about cancellation. Whether a handler
catches it: since Python 3.8 `asyncio.CancelledError` is a `BaseException`, so
`except Exception` lets it through and only a bare `except`, `except BaseException`
or one naming CancelledError stops it. And whether anything but the server's
shutdown cancels a coroutine at all: an HTTP route handler that answers with one
response is not cancelled when its client disconnects (uvicorn, hypercorn and
Starlette/FastAPI let it run to its end), and start-up (checker/startup.py) runs
before anyone is served. Work a coroutine leaves undone when only the shutdown
cancels it is left undone by a process that is exiting.
"""

from __future__ import annotations

import libcst as cst

from mlx_invariants.checker.names import dotted, terminal
from mlx_invariants.checker.startup import startup_kind
from mlx_invariants.checker.walker import descendants

CANCELLED = frozenset({
    "asyncio.CancelledError", "asyncio.exceptions.CancelledError", "concurrent.futures.CancelledError",
})
# `@app.post(...)`, `@router.get(...)`: a handler the web framework calls once per HTTP request.
ROUTE_DECORATORS = frozenset({"get", "post", "put", "patch", "delete", "head", "options", "api_route", "route"})
# Calls that put a deadline on what they surround (a deadline cancels the await like a disconnect would).
DEADLINES = ("timeout", "timeout_at", "wait_for", "move_on_after", "fail_after", "move_on_at", "fail_at")


def caught(kind: cst.BaseExpression | None, ctx) -> list[str]:
    """The names an `except` clause's type names (`except (A, b.C):`), qualified through the imports where
    they resolve, else as written; none for a bare `except:`, which each caller judges for itself."""
    if kind is None:
        return []
    kinds = [e.value for e in kind.elements] if isinstance(kind, cst.Tuple) else [kind]
    return [ctx.resolve(k) or dotted(k) or "" for k in kinds]


def catches_cancellation(handler: cst.ExceptHandler, ctx) -> bool:
    """`except:`, `except BaseException`, or an except naming CancelledError."""
    if handler.type is None:
        return True
    return any(qual in CANCELLED or qual == "BaseException" or qual.endswith("CancelledError")
               for qual in caught(handler.type, ctx))


# The timeouts a deadline raises (`wait_for`, `asyncio.timeout`, a future's `result(timeout)`), as `caught` names them.
TIMEOUTS = frozenset({"TimeoutError", "asyncio.TimeoutError", "asyncio.exceptions.TimeoutError",
                      "builtins.TimeoutError", "concurrent.futures.TimeoutError"})


def catches_timeout(handler: cst.ExceptHandler, ctx) -> bool:
    """An except naming a timeout (`except asyncio.TimeoutError:`)."""
    return any(qual in TIMEOUTS for qual in caught(handler.type, ctx))


def decorator_parts(expr: cst.BaseExpression) -> tuple[str, str | None]:
    """(the decorator's dotted name, or its call's callee's; the call's first argument if a plain string)."""
    if isinstance(expr, cst.Call):
        first = expr.args[0].value if expr.args else None
        text = first.evaluated_value if isinstance(first, cst.SimpleString) else None
        return dotted(expr.func) or "", text if isinstance(text, str) else None
    return dotted(expr) or "", None


def plain_route(function: cst.CSTNode | None) -> bool:
    """An HTTP route handler that answers with one response: decorated as a route, not a generator, and with
    no deadline of its own. ASGI servers (uvicorn, hypercorn) and Starlette/FastAPI do not cancel such a
    handler when its client disconnects; it runs to its end, so only the server's shutdown cancels it."""
    if not isinstance(function, cst.FunctionDef) or function.asynchronous is None:
        return False
    if not any(isinstance(d.decorator, cst.Call) and isinstance(d.decorator.func, cst.Attribute)
               and d.decorator.func.attr.value in ROUTE_DECORATORS for d in function.decorators):
        return False
    for node in descendants(function.body, (cst.FunctionDef, cst.Lambda)):
        if isinstance(node, cst.Yield):
            return False
        if isinstance(node, cst.Call) and (terminal(node.func) or "") in DEADLINES:
            return False
    return True


def shutdown_only(function: cst.FunctionDef) -> bool:
    """Only the server's shutdown cancels `function`: a plain route handler, or a start-up coroutine (a
    lifespan, both halves: its teardown runs as the process exits, or an `on_event("startup")` hook)."""
    if function.asynchronous is None:
        return False
    return plain_route(function) or startup_kind(
        function.name.value, [decorator_parts(d.decorator) for d in function.decorators]) is not None
