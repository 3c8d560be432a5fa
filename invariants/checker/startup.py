"""Coroutines that run before a server serves: its lifespan's start-up half and its start-up hooks.

Blocking the event loop there starves no request, because none is being served yet: an
ASGI server runs the lifespan's code up to its `yield` (and the `startup` event handlers)
before it answers anyone. MLX work there (loading, warming up, a probe) is what start-up is
for. Issue 23's blind review of ten MLX servers the rules had not been refined on graded the
loop-blocking findings inside a lifespan before its `yield` arguable every time (vmlx
server.py@3e256e3:1340, Rapid-MLX server.py@7222ca7:760-761).

Recognised by name, as frameworks spell them: an async generator whose name says `lifespan`
(FastAPI's and Starlette's `lifespan=` parameter, by convention), plain (Starlette wraps it) or
decorated with `asynccontextmanager`, counts up to its first `yield`; an `async def` decorated
with `<app>.on_event("startup")` counts whole. The shutdown half after the `yield` still serves
nothing, but it is where teardown races live (closing what a worker still uses), so it is
judged like any other code.
"""

from __future__ import annotations

LIFESPAN = "lifespan"  # start-up until the first `yield`
STARTUP = "startup"    # the whole body


def startup_kind(name: str, decorators: list[tuple[str, str | None]]) -> str | None:
    """LIFESPAN, STARTUP or None for an async def called `name` with `decorators`, each as (dotted name of
    the decorator or of the call's callee, the call's first argument when it is a string, else None)."""
    lasts = [(dotted.rsplit(".", 1)[-1], argument) for dotted, argument in decorators]
    if any(last == "on_event" and argument == "startup" for last, argument in lasts):
        return STARTUP
    if LIFESPAN in name.lower() and all(last == "asynccontextmanager" for last, _ in lasts):
        return LIFESPAN  # up to its first `yield`: one without a yield is no lifespan (the caller checks)
    return None
