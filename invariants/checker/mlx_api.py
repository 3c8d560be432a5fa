"""Which calls reach MLX, and which of them block the calling thread."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import libcst as cst

from mlx_invariants.checker.globs import matches_name
from mlx_invariants.checker.iteration import LAZY
from mlx_invariants.checker.mlx_core_names import CORE_NAMES, SUBMODULE_NAMES
from mlx_invariants.checker.mlx_facts import FACTS
from mlx_invariants.checker.names import dotted, terminal
from mlx_invariants.checker.offload import generator_defs

if TYPE_CHECKING:
    from mlx_invariants.checker.facts import CallSite
    from mlx_invariants.checker.walker import FileContext

_PACKAGES = ("mlx_lm", "mlx_vlm")
# Where the packages define generation: `generate.py` today, `utils.py` before it moved out (mlx-lm
# while it lived in ml-explore/mlx-examples' llms/, mlx-vlm before its generate module), and the package
# itself, which re-exports it. Servers written against those versions still import `mlx_lm.utils`.
_GENERATION_MODULES = ("", ".generate", ".utils")
# Calls that run a whole generation before returning.
GENERATE = frozenset(
    f"{pkg}{mod}.{fn}" for pkg in _PACKAGES for mod in _GENERATION_MODULES for fn in ("generate", "batch_generate")
)
# Calls that return a generator; MLX runs when it is iterated.
GENERATORS = frozenset(
    f"{pkg}{mod}.{fn}"
    for pkg in _PACKAGES
    for mod in _GENERATION_MODULES
    for fn in ("stream_generate", "generate_step", "speculative_generate_step")
)
BATCH_GENERATORS = frozenset(f"{pkg}{mod}.BatchGenerator" for pkg in _PACKAGES for mod in ("", ".generate"))
# Keywords mlx-lm's generation has never accepted: `generate`, `batch_generate` and `stream_generate` hand their
# keywords on to `generate_step` (or the batch generator), which samples with a `sampler` (before 0.21 with
# `temp`) and has no `temperature`, so such a call raises TypeError before any MLX runs. mlx-vlm's generation
# takes `temperature`. Issue 23, set g: Impetus-LLM-Server's warm-up called `mlx_lm.generate(...,
# temperature=0.7)` on a pool (gerdsen_ai_server/src/services/model_warmup.py@8177aea:132), graded false blind.
_NEVER_ACCEPTED = frozenset({"temperature"})


def rejected_generation(qual: str | None, keywords: Iterable[str | None], rejected: frozenset[str] = frozenset()) -> bool:
    """A call of mlx-lm's generation with a keyword no release of it accepts, or one of `rejected`, those the
    releases the file's project admits no longer take (mlx_facts.rejected_keywords): it raises, running no MLX.
    Issue 23, set c: mlx-model-hub, on mlx-lm>=0.21.0, passes `temp=` and `top_p=` to `mlx_lm.generate` and
    `stream_generate` (backend/src/mlx_hub/inference/engine.py@cc3537d:245, :307), graded false blind."""
    return bool(qual) and qual.startswith("mlx_lm.") and (qual in GENERATE or qual in GENERATORS) and any(  # type: ignore[union-attr]
        keyword in _NEVER_ACCEPTED or keyword in rejected for keyword in keywords)


# Loading weights: seconds of MLX work, and the arrays belong to the loading thread's stream.
LOADS = frozenset(f"{pkg}{mod}.load" for pkg in _PACKAGES for mod in ("", ".utils"))
# A call whose name holds this loads a model (`*load_model*`: a substring test, no fnmatch) ...
_LOAD_WORD = "load_model"
# ... but not `unload_model` or `offload_model`, which free what a load made, nor `download_model` or
# `upload_model`, which move files (issue 23, set j: a pipecat server's `llm_manager.download_model`, a urllib
# download handed to a thread, was graded false).
_NOT_LOADING = ("unload", "offload", "download", "upload")
# An MLX package's own loaders (`mlx_audio.utils.load_model`, `SAMAudio.from_pretrained` of
# mlx_audio.sts): what they return is a model whose methods run MLX.
_MLX_LOADERS = frozenset({"load", "load_model", "from_pretrained"})
# What an MLX package also loads that is no model: text and audio front ends, configurations.
_NOT_MODELS = ("processor", "tokenizer", "feature_extractor", "config")
# mlx.nn.Module's bookkeeping: flags, parameter trees and submodule walks, no GPU work (its
# `load_weights` is loading and `save_weights` is MODEL_WEIGHT_SAVES). Accessors named `get_*`,
# `set_*`, `is_*` and `has_*` are taken to be the same.
MODULE_BOOKKEEPING = frozenset({
    "eval", "train", "freeze", "unfreeze", "parameters", "trainable_parameters", "children", "modules",
    "named_modules", "leaf_modules", "update", "update_modules", "apply", "apply_to_modules", "set_dtype",
    "filter_and_map", "keys", "values", "items", "get", "load_weights",
})
_ACCESSORS = ("get_", "set_", "is_", "has_", "__")
# mlx-lm's and mlx-vlm's calls, beyond generation and loading, that run array work on the calling
# thread: `prepare_inputs` builds the model's input arrays (mx.array), `save_prompt_cache` and
# `load_prompt_cache` evaluate and write, or read, a cache's arrays (mx.save_safetensors, mx.load),
# `load_adapters` loads weights into a live model; and a model class of `models.<arch>` builds its
# parameters. A name is not MLX work by its package alone: the packages' classes are objects
# (mlx-vlm's `PromptCacheState.__init__` sets two attributes to None), their text helpers are Python,
# and making, asking or trimming a prompt cache is bookkeeping in every cache class mlx-lm ships
# (`make_prompt_cache` builds cache objects holding no array, each `trim` moves an offset:
# mlx_lm/models/cache.py@d78bf58). Counting the package whole made INV120 report olmlx's trims of
# plain KV caches and optional imports of mlx-vlm functions that do not exist (graded false).
ARRAY_HELPERS = frozenset({"prepare_inputs", "save_prompt_cache", "load_prompt_cache", "load_adapters"})
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
# `mx.eval()` with no arrays evaluates nothing and waits for nothing, not even work `mx.async_eval` has in flight
# (measured on mlx 0.32.4: 10 us with five seconds of queued matmuls): C++ `eval` returns at once on no outputs since
# MLX 0.17.2 (ml-explore/mlx e64349b, 2024-08); before it, it waited on the default stream. Set m's
# hotwa/mlx-jaccl-cluster called it on the loop after each token (server/openai_cluster_server.py@c110f9a:1676, 1805,
# graded false blind). Projects on MLX older than 0.17.2 are not told apart (a version fact would).
NO_OP_CORE = frozenset({"mlx.core.eval"})
# Other MLX libraries' calls that run a whole task on the calling thread before returning: mlx-whisper's
# `transcribe` loads (or reuses) its model and decodes the whole audio (ml-explore/mlx-examples
# whisper/mlx_whisper/__init__.py re-exports transcribe.transcribe).
LIBRARY_TASKS = frozenset({"mlx_whisper.transcribe", "mlx_whisper.transcribe.transcribe"})
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


def core_work(qual: str) -> bool:
    """An `mlx.core` call that does array work: a name mlx.core has (mlx_core_names.py) that only reads
    counters or settings (HARMLESS_CORE) is none, and neither is a name it does not have."""
    if not qual.startswith("mlx.core."):
        return False
    name, _, rest = qual[len("mlx.core."):].partition(".")
    if name not in CORE_NAMES or (name in SUBMODULE_NAMES and rest.split(".", 1)[0] not in SUBMODULE_NAMES[name]):
        return False
    return not any(h in qual for h in HARMLESS_CORE)


def _imported_from_mlx(qual: str) -> bool:
    return qual.startswith(("mlx.", "mlx_lm.", "mlx_vlm.")) or qual in ("mlx", "mlx_lm", "mlx_vlm")


def is_mlx_loader(qual: str | None) -> bool:
    """A loader of an MLX package (`mlx_lm.load`, `mlx_audio.utils.load_model`, a model class's
    `from_pretrained` imported from `mlx_audio.sts`); a processor's or tokenizer's is left out."""
    if not qual or "." not in qual or not qual.startswith("mlx_"):
        return False
    if qual in LOADS:
        return True
    head, _, last = qual.rpartition(".")
    return last in _MLX_LOADERS and not any(word in head.lower() for word in _NOT_MODELS)


def _loader_call(value: cst.BaseExpression, qual: str | None) -> str | None:
    """"mlx" for a call of an MLX package's loader, "named" for one named like a model loader
    (`model_provider.load_model(name)`), else None."""
    if is_mlx_loader(qual):
        return "mlx"
    if isinstance(value, cst.Call) and not (qual or "").startswith(("mlx", "transformers")):
        if named_loader(dotted(value.func)):
            return "named"
    return None


def loaded_model(expr: cst.BaseExpression, ctx: FileContext, scope: int | None = None) -> str | None:
    """How the name or attribute `expr` was given a loaded model: "mlx" when an MLX package's loader
    returned it (`SAM_MODEL = SAMAudio.from_pretrained(path)`), "named" when a call named like a model
    loader did (`stt_model = model_provider.load_model(name)`), else None. Anywhere in the file; with
    `scope` (a def's node id, Assignment.scope), a bare name counts only where that def or the module
    body assigned it: the same short name (`model`) may be a model name string in another def."""
    key = ctx.key(expr)
    if key is None:
        return None
    assigned = (ctx.facts.assigned_in(key, scope) if scope is not None and "." not in key
                else ctx.facts.assigned.get(key, ()))
    kinds = {_loader_call(a.value, a.call_qual) for a in assigned}
    return "mlx" if "mlx" in kinds else ("named" if "named" in kinds else None)


def _model_method(site: CallSite, method: str, receiver: cst.BaseExpression, ctx: FileContext) -> bool:
    """A method of a model an MLX package's loader returned (in this def, the module body, or to an
    attribute) that is not the module's bookkeeping: the model's own computation (`separate_long`)."""
    if method in MODULE_BOOKKEEPING or method.startswith(_ACCESSORS):
        return False
    scope = ctx.facts.scope_of(site.node)
    return scope is not None and loaded_model(receiver, ctx, scope) == "mlx"


def package_array_work(qual: str | None) -> bool:
    """An mlx-lm or mlx-vlm call known to run array work on the calling thread (ARRAY_HELPERS, a
    model class's constructor); any other name of those packages is not MLX work by its module."""
    if not qual or not qual.startswith(tuple(f"{pkg}." for pkg in _PACKAGES)):
        return False
    head, _, last = qual.rpartition(".")
    return last in ARRAY_HELPERS or (last == "Model" and ".models." in f"{head}.")


# Inference engines other than MLX. In a file that imports one of them and no MLX, a model-named
# object is that engine's model: its `generate` blocks, but runs no MLX (LocalAI's transformers
# backend, a torch-only gRPC servicer beside its MLX ones, got "runs MLX" findings). `transformers`
# is not one: MLX servers import its tokenizers.
OTHER_ENGINES = frozenset({
    "torch", "tensorflow", "jax", "vllm", "llama_cpp", "ctranslate2", "faster_whisper", "onnxruntime",
    "openvino", "tensorrt_llm", "exllamav2",
})


def note_import(qual: str, ctx: FileContext) -> None:
    if _imported_from_mlx(qual):
        ctx.facts.imports_mlx = True
    elif qual.split(".", 1)[0] in OTHER_ENGINES:
        ctx.facts.imports_other_engine = True


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
    """A receiver named like the model (model-names): `self._model`, `text_model`; or one a model
    loader's result was assigned to (`stt_model = load_model(name)`, loaded_model). Guessed by name only
    where the model may be MLX's: not in a file that imports another engine (OTHER_ENGINES) and no MLX."""
    loaded = loaded_model(expr, ctx)
    if loaded == "mlx":
        return True
    if ctx.facts.imports_other_engine and not ctx.facts.imports_mlx:
        return False
    return matches_name(dotted(expr), ctx.shared["model-names"]) or loaded is not None


def is_mlx_generator(expr: cst.BaseExpression, ctx: FileContext, scope: int | None = None) -> bool:
    """A call to, or a name assigned from, `stream_generate` / `generate_step`, a model's stream method,
    or a generator def of this file whose body reaches MLX (own_generator; `scope` as there); also a
    lazy builtin over one (`zip(generate_step(...), range(n))`, `enumerate(stream_generate(...))`)."""
    if isinstance(expr, cst.Call):
        func = expr.func
        if isinstance(func, cst.Name) and func.value in LAZY:
            return any(is_mlx_generator(arg.value, ctx, scope) for arg in expr.args if not arg.star)
        if _makes_generator(func, ctx.call_qual(expr), ctx):
            return True
    elif ctx.facts.constructed_by(ctx.key(expr)) & GENERATORS:
        return True
    return own_generator(expr, ctx, lambda site: runs_mlx(site, ctx, loads=False) or forward_pass(site, ctx),
                         scope) is not None


def own_generator(expr: cst.BaseExpression, ctx: FileContext, direct: Callable[[CallSite], str | None],
                  scope: int | None = None) -> str | None:
    """What `direct` finds in the body of a generator def of this file (through the file's defs) that
    `expr` makes: a call of it (`tokens(prompt)`), or a name assigned one (`gen = tokens(prompt)`; with
    `scope`, a def's node id, only an assignment in that def or the module body counts). Iterating
    `expr` runs that body, so its MLX runs on the iterating thread; else None."""
    if isinstance(expr, cst.Call):
        calls = [expr]
    else:
        key = ctx.key(expr) or ""
        assigned = ctx.facts.assigned_in(key, scope) if scope is not None else ctx.facts.assigned.get(key, ())
        calls = [a.value for a in assigned if isinstance(a.value, cst.Call)]
    opened: set[int] = ctx.facts.memo.setdefault("own-generators-open", set())  # a generator stepping itself
    for call in calls:
        for function in generator_defs(call.func, ctx):
            if id(function.node) in opened:
                continue
            opened.add(id(function.node))
            try:
                found = ctx.facts.first_reaching(function, direct)
            finally:
                opened.discard(id(function.node))
            if found:
                return found
    return None


def forward_pass(site: CallSite, ctx: FileContext) -> str | None:
    """Calling the model object itself (`self.model(x)`, `model(tokens)`): a forward pass, or, for an
    engine's own model wrapper with a `__call__`, a whole generation. Either way MLX runs on the caller's
    thread (a lazy forward builds its graph there, on that thread's stream). A capitalised name
    (`Model(id=...)`) builds an object, usually a schema, and is left out."""
    func = site.node.func
    if isinstance(func, cst.Name | cst.Attribute) and not (terminal(func) or "")[:1].isupper() and is_model(func, ctx):
        return f"{site.text}(...)"
    return None


def named_loader(text: str | None) -> bool:
    """A call named like a model loader (`load_model`, `self._load_model_weights`); not one that unloads or
    moves files."""
    low = (text or "").lower()
    last = low.rsplit(".", 1)[-1]
    return _LOAD_WORD in low and not any(word in last for word in _NOT_LOADING)


def is_load_name(text: str | None, qual: str | None) -> bool:
    """Loading model weights, by the callee's qualified name (mlx-lm's `load`) or its text (`load_model_with_
    fallback`): start-up work. The per-file rules (`is_load`) and the package model ask it alike."""
    if qual in LOADS:
        return True
    return not (qual or "").startswith(("mlx", "transformers")) and named_loader(text)


def is_load(site: CallSite) -> bool:
    """Loading model weights: mlx-lm's `load`, or a call named like a model loader."""
    return is_load_name(site.text, site.qual)


def no_op(qual: str | None, arguments: int) -> bool:
    """A call of `qual` with `arguments` arguments (star ones included) that does no MLX work: `mx.eval()`."""
    return arguments == 0 and qual in NO_OP_CORE


def blocking(site: CallSite, ctx: FileContext, loads: bool = True) -> str | None:
    """The MLX call that blocks the calling thread, or binds MLX state to it, or None.

    `loads=False` leaves out loading weights: at start-up nothing else is served yet.
    """
    qual = site.qual
    if no_op(qual, len(site.node.args)):
        return None
    if qual in GENERATE or qual in BLOCKING_CORE or qual in BATCH_GENERATORS or qual in LIBRARY_TASKS:
        return site.text or qual
    if loads and is_load(site) and not ctx.facts.by_key.get(site.key or ""):
        return site.text or qual  # a def of this file named like a loader is judged by its body instead
    func = site.node.func
    if isinstance(func, cst.Attribute):
        method = func.attr.value
        if method not in GENERATOR_HARMLESS and is_batch_generator(func.value, ctx):
            return site.text
        if method in GENERATOR_MLX_METHODS and _looks_like_batch_generator(func.value, ctx):
            return site.text
        if (method in MODEL_GENERATION or method in MODEL_WEIGHT_SAVES) and is_model(func.value, ctx):
            return site.text
        if _model_method(site, method, func.value, ctx):
            return site.text
    if matches_name(site.text, ctx.shared["mlx-calls"]):
        return site.text
    if qual == "next" or (isinstance(func, cst.Name) and func.value == "next"):
        args = site.node.args
        if args and is_mlx_generator(args[0].value, ctx, ctx.facts.scope_of(site.node)):
            return "next() on an MLX generator"
    return None


def makes_generator(site: CallSite, ctx: FileContext) -> bool:
    """A call that only makes an MLX generator (`stream_generate(...)`, a model's stream method): no MLX runs
    until it is iterated."""
    return _makes_generator(site.node.func, site.qual, ctx)


def makes_generator_call(call: cst.Call, ctx: FileContext) -> bool:
    """`call` (an expression, not yet a recorded call site) makes an MLX generator."""
    return _makes_generator(call.func, ctx.call_qual(call), ctx)


def _makes_generator(func: cst.BaseExpression, qual: str | None, ctx: FileContext) -> bool:
    """Calling `func` (resolved to `qual`) makes an MLX generator: mlx-lm's or mlx-vlm's, or a model's stream method."""
    if qual in GENERATORS:
        return True
    return isinstance(func, cst.Attribute) and func.attr.value in MODEL_STREAMS and is_model(func.value, ctx)


def runs_mlx(site: CallSite, ctx: FileContext, loads: bool = True) -> str | None:
    """What `blocking` finds, or a call that makes a generator MLX runs in when iterated.

    For calls inside a helper: a helper that calls `stream_generate(...)` iterates it.
    """
    found = blocking(site, ctx, loads)
    if found:
        return found
    return (site.text or site.qual) if makes_generator(site, ctx) else None


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
    if no_op(qual, len(site.node.args)):
        return None
    if qual:
        if core_work(qual):
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
