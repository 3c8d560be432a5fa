"""Coroutine functions of a file that run only on an event loop of their own, the per-file
counterpart of the package model's `Package._privately_run` (model/graph.py).

A decorator that runs the coroutine function on a thread (called with `thread=True`: Textual's
`@work(thread=True)` worker, which runs it with `asyncio.run` there) gives it a loop that serves
that worker alone, and so do the coroutines only such workers await. Blocking that loop stalls
no server's requests: INV108 leaves these coroutines out. `asyncio.run(main())` itself is no such
sign: the loop it makes is often the server's own (smg's gRPC servicer serves on the loop of
`asyncio.run(serve_grpc(args))`, grpc_servicer/smg_grpc_servicer/mlx/server.py@fbe2497:200, the
corpus's S2a, lost while such runs counted).

Any other call of the coroutine function in the file (an `await` from a coroutine on the
server's loop, a `create_task` from a sync def) makes it the loop's, and so does a cycle of
awaits no worker reaches. Calls from other files are not seen here; the package model sees them
(issue 23, set h: mlx-chat's `send_prompt`, awaited only by a Textual worker in another module,
src/le_chat/agent/mlx_vlm_agent/agent.py@8b5fca1:196, is still reported by this rule).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from mlx_invariants.checker.offload import keyword
from mlx_invariants.checker.worker_loops import on_worker_loops

if TYPE_CHECKING:
    from mlx_invariants.checker.walker import FileContext


class PrivateLoops:
    """Asked once per file, after the walk: `runs_alone(function)`."""

    def __init__(self, ctx: FileContext) -> None:
        self.ctx = ctx
        self._found: set[int] | None = None

    def runs_alone(self, function: cst.CSTNode | None) -> bool:
        """`function` is a coroutine function of this file that runs only on a loop of its own."""
        if function is None:
            return False
        if self._found is None:
            self._found = self._privately_run()
        return id(function) in self._found

    def _privately_run(self) -> set[int]:
        facts = self.ctx.facts
        owners = [f for f in (facts.module_calls, *facts.functions.values()) if f is not None]
        coroutines = {id(f.node) for f in facts.functions.values() if _is_coroutine(f.node)}
        if not coroutines:
            return set()
        callers: dict[int, list[int | None]] = {}  # coroutine function -> its callers (None: started on its thread)
        awaits: dict[int, list[int]] = {}  # function -> the coroutine functions it calls
        for owner in owners:
            for site in owner.calls:
                for target in facts.by_key.get(site.key or "", ()):
                    if id(target.node) in coroutines:
                        callers.setdefault(id(target.node), []).append(id(owner.node))
                        awaits.setdefault(id(owner.node), []).append(id(target.node))
        for found in facts.functions.values():
            if id(found.node) in coroutines and any(_on_thread(d.decorator) for d in found.node.decorators):  # type: ignore[attr-defined]
                callers[id(found.node)] = [None]  # calling it only starts it on its thread
        return on_worker_loops(callers, lambda node: awaits.get(node, ()))


def _is_coroutine(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.FunctionDef) and node.asynchronous is not None


def _on_thread(decorator: cst.BaseExpression) -> bool:
    """A decorator called with `thread=True`: it runs the coroutine function on a thread of its own."""
    value = keyword(decorator, "thread") if isinstance(decorator, cst.Call) else None
    return isinstance(value, cst.Name) and value.value == "True"
