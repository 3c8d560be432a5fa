from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from mlx_invariants.checker import mlx_api
from mlx_invariants.checker.facts import CallSite, FunctionFacts
from mlx_invariants.checker.names import dotted, terminal
from mlx_invariants.checker.offload import HANDOFF_NAMES, Handoff, forwarded_handoff, handoff, unwrap_callable
from mlx_invariants.checker.rule import Invalid, Rule, Valid
from mlx_invariants.checker.walker import OWN_BODY_STOP, descendants

# A loop body that reads a name with one of these parts looks at a stop signal.
_STOP_WORDS = ("cancel", "abort", "stop", "interrupt", "disconnect", "is_set", "shutdown", "should_")


@dataclass
class _Loop:
    node: cst.For
    statement: cst.CSTNode | None


class WorkerLoopIgnoresCancel(Rule):
    """Cancelling a coroutine does not stop the thread it handed work to. When the
    work is a decode loop (one model step per token, up to max_tokens), a client
    that disconnects, or a request that times out, leaves the worker generating
    every remaining token: the GPU, the generation lock and the memory stay taken
    for a request nobody waits for, and the next request queues behind it. The
    loop has to look at a stop signal each step (an Event the awaiting coroutine
    sets from its CancelledError handler, or a cancel callback), and the handoff
    has to say how to set it. vllm-mlx's SpecPrefill path handed `_run_all` to
    the serialized worker with decode loops that never checked anything
    (engine/simple.py@38999c8:773 and :806), fixed in 122213b with a cancel event
    checked every step and an `on_cancel` hook on the handoff."""

    id = "INV121"
    catches = "a decode loop handed to a worker thread from async code that never checks for cancellation"
    message = (
        "this loop generates on a worker thread ({how} in `{coroutine}`) and checks no stop signal: cancelling "
        "`{coroutine}` leaves it generating every remaining token; test a cancel Event each step and set it "
        "from the coroutine's CancelledError handler (or pass a cancel hook)"
    )
    known_problems = (
        "A decode loop is a `for` over an MLX generator (stream_generate, a model's stream_chat) or any `for` "
        "whose body runs a generation step, in the handed-over callable or a def of this file it calls. A "
        "stop check is any name in the loop body containing cancel, abort, stop, interrupt, disconnect, "
        "is_set, shutdown or should_; a handoff passing a keyword named like one (`on_cancel=`) counts as "
        "wired. A worker started from sync code, or a `while` loop, is not judged."
    )
    triggers = (("async",), ("to_thread", "run_in_executor", "submit", "run_sync", "_serialized", "blocking"))

    INVALID = [
        Invalid('''
            import asyncio
            from concurrent.futures import ThreadPoolExecutor

            class SimpleEngine:
                def __init__(self):
                    self._mlx_executor = ThreadPoolExecutor(max_workers=1)

                async def _run_serialized(self, func, *args):
                    async with self._generation_lock:
                        return await self._owner_executor_run(func, *args)

                async def _owner_executor_run(self, func, *args):
                    loop = asyncio.get_running_loop()
                    return await loop.run_in_executor(self._mlx_executor, lambda: func(*args))

                async def stream_generate(self, prompt, max_tokens):
                    def run_all():
                        results = []
                        for chunk in self._model.stream_generate(prompt, max_tokens=max_tokens):  # expect: INV121
                            results.append(chunk.text)
                        return results

                    for text in await self._run_serialized(run_all):
                        yield text
        '''),
    ]
    VALID = [
        Valid('''
            import asyncio
            from concurrent.futures import ThreadPoolExecutor
            import threading

            class SimpleEngine:
                def __init__(self):
                    self._mlx_executor = ThreadPoolExecutor(max_workers=1)

                async def _run_serialized(self, func, *args, on_cancel=None):
                    async with self._generation_lock:
                        return await self._owner_executor_run(func, *args)

                async def _owner_executor_run(self, func, *args):
                    loop = asyncio.get_running_loop()
                    return await loop.run_in_executor(self._mlx_executor, lambda: func(*args))

                async def stream_generate(self, prompt, max_tokens):
                    cancel_requested = threading.Event()

                    def run_all():
                        results = []
                        for chunk in self._model.stream_generate(prompt, max_tokens=max_tokens):
                            if cancel_requested.is_set():
                                break
                            results.append(chunk.text)
                        return results

                    for text in await self._run_serialized(run_all, on_cancel=cancel_requested.set):
                        yield text
        '''),
        Valid('''
            import asyncio
            from concurrent.futures import ThreadPoolExecutor

            class SimpleEngine:
                def __init__(self):
                    self._mlx_executor = ThreadPoolExecutor(max_workers=1)

                async def _run_serialized(self, func, *args, on_cancel=None):
                    loop = asyncio.get_running_loop()
                    return await loop.run_in_executor(self._mlx_executor, lambda: func(*args))

                async def stream_generate(self, prompt, max_tokens, progress):
                    def run_all():
                        results = []
                        for chunk in self._model.stream_generate(prompt, max_tokens=max_tokens, progress=progress):
                            results.append(chunk.text)
                        return results

                    for text in await self._run_serialized(run_all, on_cancel=progress.halt):
                        yield text
        '''),
    ]

    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        self.loops: dict[int, list[_Loop]] = {}
        self.awaited: set[int] = set()
        self.handoffs: list[tuple[cst.Call, str, int]] = []  # handoffs in async defs: coroutine name and node id
        self.parents: dict[int, int] = {}  # def or lambda -> the def it is nested in

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.parents[id(node)] = id(self.ctx.scope.top.node)

    def visit_Lambda(self, node: cst.Lambda) -> None:
        self.parents[id(node)] = id(self.ctx.scope.top.node)

    def visit_Await(self, node: cst.Await) -> None:
        self.awaited.add(id(node.expression))

    def visit_For(self, node: cst.For) -> None:
        if node.asynchronous is None:
            self.ctx.pin(node.iter)
            self.loops.setdefault(id(self.ctx.scope.top.node), []).append(_Loop(node, self.ctx.statement))

    def visit_Call(self, node: cst.Call) -> None:
        if self.ctx.in_async:
            frame = self.ctx.scope.top
            self.handoffs.append((node, frame.name, id(frame.node)))
            for arg in node.args:
                if isinstance(arg.value, cst.Name | cst.Attribute):
                    self.ctx.pin(arg.value)

    def end(self) -> None:
        reported: set[int] = set()
        for call, coroutine, where in self.handoffs:
            work = self._handoff(call)
            if work is None or _wired(call):
                continue
            target = unwrap_callable(work.target, self.ctx)
            if target is None:
                continue
            how = f"handed over by `{dotted(call.func) or work.how}`"
            for loop in self._decode_loops(self._closure(target, where)):
                if id(loop.node) not in reported:
                    reported.add(id(loop.node))
                    message = self.message.format(how=how, coroutine=coroutine)
                    self.ctx.report_at(self.id, loop.node, loop.statement, message)

    def _handoff(self, call: cst.Call) -> Handoff | None:
        if terminal(call.func) in HANDOFF_NAMES:
            return handoff(call, self.ctx)
        return forwarded_handoff(call, self.ctx)

    def _closure(self, target: cst.BaseExpression, where: int) -> list[FunctionFacts]:
        """The handed-over callable and the defs of this file it calls, nested defs resolved in scope."""
        if isinstance(target, cst.Lambda):
            roots = [f for f in [self.ctx.function_facts(target)] if f is not None]
        else:
            roots = self._in_scope(self.ctx.key(target), where)
        seen: dict[int, FunctionFacts] = {}
        stack = roots
        while stack:
            current = stack.pop()
            if id(current.node) in seen:
                continue
            seen[id(current.node)] = current
            for site in current.calls:
                stack.extend(self._in_scope(site.key, id(current.node)))
        return list(seen.values())

    def _in_scope(self, key: str | None, where: int) -> list[FunctionFacts]:
        """Defs named `key`; for a plain name, the ones nested in `where` or around it, if there are such.

        Nested defs are known by their bare name, so two methods' `_run_all` share a key.
        """
        found = list(self.ctx.facts.by_key.get(key or "", ()))
        if len(found) < 2 or "." in (key or ""):
            return found
        around = {where}
        while where in self.parents:
            where = self.parents[where]
            around.add(where)
        near = [f for f in found if self.parents.get(id(f.node)) in around]
        return near or found

    def _decode_loops(self, functions: list[FunctionFacts]) -> list[_Loop]:
        found = []
        for function in functions:
            for loop in self.loops.get(id(function.node), ()):
                if self._generates(loop.node, function) and not _checks_stop(loop.node):
                    found.append(loop)
        return found

    def _generates(self, loop: cst.For, function: FunctionFacts) -> bool:
        if mlx_api.is_mlx_generator(loop.iter, self.ctx):
            return True
        body = {id(n) for n in descendants(loop.body, OWN_BODY_STOP) if isinstance(n, cst.Call)}
        return any(id(site.node) in body and self._steps(site) for site in function.calls)

    def _steps(self, site: CallSite) -> bool:
        """A generation step: blocking MLX, or calling the model (`model(y)`, `self._model(...)`)."""
        if mlx_api.runs_mlx(site, self.ctx, loads=False):
            return True
        return isinstance(site.node.func, cst.Name | cst.Attribute) and mlx_api.is_model(site.node.func, self.ctx)


def _wired(call: cst.Call) -> bool:
    """The handoff passes something named like a cancel hook (`on_cancel=...`)."""
    return any(arg.keyword is not None and _stop_word(arg.keyword.value) for arg in call.args)


def _stop_word(text: str) -> bool:
    low = text.lower()
    return any(word in low for word in _STOP_WORDS)


def _checks_stop(loop: cst.For) -> bool:
    for node in descendants(loop.body, OWN_BODY_STOP):
        if isinstance(node, cst.Name) and _stop_word(node.value):
            return True
        if isinstance(node, cst.Attribute) and _stop_word(node.attr.value):
            return True
    return False
