"""Streams made at import, and the defs that read them: what INV131 asks of a file's summary.

`STREAM = mx.new_stream(mx.default_device())` at module level runs once, on the thread that
first imports the module. From MLX 0.31.2 a stream belongs to the thread that made it (mlx_facts,
`thread-local-streams`), so a def that reads it on another thread (`with mx.stream(STREAM):`,
`wired_limit(model, [STREAM])`, `mx.synchronize(STREAM)`) raises "There is no Stream(gpu, N) in
current thread". mlx-lm's own `generation_stream` was such a stream before 0.31.3, and mlx-vlm's
before 0.5.0 (`thread-local-generation-stream`).

A summary keeps, per file, the module-level names bound once, to `mx.new_stream(...)` (a name
bound twice, as in a fallback from `new_thread_local_stream`, is not one), and, per def, the
module-level names its own body reads that are such a stream or an import named like one (`...stream`:
another module's stream, resolved by the package). Files that neither make one nor import one are
not walked at all.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from typing import Any


NEW_STREAM = "mlx.core.new_stream()"
# The generation libraries' module-level streams: made at import before their thread-local releases.
LIBRARY_STREAMS = ("mlx_lm.generate.generation_stream", "mlx_vlm.generate.generation_stream")


def made(resolver: Any) -> dict[str, ast.Call]:
    """The module-level names of the file bound once, to an `mx.new_stream(...)` call."""
    found = {}
    for name, values in resolver.module.bindings.items():
        if len(values) == 1 and isinstance(values[0], ast.Call) and resolver.ref(values[0], None) == NEW_STREAM:
            found[name] = values[0]
    return found


def candidates(resolver: Any, streams: dict[str, ast.Call]) -> frozenset[str]:
    """The module-level names a def may read a stream through: the file's own streams, and imports whose
    local name ends in `stream` (`generation_stream`, `_STREAM`)."""
    imported = {name for name, values in resolver.module.bindings.items()
                if name.lower().endswith("stream") and any(isinstance(v, str) for v in values)}
    return frozenset(streams) | frozenset(imported)


def read(resolver: Any, fn: Any, own: list[ast.AST], names: frozenset[str], library: bool
         ) -> Iterator[tuple[str, ast.AST]]:
    """(reference, node) of each module-level stream `fn`'s own body (its nodes: `own`, scan.own_nodes)
    reads: `:NAME` for the file's own, the import's reference for an imported one; with `library`, also
    `mlx_lm.generate.generation_stream` written out as an attribute."""
    for node in own:
        if isinstance(node, ast.Name) and node.id in names and isinstance(node.ctx, ast.Load):
            if _bound_in(fn, node.id):
                continue
            values = resolver.module.bindings[node.id]
            ref = f":{node.id}" if not isinstance(values[0], str) else values[0]
            if len(values) == 1 or ref.startswith(":"):
                yield ref, node
        elif library and isinstance(node, ast.Attribute) and node.attr == "generation_stream":
            ref = resolver.ref(node, fn)
            if ref in LIBRARY_STREAMS:
                yield ref, node


def _bound_in(fn: Any, name: str) -> bool:
    """`name` is a local of `fn` or of a def around it (not a `global`), so not the module's."""
    scope = fn
    while scope is not None:
        if name in scope.bindings and name not in scope.nonlocal_names:
            return True
        scope = scope.parent
    return False
