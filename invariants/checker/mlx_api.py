"""Which calls reach MLX, and which of them block the calling thread."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from mlx_invariants.checker.globs import matches_name
from mlx_invariants.checker.mlx_facts import FACTS
from mlx_invariants.checker.names import dotted, terminal

if TYPE_CHECKING:
    from mlx_invariants.checker.facts import CallSite
    from mlx_invariants.checker.walker import FileContext

_PACKAGES = ("mlx_lm", "mlx_vlm")
# Calls that run a whole generation before returning.
GENERATE = frozenset(
    f"{pkg}{mod}.{fn}" for pkg in _PACKAGES for mod in ("", ".generate") for fn in ("generate", "batch_generate")
)
# Calls that return a generator; MLX runs when it is iterated.
GENERATORS = frozenset(
    f"{pkg}{mod}.{fn}"
    for pkg in _PACKAGES
    for mod in ("", ".generate")
    for fn in ("stream_generate", "generate_step", "speculative_generate_step")
)
BATCH_GENERATORS = frozenset(f"{pkg}{mod}.BatchGenerator" for pkg in _PACKAGES for mod in ("", ".generate"))
# Loading weights: seconds of MLX work, and the arrays belong to the loading thread's stream.
LOADS = frozenset(f"{pkg}{mod}.load" for pkg in _PACKAGES for mod in ("", ".utils"))
LOAD_NAMES = ["*load_model*"]
# Parts of mlx-lm that only do Python work (tokenizers, samplers, configs).
PYTHON_ONLY = ("tokenizer", "sample_utils", "make_sampler", "make_logits_processors", "load_config", "get_model_path")  # an engine's own loader (`load_model_with_fallback`)
# Engines wrap the model in their own class; these methods of a model-named receiver
# (`self._model.chat(...)`) run a whole generation, or return a generator that does.
MODEL_GENERATION = frozenset({"generate", "chat", "batch_generate"})
MODEL_STREAMS = frozenset({"stream_generate", "stream_chat", "generate_step"})
# A model's own weight I/O: every array is evaluated and copied to or from disk (seconds of MLX work).
MODEL_WEIGHT_SAVES = frozenset({"save_weights"})
# A BatchGenerator's methods that only read Python state; every other one runs MLX.
GENERATOR_HARMLESS = frozenset({"stats", "stream", "prompt_cache_nbytes"})
# A look-alike generator (an engine's own `MLLMBatchGenerator`, or one known only by
# name) is judged by mlx-lm's API: these are the methods that run MLX there.
GENERATOR_MLX_METHODS = frozenset({
    "insert", "insert_segments", "extract_cache", "remove", "next", "next_generated", "close", "step", "prefill",
})
BLOCKING_CORE = frozenset({"mlx.core.eval", "mlx.core.synchronize"})
# mlx.core calls that give the calling thread a stream of its own (a project's helper doing so is
# named like stream-binders).
STREAM_BINDING = frozenset({"mlx.core.new_stream", "mlx.core.set_default_stream"})
# mlx.core calls that read counters or settings and never encode GPU work. `random.seed` only
# replaces the process-wide PRNG key with a constant array (no primitive, no stream): nothing a
# worker thread's stream waits on or shares. Then the calls an MLX fact makes safe on any thread in
# every release that has them (`mx.clear_cache`, mlx_facts.py): not MLX state on two threads either.
HARMLESS_CORE = (
    "is_available", "memory", "cache_limit", "memory_limit", "device_info", "default_device",
    "default_stream", "set_default_device", "wired_limit", "random.seed",
    *(call for fact in FACTS for call in fact.calls),
)


def _imported_from_mlx(qual: str) -> bool:
    return qual.startswith(("mlx.", "mlx_lm.", "mlx_vlm.")) or qual in ("mlx", "mlx_lm", "mlx_vlm")


def note_import(qual: str, ctx: FileContext) -> None:
    if _imported_from_mlx(qual):
        ctx.facts.imports_mlx = True


def is_batch_generator(expr: cst.BaseExpression, ctx: FileContext) -> bool:
    """A name or attribute this file assigned a `BatchGenerator(...)`."""
    return bool(ctx.facts.constructed_by(ctx.key(expr)) & BATCH_GENERATORS)


def _looks_like_batch_generator(expr: cst.BaseExpression, ctx: FileContext) -> bool:
    """Built here from a class named `*BatchGenerator`, or named so (batch-generator-names)."""
    built = ctx.facts.constructed_by(ctx.key(expr))
    if any(q.rsplit(".", 1)[-1].endswith("BatchGenerator") for q in built):
        return True
    return matches_name(dotted(expr), ctx.shared["batch-generator-names"])


def is_model(expr: cst.BaseExpression, ctx: FileContext) -> bool:
    """A receiver named like the model (model-names): `self._model`, `text_model`."""
    return matches_name(dotted(expr), ctx.shared["model-names"])


def is_mlx_generator(expr: cst.BaseExpression, ctx: FileContext) -> bool:
    """A call to, or a name assigned from, `stream_generate` / `generate_step`, or a model's stream method."""
    if isinstance(expr, cst.Call):
        func = expr.func
        if isinstance(func, cst.Attribute) and func.attr.value in MODEL_STREAMS and is_model(func.value, ctx):
            return True
        return ctx.resolve(func) in GENERATORS
    return bool(ctx.facts.constructed_by(ctx.key(expr)) & GENERATORS)


