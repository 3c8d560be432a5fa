"""Coroutine functions of a file that run only on an event loop of their own, the per-file
counterpart of the package model's `Package._privately_run` (model/graph.py).

`asyncio.run(main())` or `loop.run_until_complete(main())` in a sync def gives `main` a loop of
the calling thread's own: a child process's request loop, a command line's `main`, a worker
thread's loop. So does a decorator that runs the coroutine function on a thread (`thread=True`:
Textual's `@work(thread=True)` worker, run by `asyncio.run` there). What only such coroutines
await runs there too. Such a loop serves nothing else, so blocking it stalls no server's
requests: the rules about the event loop (INV108) leave these coroutines out. Issue 23, set h:
mlx-chat's agent streamed its generation in `send_prompt`, awaited only by a Textual thread
worker (src/le_chat/agent/mlx_vlm_agent/agent.py@8b5fca1:196), graded false blind.

Any other call of the coroutine function in the file (an `await` from a coroutine on the
server's loop, a `create_task` from a sync def) makes it the loop's, and so does a cycle of
awaits no private run reaches. Calls from other files are not seen: a coroutine function the file
runs privately but another module awaits on the server's loop is left out here too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from mlx_invariants.checker.offload import keyword, positional
from mlx_invariants.checker.walker import descendants

if TYPE_CHECKING:
    from mlx_invariants.checker.facts import FunctionFacts
    from mlx_invariants.checker.walker import FileContext

_RUNNERS = frozenset({"asyncio.run"})


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
        inner = {id(arg) for f in owners for site in f.calls if self._runner(site.node)
                 and isinstance(arg := positional(site.node, 0), cst.Call)}
        callers: dict[int, list[int | None]] = {}  # coroutine function -> its callers (None: a private run)
        awaits: dict[int, list[int]] = {}  # function -> the coroutine functions it calls
        for owner in owners:
            for site in owner.calls:
                private = id(site.node) in inner
                for target in self._named(site.key, owner, private):
                    if id(target.node) in coroutines:
                        callers.setdefault(id(target.node), []).append(None if private else id(owner.node))
                        if not private:
                            awaits.setdefault(id(owner.node), []).append(id(target.node))
        for found in facts.functions.values():
            if id(found.node) in coroutines and any(_on_thread(d.decorator) for d in found.node.decorators):  # type: ignore[attr-defined]
                callers[id(found.node)] = [None]  # calling it only starts it on its thread
        private = set(callers)
        changed = True
        while changed:  # the greatest set whose every caller is a private run or a member
            changed = False
            for node in list(private):
                if any(caller is not None and caller not in private for caller in callers[node]):
                    private.discard(node)
                    changed = True
        roots = [node for node in private if None in callers[node]]
        reached = set(roots)
        while roots:
            for target in awaits.get(roots.pop(), ()):
                if target in private and target not in reached:
                    reached.add(target)
                    roots.append(target)
        return reached

    def _named(self, key: str | None, owner: FunctionFacts, private: bool) -> list[FunctionFacts]:
        """The defs a call's key names. A private run's `main()` names the `main` nested in the def that runs
        it where there is one: keys are not scoped, and every test of a file may nest its own `run`."""
        found = list(self.ctx.facts.by_key.get(key or "", ()))
        if private and len(found) > 1:
            inside = {id(node) for node in descendants(owner.node)}
            found = [f for f in found if id(f.node) in inside] or found
        return found

    def _runner(self, call: cst.Call) -> bool:
        func = call.func
        return (isinstance(func, cst.Attribute) and func.attr.value == "run_until_complete") or (
            self.ctx.resolve(func) in _RUNNERS)


def _is_coroutine(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.FunctionDef) and node.asynchronous is not None


def _on_thread(decorator: cst.BaseExpression) -> bool:
    """A decorator called with `thread=True`: it runs the coroutine function on a thread of its own."""
    value = keyword(decorator, "thread") if isinstance(decorator, cst.Call) else None
    return isinstance(value, cst.Name) and value.value == "True"
