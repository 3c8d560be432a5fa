from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from mlx_invariants.checker import mlx_api
from mlx_invariants.checker.facts import CallSite
from mlx_invariants.checker.names import dotted
from mlx_invariants.checker.offload import Handoff, handoff, is_owner_executor, unwrap_callable
from mlx_invariants.checker.rule import Invalid, Rule, Valid


@dataclass
class _Candidate:
    work: Handoff
    target: cst.BaseExpression
    statement: cst.CSTNode | None


class MlxOffOwnerThread(Rule):
    """MLX work belongs to one owner thread. mlx-lm's generation stream is
    thread-local, so on any other thread `mx.eval` fails with "There is no
    Stream(gpu, 1) in current thread"; and the default pool runs each call on
    whichever thread is free, so two requests can be inside Metal at once. Hand
    MLX work to the owner: a dedicated long-lived thread fed by a queue (the
    recommended pattern, never flagged), or an executor with exactly one thread
    listed in owner-executors."""

    id = "INV107"
    catches = "MLX work handed to asyncio.to_thread, the default pool, or a non-owner executor"
    message = "`{target}` reaches MLX ({what}) on {where}: send it to the owner thread or a configured owner executor"
    known_problems = (
        "Follows the callable into functions and methods of the same file only; a model call is "
        "recognised by name (model-names) in files that import mlx. An executor created elsewhere is "
        "unknown and counts as not an owner until listed in owner-executors. A one-worker pool built in "
        "this file is an owner wherever it is used under the name, attribute or mapping key it was "
        "assigned to (`app[MLX] = ThreadPoolExecutor(1)` makes `request.app[MLX]` an owner, whichever "
        "object holds the mapping, so two mappings that reuse one key for different pools are confused)."
    )
    triggers = (("to_thread", "run_in_executor", "submit", "run_sync"), ("mlx",))

    INVALID = [
        Invalid('''
            import asyncio
            import mlx.core as mx

            async def evaluate(logits):
                return await asyncio.to_thread(lambda: mx.eval(logits))  # expect: INV107
        '''),
        Invalid('''
            import asyncio
            from mlx_lm import stream_generate

            class Engine:
                def _run(self, prompt):
                    return list(stream_generate(self.model, self.tokenizer, prompt))

                async def generate(self, prompt):
                    loop = asyncio.get_running_loop()
                    return await loop.run_in_executor(None, self._run, prompt)  # expect: INV107
        '''),
        Invalid('''
            import asyncio
            from concurrent.futures import ThreadPoolExecutor
            from mlx_lm import load, stream_generate

            POOL = "pool"

            def make_app(app, path):
                app[POOL] = ThreadPoolExecutor(4)

            async def on_startup(app, path):
                loop = asyncio.get_running_loop()
                app["model"] = await loop.run_in_executor(app[POOL], load, path)  # expect: INV107

            def run(model, tokenizer, prompt):
                return list(stream_generate(model, tokenizer, prompt))

            async def completions(request, prompt):
                loop = asyncio.get_running_loop()
                model, tokenizer = request.app["model"]
                return await loop.run_in_executor(request.app[POOL], run, model, tokenizer, prompt)  # expect: INV107
        '''),
    ]
    VALID = [
        Valid('''
            import asyncio
            import mlx.core as mx

            async def evaluate(owner, logits):
                return await owner.submit(lambda: mx.eval(logits))
        ''', options={"owner-executors": ["owner"]}),
        Valid('''
            import asyncio
            from concurrent.futures import ThreadPoolExecutor
            from mlx_lm import stream_generate

            class Engine:
                def __init__(self):
                    self._mlx_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlx-owner")

                def _run(self, prompt):
                    return list(stream_generate(self.model, self.tokenizer, prompt))

                async def generate(self, prompt):
                    loop = asyncio.get_running_loop()
                    return await loop.run_in_executor(self._mlx_executor, self._run, prompt)
        '''),
        Valid('''
            import threading
            from mlx_lm import stream_generate

            class Engine:
                def start(self):
                    self._owner = threading.Thread(target=self._owner_loop, name="mlx-owner", daemon=True)
                    self._owner.start()

                def _owner_loop(self):
                    for request in iter(self._inbox.get, None):
                        for response in stream_generate(self.model, self.tokenizer, request.prompt):
                            self._loop.call_soon_threadsafe(request.queue.put_nowait, response)
        '''),
        Valid('''
            import asyncio
            import json

            async def save(path, data):
                await asyncio.to_thread(lambda: path.write_text(json.dumps(data)))
        '''),
        Valid('''
            import asyncio
            from concurrent.futures import ThreadPoolExecutor
            from mlx_lm import load, stream_generate

            MLX = "mlx"

            def make_app(app, path):
                app[MLX] = ThreadPoolExecutor(1, thread_name_prefix="mlx")  # the one thread that owns MLX

            async def on_startup(app, path):
                loop = asyncio.get_running_loop()
                app["model"] = await loop.run_in_executor(app[MLX], load, path)

            def run(model, tokenizer, prompt):
                return list(stream_generate(model, tokenizer, prompt))

            async def completions(request, prompt):
                loop = asyncio.get_running_loop()
                model, tokenizer = request.app["model"]
                return await loop.run_in_executor(request.app[MLX], run, model, tokenizer, prompt)
        '''),
    ]

    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        self.candidates: list[_Candidate] = []

    def visit_Call(self, node: cst.Call) -> None:
        work = handoff(node, self.ctx)
        if work is None:
            return
        target = unwrap_callable(work.target, self.ctx)
        if target is None:
            return
        self.ctx.pin(target, work.executor)
        self.candidates.append(_Candidate(work, target, self.ctx.statement))

    def end(self) -> None:
        for candidate in self.candidates:
            work = candidate.work
            if is_owner_executor(work.executor, self.ctx):
                continue
            what = self._reaches(candidate.target)
            if what is None:
                continue
            if work.executor is None:
                where = f"the default thread pool via {work.how} (a different thread each call)"
            else:
                where = f"`{dotted(work.executor) or 'an executor'}`, which is not a configured owner executor"
            label = dotted(candidate.target) or ("lambda" if isinstance(candidate.target, cst.Lambda) else "callable")
            message = self.message.format(target=label, what=what, where=where)
            self.ctx.report_at(self.id, work.call, candidate.statement, message)

    def _reaches(self, target: cst.BaseExpression) -> str | None:
        ctx = self.ctx
        direct = lambda site: mlx_api.reaches(site, ctx)  # noqa: E731
        if isinstance(target, cst.Lambda):
            facts = ctx.function_facts(target)
            return ctx.facts.first_reaching(facts, direct) if facts else None
        if isinstance(target, cst.Name | cst.Attribute):
            # Handing over `mx.eval` or `self.model` itself is as good as calling it there.
            probe = CallSite(cst.Call(func=target), ctx.resolve(target), dotted(target), None)
            found = mlx_api.reaches(probe, ctx)
            if found:
                return found
            for function in ctx.facts.by_key.get(ctx.key(target) or "", ()):
                found = ctx.facts.first_reaching(function, direct)
                if found:
                    return found
        return None