def forward_pass(site: CallSite, ctx: FileContext) -> str | None:
    """Calling the model object itself (`self.model(x)`, `model(tokens)`): a forward pass, or, for an
    engine's own model wrapper with a `__call__`, a whole generation. Either way MLX runs on the caller's
    thread (a lazy forward builds its graph there, on that thread's stream). A capitalised name
    (`Model(id=...)`) builds an object, usually a schema, and is left out."""
    func = site.node.func
    if isinstance(func, cst.Name | cst.Attribute) and not (terminal(func) or "")[:1].isupper() and is_model(func, ctx):
        return f"{site.text}(...)"
    return None


def is_load(site: CallSite) -> bool:
    """Loading model weights: mlx-lm's `load`, or a call named like a model loader."""
    if site.qual in LOADS:
        return True
    return not (site.qual or "").startswith(("mlx", "transformers")) and matches_name(site.text, LOAD_NAMES)


def blocking(site: CallSite, ctx: FileContext, loads: bool = True) -> str | None:
    """The MLX call that blocks the calling thread, or binds MLX state to it, or None.

    `loads=False` leaves out loading weights: at start-up nothing else is served yet.
    """
    qual = site.qual
    if qual in GENERATE or qual in BLOCKING_CORE or qual in BATCH_GENERATORS:
        return site.text or qual
    if loads and is_load(site):
        return site.text or qual
    func = site.node.func
    if isinstance(func, cst.Attribute):
        method = func.attr.value
        if method not in GENERATOR_HARMLESS and is_batch_generator(func.value, ctx):
            return site.text
        if method in GENERATOR_MLX_METHODS and _looks_like_batch_generator(func.value, ctx):
            return site.text
        if (method in MODEL_GENERATION or method in MODEL_WEIGHT_SAVES) and is_model(func.value, ctx):
            return site.text
    if matches_name(site.text, ctx.shared["mlx-calls"]):
        return site.text
    if qual == "next" or (isinstance(func, cst.Name) and func.value == "next"):
        args = site.node.args
        if args and is_mlx_generator(args[0].value, ctx):
            return "next() on an MLX generator"
    return None


def runs_mlx(site: CallSite, ctx: FileContext, loads: bool = True) -> str | None:
    """What `blocking` finds, or a call that makes a generator MLX runs in when iterated.

    For calls inside a helper: a helper that calls `stream_generate(...)` iterates it.
    """
    found = blocking(site, ctx, loads)
    if found:
        return found
    if site.qual in GENERATORS:
        return site.text or site.qual
    func = site.node.func
    if isinstance(func, cst.Attribute) and func.attr.value in MODEL_STREAMS and is_model(func.value, ctx):
        return site.text
    return None


def generation(site: CallSite, ctx: FileContext) -> str | None:
    """A call that generates with mlx-lm or mlx-vlm, or with an engine's wrapper of them (a model's
    generate/chat/stream_*, a batch generator's steps, `mlx-calls`): it encodes on the library's own
    generation stream, which is a version fact of its own (mlx_facts.py)."""
    qual = site.qual
    if qual in GENERATE or qual in GENERATORS or qual in BATCH_GENERATORS:
        return site.text or qual
    func = site.node.func
    if isinstance(func, cst.Attribute):
        method = func.attr.value
        if (method in MODEL_GENERATION or method in MODEL_STREAMS or "generate" in method) and is_model(func.value, ctx):
            return site.text
        if method not in GENERATOR_HARMLESS and is_batch_generator(func.value, ctx):
            return site.text
        if method in GENERATOR_MLX_METHODS and _looks_like_batch_generator(func.value, ctx):
            return site.text
    if matches_name(site.text, ctx.shared["mlx-calls"]):
        return site.text
    if (qual == "next" or (isinstance(func, cst.Name) and func.value == "next")) and site.node.args:
        return "next() on an MLX generator" if is_mlx_generator(site.node.args[0].value, ctx) else None
    return None


def reaches(site: CallSite, ctx: FileContext) -> str | None:
    """The MLX use this call makes (any mlx.core op, generation, a model call), or None."""
    found = blocking(site, ctx)
    if found:
        return found
    qual = site.qual
    if qual:
        if qual.startswith("mlx.core.") and not any(h in qual for h in HARMLESS_CORE):
            return site.text or qual
        if qual in GENERATORS or qual in BATCH_GENERATORS:
            return site.text or qual
        return None
    if ctx.facts.imports_mlx:
        func = site.node.func
        if matches_name(site.text, ctx.shared["model-names"]):
            return f"{site.text}(...)"
        if isinstance(func, cst.Attribute) and "generate" in func.attr.value:
            receiver = dotted(func.value)
            if matches_name(receiver, ctx.shared["model-names"]):
                return f"{site.text}(...)"
    return None
