"""What the package hands to a thread, indexed by what the handed callable is: the package's own word that
calling it blocks (INV134).

A maintainer who writes `await asyncio.to_thread(load_audio, path)` has said that `load_audio` is too slow for
the event loop. The same call made inline in another coroutine of the package stalls every request of that loop
while it runs, and nothing at that call site says so: the evidence is in another file. This index answers, for
a call, whether the package hands the same callable to a thread somewhere, and where.

What counts as the same callable (`identity`): a function of the package, by its key; a function of a
third-party module, by its dotted name (`librosa.load`); a reference the model cannot follow to its end, by
the longest part of it that it can and the rest as written (`self.pipeline.transcribe` in the methods of one
class; `get_backend().unload_model` from any module, `get_backend` unannotated). The standard library,
builtins and MLX are left out: `json.dumps`, `shutil.rmtree` or `open` are offloaded for a large argument in one
place and called for a small one in another, and nothing says which is which.

What counts as handed over: a callable handed to the default pool (`to_thread`, `run_in_executor(None, ...)`)
anywhere in the modules the model has read, a package helper's forwarded parameter (`await
run_blocking(engine.generate, prompt)`), the call a lambda handed over is (`run_in_executor(None, lambda:
engine.transcribe(path))`), and a generator stepped there (`to_thread(next, gen)` of `gen = engine.stream()`:
then iterating `engine.stream()` on the loop is the same work). Handoffs in modules that serve no one (tests,
benchmarks, scripts) are no evidence.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mlx_invariants.checker.model.graph import ITER, RUN
from mlx_invariants.checker.model.summary import DEFAULT_POOL, Call, Offload, Place

if TYPE_CHECKING:
    from mlx_invariants.checker.model.graph import Key, Package

# Modules that serve no one: tests, benchmarks, evaluations, scripts, command lines (a part of the module's name).
SERVES_NO_ONE = re.compile(r"^(tests?|conftest|bench\w*|evals?|scripts?|examples?|cli|__main__)$|^(test|bench|eval)_")
# No evidence: the standard library and builtins, the web frameworks' own helpers, and MLX, whose calls are
# handed to a thread as often to keep them on the thread that owns MLX as because they are slow (`mx.clear_cache`):
# INV108 judges MLX that blocks the loop, INV107 and INV119 MLX on the wrong thread.
_NOT_EVIDENCE = frozenset(sys.stdlib_module_names) | {"builtins", "anyio", "starlette", "fastapi", "uvicorn", "mlx",
                                                      "mlx_lm", "mlx_vlm"}


@dataclass(frozen=True)
class Handoff:
    """Where the package hands a callable to a thread: the function that does, the handoff's place and how it
    is written."""

    function: Key
    place: Place
    how: str

    @property
    def module(self) -> str:
        return self.function[0]


def serves_no_one(module: str) -> bool:
    return any(SERVES_NO_ONE.search(part) for part in module.split("."))


def identity(package: Package, module: str, ref: str) -> tuple[str, ...] | None:
    """What `ref`, written in `module`, calls, as the index keys it; None when it is no evidence either way.

    A reference the model cannot follow to its end is named by the longest part of it that it can, and the
    rest as written: `get_backend().unload_model`, `get_backend` a function of the package whose return is
    not annotated, is ("part", that function, "().unload_model") from any module that reaches it, so
    `routes.inference.get_backend().unload_model` in one module and `:get_backend().unload_model` in the
    module that defines it are the same call."""
    if ref.startswith("$"):
        return None
    target, symbol = package.callee(module, ref)
    if target is not None:
        return ("fn", *target)
    if symbol is not None and symbol.kind == "external":
        return ("ext", symbol.module) if _evidence(symbol.module) else None
    if symbol is not None:
        return None
    lead = ref[: len(ref) - len(ref.lstrip(":."))]
    tokens = _TOKEN.findall(ref[len(lead):])
    for cut in range(len(tokens) - 1, 0, -1):
        prefix = lead + "".join(t if t == "()" or i == 0 else "." + t for i, t in enumerate(tokens[:cut]))
        found = package.resolve(module, prefix)
        if found is not None:
            if found.kind == "external":
                return None
            rest = "".join(t if t == "()" else "." + t for t in tokens[cut:])
            return ("part", found.kind, found.module, found.name, rest)
    return None


_TOKEN = re.compile(r"\(\)|[^.()]+")


def _evidence(dotted: str) -> bool:
    """A third-party function, called by its dotted name: not the standard library's, a builtin, a web
    framework's or MLX's (`_NOT_EVIDENCE`)."""
    return "." in dotted and dotted.partition(".")[0] not in _NOT_EVIDENCE


def index(package: Package) -> dict[tuple[str, tuple[str, ...]], list[Handoff]]:
    """Every callable the package hands to a thread, by (RUN: run there, or ITER: the generator its call makes
    stepped there; its identity): its handoffs, the first of each function."""
    found = package.memo.get("handed")
    if found is not None:
        return found
    found = {}
    leaves = package.memo["handed-leaves"] = set()

    def add(mode: str, module: str, ref: str | None, handoff: Handoff) -> None:
        ident = identity(package, module, ref) if ref is not None else None
        if ident is not None:
            leaves.update((_leaf(ref), _leaf(ident[-1])))  # type: ignore[arg-type]
            handoffs = found.setdefault((mode, ident), [])
            if all(h.function != handoff.function for h in handoffs):
                handoffs.append(handoff)

    for module, summary in sorted(package.loaded()):
        if serves_no_one(module):
            continue
        for name, fn in summary.functions.items():
            key = (module, name)
            for work in fn.offloads:
                if not package.can_run(key, work.place.line):
                    continue
                handoff = Handoff(key, work.place, work.how)
                for ref in _run_by(package, module, work):
                    add(RUN, module, ref, handoff)
                if work.pool == DEFAULT_POOL and work.stepped is not None and work.stepped.endswith("()"):
                    add(ITER, module, work.stepped[:-2], handoff)
            for call, _use, target, _ in package.edges.get(key, ()):
                for ref, forward in package.forwarded(target, call) if call is not None else ():
                    add(RUN, module, ref, Handoff(key, call.place, f"{call.text}, which hands it to {forward.how}"))
    package.memo["handed"] = found
    return found


def _run_by(package: Package, module: str, work: Offload) -> list[str]:
    """The references a handoff to the default pool runs there: its callable, or the call a lambda handed over is
    (`lambda: engine.transcribe(path)`), not the calls in its arguments. A lambda that makes several calls side by
    side (`lambda: (active_model(), context_length())`) is handed over for one of them, and nothing says which:
    unslothai/unsloth's monitor route hands three helpers to one `to_thread` because one of them may wait on
    hardware detection, and calls the others inline elsewhere by design
    (studio/backend/routes/inference.py@015bdef:11329). A handoff to an executor or a thread of the package's own
    says where the work runs, often for the thread's sake, not its speed: vllm-mlx queues a stream restore on
    the one worker that generates, to order it after the work there, and makes the same call inline when that
    worker is gone (vllm_mlx/engine/simple.py@4b654c0:971, 399)."""
    if work.target is None or work.param is not None or work.pool != DEFAULT_POOL:
        return []
    target, _ = package.callee(module, work.target)
    if target is None or "<lambda" not in target[1]:
        return [work.target]
    fn = package.function(target)
    return [call.target for call in fn.calls if call.text == work.body] if fn is not None and work.body else []


def handed(package: Package, caller: Key, call: Call, mode: str) -> Handoff | None:
    """Where another function of the package hands what `call` (made by `caller`) runs to a thread, if one does.
    A handoff in the caller itself is no evidence: `if executor is not None: await loop.run_in_executor(executor,
    f)` then `else: f()` is a mode the caller picks, and a runtime check of the current thread (`if
    on_worker_thread(): f()`) is a choice made knowingly (Rapid-MLX's engine loop, engine_core.py@7222ca7:845;
    VoiceStudio's model manager, model_manager.py@98c9e68:3287)."""
    handed_over = index(package)
    if _leaf(call.target) not in package.memo["handed-leaves"]:  # most calls: no name to resolve
        return None
    ident = identity(package, caller[0], call.target)
    handoffs = handed_over.get((mode, ident), ()) if ident is not None else ()
    return next((h for h in handoffs if h.function != caller), None)


def _leaf(ref: str) -> str:
    """The name a reference ends with (`.engine.Engine().run` -> `run`, `:folder_size` -> `folder_size`): a call of
    the same function ends so too."""
    return ref.rpartition(".")[2].lstrip(":").removesuffix("()")


__all__ = ["Handoff", "SERVES_NO_ONE", "handed", "identity", "index", "serves_no_one"]
