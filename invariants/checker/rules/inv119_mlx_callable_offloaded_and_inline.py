from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import libcst as cst

from mlx_invariants.checker import mlx_api
from mlx_invariants.checker.branches import Arms
from mlx_invariants.checker.facts import CallSite
from mlx_invariants.checker.names import dotted
from mlx_invariants.checker.offload import handoff
from mlx_invariants.checker.rule import Invalid, Rule, Valid


@dataclass
class _Coroutine:
    node: cst.CSTNode
    inline: list[tuple[CallSite, cst.CSTNode | None]] = field(default_factory=list)
    handed: dict[str, str] = field(default_factory=dict)  # callable key -> the call it was handed to
    handoffs: dict[str, list[cst.Call]] = field(default_factory=dict)  # callable key -> every call handing it
    arms: Arms | None = None  # built on first need, once per coroutine


class MlxCallableOffloadedAndInline(Rule):
    """One coroutine that sends an MLX callable to a worker thread in one branch
    and calls it inline on the event loop in another runs the same MLX work on two
    threads. Its arrays and caches are then made on one thread's stream and used
    on the other's ("There is no Stream(gpu, N) in current thread"), and an inline
    call can overlap a worker call still inside Metal. vllm-mlx's `_engine_loop`
    sent `self.scheduler.step` to its executor for prefill and called it inline
    for decode (engine_core.py@4b06de6:188-192, fixed in 0d8c6d1 by always
    stepping on the worker; INV108 reports that one, as it blocks the loop too); `BatchedEngine.start` loaded the model inline on the
    loop in one branch and through the start-up worker in the other while the
    engine stepped on its own worker (engine/batched.py@c65c356:265, fixed in
    ff3669a by loading on the stepping worker). Pick one thread for the callable
    and always use it.

    An inline call and a hand-off in the two arms of one `if`, outside any loop of
    the coroutine and tested on nothing its caller passes in, are a choice made
    once per object: every run takes the same arm, so the work stays on one
    thread. Issue 23: vllm-mlx's HEAD `BatchedEngine.start` (the inline load for
    the MLLM engine, which steps on the loop) was graded a false alarm; the same
    per-engine choice at c65c356:265, the corpus's V13a, whose defect is the load
    and the steps on different threads (which this rule does not judge), is no
    longer reported either."""

    id = "INV119"
    # Opt-in: it detects no corpus case (V13a, its site, is no longer reported) and made no finding on twenty MLX
    # servers' HEADs; its one HEAD finding before was graded false (docs/checker.md, "Where each rule was seen").
    default_enabled = False
    catches = "an MLX callable both handed to a worker and called inline in the same coroutine"
    message = (
        "`{call}()` runs inline on the event loop thread, but this coroutine also hands `{name}` to "
        "`{handoff}`: the same MLX work ({what}) runs on two threads, splitting its arrays and stream between "
        "them; run it on the one worker every time"
    )
    known_problems = (
        "An inline call that blocks the loop with MLX (a generation, a scheduler step) is left to INV108, "
        "which reports it; this rule reports the rest (a load, an array op). "
        "Judges one coroutine at a time: a callable offloaded in one coroutine and called inline in another "
        "is not seen. A choice by an `if` on the object's own state (`self.worker is None`) is taken to be "
        "the same every run; a state that changes between runs splits the work unseen. A callable counts as handed to a worker when it is passed to asyncio.to_thread, "
        "run_in_executor or an executor's submit, or to any awaited call (a project helper such as "
        "`run_blocking_startup_work(fn)`), which is assumed to run it elsewhere. It counts as MLX when it "
        "is a known MLX call (mlx-calls, a model's generate/chat, a loader) or a def of this file that "
        "makes one."
    )
    triggers = (("async",),)

    INVALID = [
        Invalid('''
            import asyncio
            import mlx.core as mx

            class EngineCore:
                def _reset_pool(self):
                    self._pool = mx.zeros_like(self._pool)

                async def _engine_loop(self):
                    loop = asyncio.get_running_loop()
                    while self._running:
                        await loop.run_in_executor(self._step_executor, self._step)
                        if self._under_pressure():
                            await loop.run_in_executor(self._step_executor, self._reset_pool)
                        elif self._idle():
                            self._reset_pool()  # expect: INV119
        ''', options={"owner-executors": ["self._step_executor"]}),
        Invalid('''
            from mlx_lm import load

            class BatchedEngine:
                def prepare_for_start(self):
                    self._model, self._tokenizer = load(self._model_name)

                async def start(self, eager=False):
                    if eager:
                        self.prepare_for_start()  # expect: INV119
                    else:
                        await run_blocking_startup_work(self.prepare_for_start)
        '''),
    ]
    VALID = [
        # The allocator's cache clear is safe on any thread (mlx_facts.py): no MLX work to keep on one.
        Valid('''
            import asyncio
            import mlx.core as mx

            class EngineCore:
                def _free_buffers(self):
                    mx.clear_cache()

                async def _engine_loop(self):
                    loop = asyncio.get_running_loop()
                    while self._running:
                        await loop.run_in_executor(self._step_executor, self._step)
                        if self._under_pressure():
                            await loop.run_in_executor(self._step_executor, self._free_buffers)
                        elif self._idle():
                            self._free_buffers()
        ''', options={"owner-executors": ["self._step_executor"]}),
        Valid('''
            import asyncio
            import mlx.core as mx

            class EngineCore:
                def _reset_pool(self):
                    self._pool = mx.zeros_like(self._pool)

                async def _engine_loop(self):
                    loop = asyncio.get_running_loop()
                    while self._running:
                        await loop.run_in_executor(self._step_executor, self._step)
                        if self._under_pressure() or self._idle():
                            await loop.run_in_executor(self._step_executor, self._reset_pool)
        ''', options={"owner-executors": ["self._step_executor"]}),
        Valid('''
            from mlx_lm import load

            class BatchedEngine:
                def prepare_for_start(self):
                    self._model, self._tokenizer = load(self._model_name)

                async def start(self, eager=False):
                    await run_blocking_startup_work(self.prepare_for_start, executor=self._step_worker)
        '''),
        Valid('''
            import asyncio
            import mlx.core as mx

            class AdapterStore:
                def _apply(self):
                    self.weights = {name: mx.load(path) for name, path in self.paths.items()}

                async def open(self):
                    # Chosen once per store: a store with no worker keeps its arrays on the loop's thread.
                    if self.worker is None:
                        self._apply()
                    else:
                        await asyncio.get_running_loop().run_in_executor(self.worker, self._apply)
        '''),
        Valid('''
            class Engine:
                async def submit(self, request):
                    self._validate(request)
                    await self._queue.put(self._validate)
        '''),
    ]

    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        self.coroutines: dict[int, _Coroutine] = {}
        self.awaited: set[int] = set()

    def visit_Await(self, node: cst.Await) -> None:
        self.awaited.add(id(node.expression))

    def visit_Call(self, node: cst.Call) -> None:
        if not self.ctx.in_async:
            return
        ctx = self.ctx
        here = self.coroutines.setdefault(id(ctx.scope.top.node), _Coroutine(ctx.scope.top.node))
        func = node.func
        awaited = id(node) in self.awaited
        if isinstance(func, cst.Name | cst.Attribute) and not awaited:
            here.inline.append((CallSite(node, ctx.resolve(func), dotted(func), ctx.key(func)), ctx.statement))
        if awaited or handoff(node, ctx) is not None:
            for arg in node.args:
                if isinstance(arg.value, cst.Name | cst.Attribute):
                    key = ctx.key(arg.value)
                    if key:
                        here.handed.setdefault(key, dotted(func) or "a worker")
                        here.handoffs.setdefault(key, []).append(node)

    def end(self) -> None:
        for coroutine in self.coroutines.values():
            for site, statement in coroutine.inline:
                target = coroutine.handed.get(site.key or "")
                if target is None or self._chosen_once(coroutine, site):
                    continue
                if self._found(site, lambda inner: mlx_api.runs_mlx(inner, self.ctx, loads=False)):
                    continue  # blocking MLX on the loop: INV108 reports it
                what = self._found(site, lambda inner: mlx_api.runs_mlx(inner, self.ctx) or mlx_api.reaches(inner, self.ctx))
                if what:
                    message = self.message.format(call=site.text, name=site.text, handoff=target, what=what)
                    self.ctx.report_at(self.id, site.node, statement, message)

    def _chosen_once(self, coroutine: _Coroutine, site: CallSite) -> bool:
        """Every hand-off of the callable is in the other arm of an `if` that picks once per object."""
        if not isinstance(coroutine.node, cst.FunctionDef):
            return False
        if coroutine.arms is None:
            coroutine.arms = Arms(coroutine.node)
        arms = coroutine.arms
        return all(arms.exclusive(site.node, handoff) for handoff in coroutine.handoffs[site.key or ""])

    def _found(self, site: CallSite, direct: Callable[[CallSite], str | None]) -> str | None:
        """What `direct` finds at the call itself, or in the sync def of this file it calls."""
        found = direct(site)
        if found:
            return f"`{found}`"
        facts = self.ctx.facts
        for helper in facts.by_key.get(site.key or "", ()):
            node = helper.node
            if isinstance(node, cst.FunctionDef) and node.asynchronous is None:
                found = facts.first_reaching(helper, direct)
                if found:
                    return f"`{found}` in `{site.text}`"
        return None
