from __future__ import annotations

import libcst as cst

from mlx_invariants.checker import mlx_api
from mlx_invariants.checker.facts import CallSite, FunctionFacts
from mlx_invariants.checker.globs import matches_name
from mlx_invariants.checker.rule import Invalid, Rule, Valid

# mlx.core calls that choose the stream the calling thread encodes on.
_STREAM_CALLS = frozenset({"mlx.core.stream", "mlx.core.new_stream", "mlx.core.set_default_stream"})


class StreamBindingSkipped(Rule):
    """MLX streams are per thread: a thread that never bound mlx-lm's generation
    stream fails its first step with "There is no Stream(gpu, N) in current
    thread". Engines that step the model on more than one thread therefore bind
    the streams at the top of every path that steps it (`bind_generation_streams()`
    before `scheduler.step()`). When every other path of a file does that and one
    does not, that path fails on whichever thread calls it: vllm-mlx's
    `EngineCore.generate_batch_sync` stepped the scheduler on the caller's thread
    with no binding while the engine loop's worker bound first (engine_core.py
    @8a244c3:594, fixed in da1189a by binding before the loop)."""

    id = "INV118"
    # Opt-in: no real site is reported by it (its one, vllm-mlx da1189a, is in a def nothing in the package names),
    # and it made no finding on twenty MLX servers' HEADs (docs/checker.md, "Where each rule was seen").
    default_enabled = False
    catches = "an MLX step in a def that skips the stream binding the file's other paths to the same step do"
    message = (
        "`{step}` runs MLX on whatever thread calls `{function}`, which never binds the generation streams "
        "the way `{other}` does before the same step: on a thread that has not bound them MLX fails with "
        "\"There is no Stream(gpu, N) in current thread\"; bind first ({binder}) or run it on the owner thread"
    )
    known_problems = (
        "Judges the engine's own steps (a scheduler step, a model's generate/chat, a batch generator's "
        "insert/remove/next), not raw `mx.eval`, which library code leaves to its callers to bind. "
        "Compares the defs of one file: a step whose binding paths live in another module is not judged. A "
        "def passed somewhere as a callable, or called from a def that binds, counts as bound (the receiver "
        "may bind for it); a binding is a call named like stream-binders or `mx.stream`/`mx.new_stream`/"
        "`mx.set_default_stream`, made in the def or in a def of this file it calls, anywhere in its body."
    )
    triggers = (("stream",),)

    INVALID = [
        Invalid('''
            from .mlx_streams import bind_generation_streams

            class EngineCore:
                def _step_on_worker(self):
                    bind_generation_streams()
                    return self.scheduler.step()

                def generate_batch_sync(self, requests):
                    for request in requests:
                        self.scheduler.add_request(request)
                    outputs = []
                    while self.scheduler.has_requests():
                        outputs.append(self.scheduler.step())  # expect: INV118
                    return outputs
        '''),
    ]
    VALID = [
        Valid('''
            from .mlx_streams import bind_generation_streams

            class EngineCore:
                def _step_on_worker(self):
                    bind_generation_streams()
                    return self.scheduler.step()

                def generate_batch_sync(self, requests):
                    for request in requests:
                        self.scheduler.add_request(request)
                    bind_generation_streams()
                    outputs = []
                    while self.scheduler.has_requests():
                        outputs.append(self.scheduler.step())
                    return outputs
        '''),
        Valid('''
            from .mlx_streams import bind_generation_streams

            class Engine:
                def _run_bound(self, func):
                    bind_generation_streams()
                    return func()

                def _decode(self, prompt):
                    return self._model.generate(prompt)

                def generate(self, prompt):
                    self._run_bound(self._first_token)
                    return self._executor.submit(self._run_bound, lambda: self._decode(prompt))

                def _first_token(self):
                    bind_generation_streams()
                    return self._model.generate("warm-up")
        '''),
    ]

    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        self.passed: set[str] = set()  # keys of names and attributes handed to a call as values

    def visit_Call(self, node: cst.Call) -> None:
        for arg in node.args:
            if isinstance(arg.value, cst.Name | cst.Attribute):
                key = self.ctx.key(arg.value)
                if key:
                    self.passed.add(key)

    def end(self) -> None:
        facts = self.ctx.facts
        functions = [f for f in facts.functions.values() if isinstance(f.node, cst.FunctionDef)]
        if not any(self._binder(s) for f in functions for s in f.calls):
            return  # nothing here binds streams: no path to compare with
        # Steps each def makes itself: {step text: [(def, site)]}.
        steps: dict[str, list[tuple[FunctionFacts, CallSite]]] = {}
        for function in functions:
            for site in function.calls:
                what = mlx_api.blocking(site, self.ctx)
                # Raw `mx.eval` is everywhere in library code that leaves binding to its callers.
                if what and site.text and not (site.qual or "").startswith("mlx.core."):
                    steps.setdefault(site.text, []).append((function, site))
        if not steps:
            return
        binder = {id(f.node): facts.first_reaching(f, self._binder) for f in functions}
        bound = self._bound(functions, binder)
        for text, users in steps.items():
            binding = [f for f, _ in users if binder[id(f.node)]]
            if not binding:
                continue
            other = binding[0]
            for function, site in users:
                node = function.node
                if id(node) in bound or node.asynchronous is not None:  # type: ignore[attr-defined]
                    continue
                message = self.message.format(
                    step=text, function=function.key, other=other.key, binder=f"`{binder[id(other.node)]}()`"
                )
                self.ctx.report_at(self.id, site.node, None, message)

    def _binder(self, site: CallSite) -> str | None:
        if site.qual in _STREAM_CALLS or matches_name(site.text, self.opts["stream-binders"]):
            return site.text
        return None

    def _bound(self, functions: list[FunctionFacts], binder: dict[int, str | None]) -> set[int]:
        """Defs that bind, are handed on as callables, or are called from such a def (transitively)."""
        facts = self.ctx.facts
        bound = {id(f.node) for f in functions if binder[id(f.node)] or (f.key and self._handed_on(f.key))}
        stack = [f for f in facts.functions.values() if id(f.node) in bound or isinstance(f.node, cst.Lambda)]
        while stack:
            current = stack.pop()
            for callee in facts.callees(current):
                if id(callee.node) not in bound:
                    bound.add(id(callee.node))
                    stack.append(callee)
        return bound

    def _handed_on(self, key: str) -> bool:
        return key in self.passed or key.rsplit(".", 1)[-1] in self.passed
