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

A coroutine that starts its server itself counts up to the statement that first calls the serve
call (`await server.serve()` on a `uvicorn.Server`, hypercorn's `serve(app, config)`, or either
handed to `create_task`/`gather`): the server answers no one before that call, so the
preparations above it (a preload, a warm-up) run alone. Issue 23's blind review graded a
preload awaited there arguable (flowtailor-de/live-translation src/main.py@472081f:232-300). The
span ends above the statement, not the call's line (`gather(to_thread(warm), server.serve())`
warms up while serving), and above the outermost loop around it (a restart loop runs its top
again after serving). Only these serve calls count, by what they resolve to: a method merely
named `serve` may serve already.

What such a span awaits plainly runs at start-up too, transitively (model/cancel.py,
`Cancellers.at_startup`).
"""

from __future__ import annotations

LIFESPAN = "lifespan"  # start-up until the first `yield`
STARTUP = "startup"    # the whole body
# What a server's serve call resolves to (model/collect.py): uvicorn's `Server(config).serve()`, hypercorn's `serve()`.
SERVES = frozenset({"uvicorn.Server().serve", "uvicorn.server.Server().serve", "uvicorn.main.Server().serve",
                    "hypercorn.asyncio.serve", "hypercorn.trio.serve"})


def startup_kind(name: str, decorators: list[tuple[str, str | None]]) -> str | None:
    """LIFESPAN, STARTUP or None for an async def called `name` with `decorators`, each as (dotted name of
    the decorator or of the call's callee, the call's first argument when it is a string, else None)."""
    lasts = [(dotted.rsplit(".", 1)[-1], argument) for dotted, argument in decorators]
    if any(last == "on_event" and argument == "startup" for last, argument in lasts):
        return STARTUP
    if LIFESPAN in name.lower() and all(last == "asynccontextmanager" for last, _ in lasts):
        return LIFESPAN  # up to its first `yield`: one without a yield is no lifespan (the caller checks)
    return None
