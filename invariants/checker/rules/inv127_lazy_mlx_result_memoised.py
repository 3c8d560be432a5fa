from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

import libcst as cst

from mlx_invariants.checker import mlx_api
from mlx_invariants.checker.names import dotted
from mlx_invariants.checker.rule import Invalid, Rule, Valid

# mlx.core calls that make an evaluated array from host data (a leaf with no graph behind it), and
# those that evaluate or wait: what they return is no pending op of any stream.
_LEAVES = frozenset({"array", "asarray", "load", "eval", "async_eval", "synchronize"})
# mlx.core calls that return no array: kernels, transforms of functions, streams, devices, groups.
_NOT_ARRAYS = frozenset({
    "fast.metal_kernel", "fast.cuda_kernel", "distributed.init", "compile", "custom_function", "vmap", "grad",
    "value_and_grad", "checkpoint", "export_function", "import_function", "new_stream", "new_thread_local_stream",
    "stream", "device", "finfo", "iinfo",
})
_EVALUATES = frozenset({"mlx.core.eval", "mlx.core.async_eval"})
# An array's methods that hand back host values, not another lazy array.
_TO_HOST = frozenset({"item", "tolist", "__array__", "__float__", "__int__"})
# Module-level containers a value is stored into by key: literals and the standard library's mappings.
_CONTAINERS = frozenset({"dict", "collections.OrderedDict", "collections.defaultdict"})


# What the rule judges, found in the text before a file is parsed for it: a mapping bound at module
# level to a name that is no dunder (`_cache: dict[...] = {}`, `_memo = OrderedDict()`), or a `global`
# statement. Most model files, which import MLX, have neither, and are not parsed for it.
_SHAPE = re.compile(
    r"^(?!__)[A-Za-z_]\w*\s*(?::[^=\n]+)?=\s*(?:\{|(?:collections\.)?(?:dict|OrderedDict|defaultdict)\()"
    r"|^[ \t]+global ",
    re.MULTILINE,
)


