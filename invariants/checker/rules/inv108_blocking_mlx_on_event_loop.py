from __future__ import annotations

import libcst as cst

from mlx_invariants.checker import mlx_api
from mlx_invariants.checker.facts import CallSite
from mlx_invariants.checker.names import dotted
from mlx_invariants.checker.rule import Invalid, Rule, Valid


class BlockingMlxOnEventLoop(Rule):
    """An async def body runs on the event loop. A whole generation, an
    `mx.eval`, or a loop over `stream_generate` there stops every other request,
    health check and disconnect from being served until the GPU finishes; and
    the MLX work runs on the loop's thread instead of the owner thread, so it can
    overlap with the owner's work inside Metal. A `BatchGenerator` built there
    binds its generation stream to the loop thread, and stepping it on the owner
    thread later fails with "There is no Stream(gpu, 1) in current thread". Hand
    the work to the owner thread and await its result."""

    id = "INV108"
    catches = "mlx-lm generation, mx.eval/synchronize or an MLX generator loop in an async def"
    message = "{what} runs MLX on the event loop thread: hand it to the owner thread and await the result"
    known_problems = (
        "Sees direct calls in the async def body only: a sync helper that calls `mx.eval`, called from an "
        "async def, is not followed. `mx.async_eval` and array methods such as `.item()` are not judged."
    )
    triggers = (("async",), ("mlx",))

    INVALID = [
        Invalid('''
            import mlx.core as mx

            async def step(model, tokens):
                logits = model(tokens)
                mx.eval(logits)  # expect: INV108
                return logits
        '''),
        Invalid('''
            from mlx_lm import stream_generate

            async def chat(model, tokenizer, prompt, send):
                for response in stream_generate(model, tokenizer, prompt):  # expect: INV108
                    await send(response.text)
        '''),
        Invalid('''
            from mlx_lm.generate import BatchGenerator

            class Servicer:
                def __init__(self, model):
                    self.batch_generator = BatchGenerator(model)

                async def abort(self, uid):
                    self.batch_generator.remove([uid])  # expect: INV108
        '''),
        Invalid('''
            from mlx_lm.generate import BatchGenerator

            class Engine:
                async def start(self):
                    await self._owner.started()
                    self._owner.generator = BatchGenerator(self._owner.model)  # expect: INV108
        '''),
    ]
    VALID = [
        Valid('''
            import asyncio
            import mlx.core as mx

            async def step(owner, model, tokens):
                logits = model(tokens)
                await owner.run(lambda: mx.eval(logits))
                return logits
        '''),
        Valid('''
            import asyncio
            from mlx_lm import stream_generate

            async def chat(owner, model, tokenizer, prompt, send):
                async for response in owner.stream(lambda: stream_generate(model, tokenizer, prompt)):
                    await send(response.text)
        '''),
        Valid('''
            from mlx_lm.generate import BatchGenerator

            class Servicer:
                def __init__(self, model):
                    self.batch_generator = BatchGenerator(model)

                async def abort(self, uid):
                    self._pending_remove.put_nowait(uid)
        '''),
        Valid('''
            from mlx_lm.generate import BatchGenerator

            class Engine:
                async def start(self):
                    await self._owner.started()
                    await self._owner.run(lambda: BatchGenerator(self._owner.model))
        '''),
        Valid('''
            import mlx.core as mx

            async def step(model, tokens):
                def run():
                    mx.eval(model(tokens))
                return run
        '''),
    ]

    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        self.calls: list[tuple[CallSite, cst.CSTNode | None]] = []
        self.loops: list[tuple[cst.For, cst.CSTNode | None]] = []

    def visit_Call(self, node: cst.Call) -> None:
        if self.ctx.in_async:
            func = node.func
            self.calls.append((CallSite(node, self.ctx.resolve(func), dotted(func), None), self.ctx.statement))

    def visit_For(self, node: cst.For) -> None:
        if self.ctx.in_async and node.asynchronous is None:
            self.ctx.pin(node.iter)
            self.loops.append((node, self.ctx.statement))

    def end(self) -> None:
        for site, statement in self.calls:
            what = mlx_api.blocking(site, self.ctx)
            if what:
                self.ctx.report_at(self.id, site.node, statement, self.message.format(what=f"`{what}`"))
        for loop, statement in self.loops:
            if mlx_api.is_mlx_generator(loop.iter, self.ctx):
                text = dotted(loop.iter.func) if isinstance(loop.iter, cst.Call) else dotted(loop.iter)
                what = f"iterating `{text or 'an MLX generator'}`"
                self.ctx.report_at(self.id, loop, statement, self.message.format(what=what))
