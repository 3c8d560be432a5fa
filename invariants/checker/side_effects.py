"""A callable handed to a thread that only computes a value: it changes nothing another thread reads.

A worker thread that outlives its waiter (INV105: the waiter was cancelled and left the lock) is a
hazard through what it still does: MLX work beside the next holder's, a download into the folder the
next holder cleans up, a dict the next holder iterates. A def of the file that reaches no MLX and
writes no state (no attribute, item or global it assigns, no container it mutates, no file it opens
for writing or removes) only computes a value: running on after its waiter left, it changes nothing
the lock guards, and its result is dropped. A function it imports from outside the standard library
is unknown (another module of the project may calibrate a model and write the result), unless it is
known to read: huggingface_hub's fetch of one file into its own cache, which that library locks.
A method of another object is taken to read unless it is named like a mutator; `next(it)` steps an
iterator, which changes it and runs whatever the generator behind it runs.

A thread handed an Event's own `wait` (`asyncio.to_thread(done.wait, 30)`, `done` bound in the file to
`threading.Event()` and nothing else) only waits. Rapid-MLX's diffusion lane waits so, under its
generation lock, for the one worker thread that runs all its GPU work to finish a cancelled job
(vllm_mlx/runtime/diffusion_lane.py@7222ca7:1276, graded false blind).

A lambda that only makes an MLX generator (`lambda: iter(model.stream_chat(...))`) runs none of it:
calling a generator function runs nothing until the generator is stepped, so the MLX runs on the
thread that steps it, where that hand-off is judged.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import libcst as cst

from mlx_invariants.checker import mlx_api
from mlx_invariants.checker.loop_owner import handed_reaches
from mlx_invariants.checker.names import dotted
from mlx_invariants.checker.offload import unwrap_iter
from mlx_invariants.checker.walker import OWN_BODY_STOP, descendants

if TYPE_CHECKING:
    from mlx_invariants.checker.facts import CallSite, FunctionFacts
    from mlx_invariants.checker.walker import FileContext

# Methods that change their receiver in place: containers, queues, events, files and paths.
_MUTATORS = frozenset({
    "pop", "popitem", "clear", "update", "add", "discard", "remove", "append", "extend", "insert", "setdefault",
    "put", "put_nowait", "set", "write", "writelines", "write_text", "write_bytes", "unlink", "rmdir", "mkdir",
    "rename", "replace", "touch", "symlink_to", "save", "save_weights", "dump", "close", "shutdown", "cancel",
    "release", "acquire", "start", "join", "submit", "send", "sendall", "__next__", "throw",
})
# Library functions that only read (huggingface_hub fetches one file into its own cache, which it locks).
_LIBRARY_READS = frozenset({
    "huggingface_hub.hf_hub_download", "huggingface_hub.try_to_load_from_cache", "huggingface_hub.file_exists",
    "huggingface_hub.model_info",
})
# Methods that read their receiver: a mapping's or a string's, a path's and a file's.
_READ_METHODS = frozenset({
    "get", "keys", "values", "items", "copy", "lower", "upper", "strip", "split", "startswith", "endswith",
    "format", "exists", "is_file", "is_dir", "read", "read_text", "read_bytes", "readlines", "resolve",
})
# Module functions that write or remove files.
_WRITERS = ("shutil.", "os.remove", "os.unlink", "os.rename", "os.replace", "os.makedirs", "os.mkdir",
            "os.rmdir", "os.removedirs", "os.symlink", "os.link", "os.truncate", "os.write")


def only_computes(target: cst.BaseExpression | None, ctx: FileContext) -> bool:
    """`target` is a def or lambda of this file that, with every def of the file it calls, reaches no
    MLX and writes no state; False when unknown (a library's function, a def of another module)."""
    if target is None:
        return False
    if isinstance(target, cst.Attribute) and target.attr.value == "wait" and _events_only(target.value, ctx):
        return True  # a thread that waits for an Event changes nothing
    if isinstance(target, cst.Lambda) and _makes_generator(target.body, ctx):
        return True
    if isinstance(target, cst.Lambda):
        facts = ctx.function_facts(target)
        start = [facts] if facts is not None else []
    else:
        start = list(ctx.facts.by_key.get(ctx.key(target) or "", ()))
    if not start or handed_reaches(target, ctx, _mlx):
        return False
    seen: set[int] = set()
    stack: list[FunctionFacts] = start
    while stack:
        function = stack.pop()
        if id(function.node) in seen:
            continue
        seen.add(id(function.node))
        if isinstance(function.node, cst.FunctionDef) and function.node.asynchronous is not None:
            return False  # a coroutine handed over is not this shape
        if _writes(function.node, ctx):
            return False
        stack.extend(ctx.facts.callees(function))
    return True


def _events_only(receiver: cst.BaseExpression, ctx: FileContext) -> bool:
    """Every value the file assigns to `receiver` is a `threading.Event()` (and it assigns one)."""
    made = ctx.facts.constructed_by(ctx.key(receiver))
    return bool(made) and made <= {"threading.Event"}


def _makes_generator(body: cst.BaseExpression, ctx: FileContext) -> bool:
    """`G(...)` or `iter(G(...))`, G an MLX generator (mlx_api.is_mlx_generator), with arguments that call
    nothing: the lambda returns the generator unstarted."""
    body = unwrap_iter(body, ctx)
    if not isinstance(body, cst.Call) or not mlx_api.is_mlx_generator(body, ctx):
        return False
    return not any(isinstance(node, cst.Call | cst.Await | cst.Lambda)
                   for arg in body.args for node in [arg.value, *descendants(arg.value)])


def _mlx(site: CallSite, ctx: FileContext) -> str | None:
    """Any MLX use: an op, a generation (a model's stream methods too), a forward pass."""
    return mlx_api.reaches(site, ctx) or mlx_api.runs_mlx(site, ctx) or mlx_api.forward_pass(site, ctx)


def _writes(function: cst.CSTNode, ctx: FileContext) -> bool:
    """The def's own body stores into an attribute, an item or a global, mutates a receiver in place,
    or writes or removes a file."""
    body = function.body if isinstance(function, cst.FunctionDef | cst.Lambda) else function
    for node in descendants(body, OWN_BODY_STOP):
        if isinstance(node, cst.Global | cst.Nonlocal):
            return True
        if isinstance(node, cst.Assign) and any(_stores(t.target) for t in node.targets):
            return True
        if isinstance(node, cst.AugAssign | cst.AnnAssign) and _stores(node.target):
            return True
        if isinstance(node, cst.Del) and _stores(node.target):
            return True
        if isinstance(node, cst.Call) and (_changes(node, ctx) or _unknown(node, ctx)):
            return True
    return False


def _unknown(call: cst.Call, ctx: FileContext) -> bool:
    """A function imported from outside the standard library (another module of the project, a library)
    that is not known to only read: what it does is not in this file."""
    func = call.func
    if isinstance(func, cst.Attribute) and mlx_api.is_model(func.value, ctx):
        return True  # a model's method: its computation, whatever mlx_api calls it (`self._model.stream_chat`)
    if isinstance(func, cst.Attribute) and func.attr.value in _READ_METHODS:
        return False  # `LM_REMAP.get(name)` on an imported mapping, `path.exists()`
    qual = ctx.resolve(func)
    if not qual or "." not in qual:
        return False  # a builtin, a def of this file (followed), or a method of a value
    return qual.partition(".")[0] not in sys.stdlib_module_names and qual not in _LIBRARY_READS


def _stores(target: cst.BaseExpression) -> bool:
    """An assignment target that is, or holds, an attribute or an item (`self.x`, `cache[k]`, `a, b.c`)."""
    if isinstance(target, cst.Attribute | cst.Subscript):
        return True
    if isinstance(target, cst.Tuple | cst.List):
        return any(_stores(element.value) for element in target.elements)
    return isinstance(target, cst.StarredElement) and _stores(target.value)


def _changes(call: cst.Call, ctx: FileContext) -> bool:
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value in _MUTATORS:
        return True
    if isinstance(func, cst.Name) and func.value == "next" and ctx.resolve(func) is None:
        return True  # steps an iterator: it changes, and the generator behind it runs its body
    qual = ctx.resolve(func) or dotted(func) or ""
    if qual.startswith(_WRITERS):
        return True
    if qual in ("open", "io.open") or (isinstance(func, cst.Attribute) and func.attr.value == "open"):
        return _opens_for_writing(call)
    return False


def _opens_for_writing(call: cst.Call) -> bool:
    """`open(path, "w")`, `path.open(mode="a")`: a mode that writes; one computed elsewhere counts too."""
    mode = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == "mode"), None)
    if mode is None:
        positional = [a.value for a in call.args if a.keyword is None]
        index = 0 if isinstance(call.func, cst.Attribute) and dotted(call.func) != "io.open" else 1
        mode = positional[index] if index < len(positional) else None
    if mode is None:
        return False
    if not isinstance(mode, cst.SimpleString):
        return True
    return any(flag in mode.evaluated_value for flag in "wax+")  # type: ignore[operator]