def _imports_mlx(tree: ast.Module) -> bool:
    """An import from the `mlx` package anywhere in the file (CPython's tree). Without one no callee resolves to
    an `mlx.core` op, so no value is lazy and nothing is reported; `mlx` in the text alone (a model id such as
    `mlx-community/...` in a string) let such files through the triggers."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            if any(alias.name == "mlx" or alias.name.startswith("mlx.") for alias in node.names):
                return True
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module is not None \
                and (node.module == "mlx" or node.module.startswith("mlx.")):
            return True
    return False


@dataclass
class _Def:
    lazy: set[str] = field(default_factory=set)  # local names bound to a lazy MLX result
    evaluated: set[str] = field(default_factory=set)  # names handed to mx.eval so far
    local: set[str] = field(default_factory=set)  # parameters and assigned names (they shadow globals)
    globals: set[str] = field(default_factory=set)  # names its `global` statements declare
    # lazy stores not yet reported, as (node, its statement, value, target): an `mx.eval` of the target later in
    # the def clears one
    stored: list[tuple[cst.CSTNode, cst.CSTNode | None, str, str]] = field(default_factory=list)


class LazyMlxResultMemoised(Rule):
    """MLX is lazy: `centroids / mx.sqrt(d)` records an op on the stream of the
    thread that builds it, and nothing runs until the result is evaluated. A
    module-global cache (`_cache[key] = value` into a dict bound at module
    level, or a `global` assigned in a def) hands that unevaluated op to every
    thread that later reads the entry.
    From MLX 0.31.2 each thread has its own streams, and a thread that did not
    build the op raises "There is no Stream(gpu, N) in current thread" when it
    evaluates it; before 0.31.2 two threads reading the entry at once evaluate
    one graph together. A server fills such caches from whichever request thread
    gets there first. olmlx's TurboQuant KV cache kept its scaled codebooks in a
    module dict, stored as the lazy divide (engine/turboquant.py@2f582a2:55), and
    concurrent requests on other worker threads crashed evaluating it; fixed in
    376d9da by `mx.eval(codebook)` before storing. The same repository's
    `TurboQuantRotation` kept a lazy `self.matrix.T` on an object built on the
    event loop and used by the generation thread (turboquant.py@ed1fe65:70),
    fixed in e897734 the same way: that form, on an object, is not judged here.

    Judged: in a def, storing by key into a module-level dict (or
    assigning a `global`) a value made by an mlx.core op (not `mx.array` of host
    data, a leaf), an array method or operator on one, or a local name bound to
    one, unless that name was handed to `mx.eval` earlier in the def. Evaluate
    the value before storing it: an evaluated array has no stream and may be
    read on any thread."""

    id = "INV127"
    catches = "an unevaluated MLX result stored in a module-global cache, which every thread reads"
    message = (
        "`{value}` is stored unevaluated in module-global `{target}`: whichever thread reads it later evaluates "
        "an op built on this thread's stream (from MLX 0.31.2 \"There is no Stream(...) in current thread\" on "
        "any other thread; before it, two threads may evaluate it at once): `mx.eval(...)` it before storing it"
    )
    known_problems = (
        "Reported whether or not the program reads the cache from more than one thread. Only stores in a def "
        "into a mapping bound at module level (a dict literal, `dict()`, `OrderedDict()`, `defaultdict()`) by "
        "subscript or `setdefault`, and `global` names assigned in a def; a lazy array kept "
        "on a long-lived object (`self.matrix_T = self.matrix.T`), returned from an `lru_cache` function, or "
        "built by a project's own helper is not seen. An `mx.eval` of the stored name anywhere in the def, "
        "before the store or after it, counts, on any path: the moment between a store and the `mx.eval` "
        "right after it is a race on the first call only (WhisperLiveKit's DFT matrices, "
        "voxtral_mlx/spectrogram.py@ed571b6:117, graded false blind)."
    )
    triggers = (("mlx",), (_SHAPE,))
    possible = staticmethod(_imports_mlx)

    INVALID = [
        Invalid("""
            import mlx.core as mx

            CODEBOOKS = {2: [-1.51, -0.45, 0.45, 1.51]}
            _codebook_cache: dict[tuple[int, int], mx.array] = {}

            def get_codebook(bits, dim):
                key = (bits, dim)
                if key not in _codebook_cache:
                    centroids = mx.array(CODEBOOKS[bits], dtype=mx.float32)
                    _codebook_cache[key] = centroids / mx.sqrt(mx.array(float(dim)))  # expect: INV127
                return _codebook_cache[key]
        """),
        Invalid("""
            import mlx.core as mx

            _ROPE = None

            def rope_table(dim):
                global _ROPE
                if _ROPE is None:
                    freqs = mx.exp(-mx.arange(0, dim, 2) / dim)
                    _ROPE = freqs  # expect: INV127
                return _ROPE
        """),
    ]
    VALID = [
        # Stored, then evaluated before the def returns (WhisperLiveKit, issue 23).
        Valid("""
            import math
            import mlx.core as mx

            _DFT_RE = None
            _DFT_IM = None

            def dft_matrices(size):
                global _DFT_RE, _DFT_IM
                if _DFT_RE is None:
                    phase = -2.0 * math.pi * mx.arange(size)[:, None] * mx.arange(size)[None, :] / size
                    _DFT_RE = mx.cos(phase)
                    _DFT_IM = mx.sin(phase)
                    mx.eval(_DFT_RE, _DFT_IM)
                return _DFT_RE, _DFT_IM
        """),
        Valid("""
            import mlx.core as mx

            CODEBOOKS = {2: [-1.51, -0.45, 0.45, 1.51]}
            _codebook_cache: dict[tuple[int, int], mx.array] = {}

            def get_codebook(bits, dim):
                key = (bits, dim)
                if key not in _codebook_cache:
                    centroids = mx.array(CODEBOOKS[bits], dtype=mx.float32)
                    codebook = centroids / mx.sqrt(mx.array(float(dim)))
                    mx.eval(codebook)  # an evaluated leaf: no stream binding, safe on any thread
                    _codebook_cache[key] = codebook
                return _codebook_cache[key]
        """),
        # Arrays made from host data are leaves, and a local dict of the same name is no module's.
        Valid("""
            import mlx.core as mx
            import numpy as np

            _ROPE = None
            _tables = {}

            def rope_table(dim):
                global _ROPE
                if _ROPE is None:
                    _ROPE = mx.array(np.exp(-np.arange(0, dim, 2) / dim))
                return _ROPE

            def scratch(dim):
                _tables = {}
                _tables[dim] = mx.zeros((dim,))
                return _tables
        """),
    ]

    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        self.containers: set[str] = set()
        self.defs: list[_Def] = []

    def visit_Module(self, node: cst.Module) -> None:
        for statement in node.body:
            if not isinstance(statement, cst.SimpleStatementLine):
                continue
            for small in statement.body:
                if isinstance(small, cst.Assign) and self._container(small.value):
                    self.containers.update(t.target.value for t in small.targets
                                           if isinstance(t.target, cst.Name) and not t.target.value.startswith("__"))
                elif isinstance(small, cst.AnnAssign) and small.value is not None and self._container(small.value):
                    if isinstance(small.target, cst.Name) and not small.target.value.startswith("__"):
                        self.containers.add(small.target.value)

    def _container(self, value: cst.BaseExpression) -> bool:
        if isinstance(value, cst.Dict):
            return True
        return isinstance(value, cst.Call) and self.ctx.resolve(value.func) in _CONTAINERS

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        params = node.params
        names = {p.name.value for p in (*params.posonly_params, *params.params, *params.kwonly_params)}
        for star in (params.star_arg, params.star_kwarg):
            if isinstance(star, cst.Param):
                names.add(star.name.value)
        self.defs.append(_Def(local=names))

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        for stored, statement, value, target in self.defs.pop().stored:
            self.ctx.report_at(self.id, stored, statement, self.message.format(value=value, target=target))

    def visit_Global(self, node: cst.Global) -> None:
        if self.defs:
            self.defs[-1].globals.update(n.name.value for n in node.names)

    def visit_Call(self, node: cst.Call) -> None:
        if not self.defs:
            return
        frame = self.defs[-1]
        if self.ctx.resolve(node.func) in _EVALUATES:
            names = {n.value for a in node.args for n in _names(a.value)}
            frame.evaluated.update(names)
            frame.stored = [entry for entry in frame.stored if entry[3] not in names]
            return
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value == "setdefault" and len(node.args) >= 2:
            target = func.value
            if isinstance(target, cst.Name) and self._global_container(target.value, frame):
                self._judge(node.args[1].value, target.value, node, frame)

    def visit_Assign(self, node: cst.Assign) -> None:
        if not self.defs:
            return
        frame = self.defs[-1]
        for target in node.targets:
            inner = target.target
            if isinstance(inner, cst.Subscript) and isinstance(inner.value, cst.Name):
                if self._global_container(inner.value.value, frame):
                    self._judge(node.value, inner.value.value, node, frame)
            elif isinstance(inner, cst.Name):
                name = inner.value
                if name in frame.globals:
                    self._judge(node.value, name, node, frame)
                else:
                    frame.local.add(name)
                    if self._lazy(node.value, frame):
                        frame.lazy.add(name)
                    else:
                        frame.lazy.discard(name)

    def _global_container(self, name: str, frame: _Def) -> bool:
        return name in self.containers and (name in frame.globals or name not in frame.local)

    def _judge(self, value: cst.BaseExpression, target: str, node: cst.CSTNode, frame: _Def) -> None:
        if isinstance(value, cst.Name) and value.value in frame.evaluated:
            return
        if self._lazy(value, frame):
            frame.stored.append((node, self.ctx.statement, _short(value), target))

    def _lazy(self, value: cst.BaseExpression, frame: _Def) -> bool:
        """An op MLX has not run yet: an mlx.core op's result, an array method or operator on one."""
        if isinstance(value, cst.Name):
            return value.value in frame.lazy and value.value not in frame.evaluated
        if isinstance(value, cst.BinaryOperation):
            return self._lazy(value.left, frame) or self._lazy(value.right, frame)
        if isinstance(value, cst.UnaryOperation):
            return self._lazy(value.expression, frame)
        if isinstance(value, cst.Subscript):
            return self._lazy(value.value, frame)
        if isinstance(value, cst.Attribute):  # `.T`
            return value.attr.value == "T" and self._lazy(value.value, frame)
        if isinstance(value, cst.Call):
            qual = self.ctx.resolve(value.func) or ""
            if qual.startswith("mlx.core."):
                rest = qual[len("mlx.core."):]
                if rest in _LEAVES or rest in _NOT_ARRAYS or rest.rpartition(".")[2][:1].isupper():
                    return False  # a leaf, no array at all, or a class (`mx.Dtype`, `mx.Stream`)
                return not rest.startswith(("metal.", "cuda.")) and not any(h in rest for h in mlx_api.HARMLESS_CORE)
            func = value.func
            if isinstance(func, cst.Attribute) and not qual:
                return func.attr.value not in _TO_HOST and self._lazy(func.value, frame)
        return False


def _names(expr: cst.BaseExpression) -> list[cst.Name]:
    """The names an `mx.eval` argument hands over (`codebook`, `self.m, t`, a tuple or list of them)."""
    if isinstance(expr, cst.Name):
        return [expr]
    if isinstance(expr, cst.Tuple | cst.List):
        return [n for element in expr.elements for n in _names(element.value)]
    if isinstance(expr, cst.Subscript):  # `mx.eval(_cache[key])`: the container's entry
        return _names(expr.value)
    return []


def _short(value: cst.BaseExpression) -> str:
    text = dotted(value) or cst.Module([]).code_for_node(value)
    return text if len(text) <= 60 else text[:57] + "..."
