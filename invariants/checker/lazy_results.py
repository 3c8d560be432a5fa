"""Lazy MLX results a coroutine gets back from a thread, and where it materializes them on the loop.

MLX is lazy: `model(x)` or `mx.softmax(x)` only records a graph, and the work runs where the
result is first evaluated. A coroutine that hands `lambda: model(x)` to a worker gets back an
unevaluated array; `np.array(out)`, `out.item()` or `out.tolist()` on the event loop then runs
the whole forward pass there, blocking every other request (and, from MLX 0.31.2, on a thread
whose streams are not the worker's, which raises "There is no Stream(...) in current thread").
exo's sharded engine did this (exo/inference/mlx/sharded_inference_engine.py@6662d56:96, the
corpus's EXO2), fixed by evaluating and converting on its MLX executor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from mlx_invariants.checker import mlx_api
from mlx_invariants.checker.facts import CallSite
from mlx_invariants.checker.names import dotted
from mlx_invariants.checker.offload import handoff, positional

if TYPE_CHECKING:
    from mlx_invariants.checker.walker import FileContext

# Conversions that evaluate an MLX array: numpy's constructors on it, and its own `item`/`tolist`.
_NUMPY = frozenset({"numpy.array", "numpy.asarray", "numpy.asanyarray", "numpy.ascontiguousarray"})
_ARRAY_METHODS = frozenset({"item", "tolist"})
# mlx.core calls that evaluate, wait or set state rather than build a graph.
_NOT_LAZY = frozenset({"mlx.core.eval", "mlx.core.async_eval", "mlx.core.synchronize"})


@dataclass(frozen=True)
class Materialized:
    """`call` evaluates on the loop the lazy result of `work`, handed over by `how`."""

    call: cst.Call
    statement: cst.CSTNode | None
    work: str
    how: str


class LazyResults:
    """Fed by a rule's walk of each async def: what its awaited hand-offs return unevaluated
    (by the name they are assigned to), and the conversions of those names on the loop."""

    def __init__(self, ctx: FileContext) -> None:
        self.ctx = ctx
        self._lazy: dict[tuple[int, str], tuple[str, str]] = {}  # (async def, name) -> (work, how)
        self.found: list[Materialized] = []

    def on_assign(self, node: cst.Assign) -> None:
        """`out = await <hand-off of lazy MLX work>` in an async def."""
        lazy = self._lazy_handoff(node.value)
        if lazy is None:
            return
        for target in node.targets:
            if isinstance(target.target, cst.Name):
                self._lazy[id(self.ctx.scope.top.node), target.target.value] = lazy

    def on_call(self, node: cst.Call) -> None:
        """A conversion, in an async def, of a lazy result named here or awaited in place."""
        value = self._converted(node)
        if value is None:
            return
        lazy = self._lazy_handoff(value)
        if lazy is None and isinstance(value, cst.Name):
            lazy = self._lazy.get((id(self.ctx.scope.top.node), value.value))
        if lazy is not None:
            self.found.append(Materialized(node, self.ctx.statement, *lazy))

    def _converted(self, node: cst.Call) -> cst.BaseExpression | None:
        func = node.func
        if self.ctx.resolve(func) in _NUMPY:
            return positional(node, 0)
        if isinstance(func, cst.Attribute) and func.attr.value in _ARRAY_METHODS and not node.args:
            return func.value
        return None

    def _lazy_handoff(self, value: cst.BaseExpression | None) -> tuple[str, str] | None:
        """For `await <hand-off>` whose callable only builds an MLX graph: (that work, the hand-off)."""
        if not isinstance(value, cst.Await) or not isinstance(value.expression, cst.Call):
            return None
        work = handoff(value.expression, self.ctx)
        if work is None or work.target is None:
            return None
        built = self._builds_graph(work.target)
        return (built, dotted(value.expression.func) or work.how) if built else None

    def _builds_graph(self, target: cst.BaseExpression) -> str | None:
        """`lambda: model(x)`, `lambda: mx.softmax(x)`, or the model itself handed over: the lazy work."""
        call = target.body if isinstance(target, cst.Lambda) else cst.Call(func=target)
        if not isinstance(call, cst.Call):
            return None
        site = CallSite(call, self.ctx.resolve(call.func), dotted(call.func), self.ctx.key(call.func))
        forward = mlx_api.forward_pass(site, self.ctx)
        if forward:
            return forward
        qual = site.qual or ""
        if (qual.startswith("mlx.core.") and qual not in _NOT_LAZY
                and not any(h in qual for h in mlx_api.HARMLESS_CORE)):
            return f"{site.text or qual}(...)"
        return None
