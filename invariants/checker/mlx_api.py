"""Which calls reach MLX, and which of them block the calling thread."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from mlx_invariants.checker.globs import matches_name
from mlx_invariants.checker.names import dotted

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
BLOCKING_CORE = frozenset({"mlx.core.eval", "mlx.core.synchronize"})
# mlx.core calls that read counters or settings and never encode GPU work.
_HARMLESS_CORE = (
    "is_available", "memory", "cache_limit", "memory_limit", "device_info", "default_device",
    "default_stream", "set_default_device", "wired_limit",
)


def _imported_from_mlx(qual: str) -> bool:
    return qual.startswith(("mlx.", "mlx_lm.", "mlx_vlm.")) or qual in ("mlx", "mlx_lm", "mlx_vlm")


def note_import(qual: str, ctx: FileContext) -> None:
    if _imported_from_mlx(qual):
        ctx.facts.imports_mlx = True


def is_batch_generator(expr: cst.BaseExpression, ctx: FileContext) -> bool:
    """A name or attribute this file assigned a `BatchGenerator(...)`."""
    return bool(ctx.facts.constructed_by(ctx.key(expr)) & BATCH_GENERATORS)


def is_mlx_generator(expr: cst.BaseExpression, ctx: FileContext) -> bool:
    """A call to, or a name assigned from, `stream_generate` / `generate_step`."""
    if isinstance(expr, cst.Call):
        return ctx.resolve(expr.func) in GENERATORS
    return bool(ctx.facts.constructed_by(ctx.key(expr)) & GENERATORS)


def blocking(site: CallSite, ctx: FileContext) -> str | None:
    """The MLX call that blocks the calling thread, or binds MLX state to it, or None."""
    if site.qual in GENERATE or site.qual in BLOCKING_CORE or site.qual in BATCH_GENERATORS:
        return site.text or site.qual
    func = site.node.func
    if isinstance(func, cst.Attribute) and is_batch_generator(func.value, ctx):
        return site.text
    if site.qual == "next" or (isinstance(func, cst.Name) and func.value == "next"):
        args = site.node.args
        if args and is_mlx_generator(args[0].value, ctx):
            return "next() on an MLX generator"
    return None


def reaches(site: CallSite, ctx: FileContext) -> str | None:
    """The MLX use this call makes (any mlx.core op, generation, a model call), or None."""
    found = blocking(site, ctx)
    if found:
        return found
    qual = site.qual
    if qual:
        if qual.startswith("mlx.core.") and not any(h in qual for h in _HARMLESS_CORE):
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
