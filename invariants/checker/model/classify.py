"""Which direct calls are MLX, by the same tables the per-file rules use (`mlx_api`, `offload`).

Imported only when a file is summarized or a name re-exported from MLX is met while building
the model: `mlx_api` pulls in libcst, which a re-run of an unchanged tree never imports.
"""

from __future__ import annotations

from mlx_invariants.checker import mlx_api, offload
from mlx_invariants.checker.globs import matcher
from mlx_invariants.checker.model.summary import BLOCK, GEN, LOAD, TOUCH

TO_THREAD = offload.TO_THREAD
POOLS = offload.POOLS
THREAD_POOLS = offload.THREAD_POOLS
EXECUTOR_NAMES = offload.EXECUTOR_NAMES
GENERATORS = mlx_api.GENERATORS
BATCH_GENERATORS = mlx_api.BATCH_GENERATORS
GENERATOR_HARMLESS = mlx_api.GENERATOR_HARMLESS
MODEL_STREAMS = mlx_api.MODEL_STREAMS
STREAM_BINDING = mlx_api.STREAM_BINDING


def by_name(qual: str) -> str | None:
    """GEN, BLOCK, TOUCH or LOAD for a call of the imported name `qual`, else None. A call of an MLX
    generator (`stream_generate`) is none of these: it runs MLX only where it is iterated."""
    if qual in mlx_api.GENERATE or qual in mlx_api.BATCH_GENERATORS:
        return GEN
    if qual in mlx_api.BLOCKING_CORE or qual in mlx_api.LIBRARY_TASKS:
        return BLOCK
    if qual in mlx_api.LOADS:
        return LOAD
    if mlx_api.core_work(qual):
        return TOUCH
    return None


def is_generator(qual: str) -> bool:
    return qual in GENERATORS


def by_receiver(text: str, method: str, receiver: str, shared: dict, built_as_generator: bool) -> str | None:
    """The name-based wrappers engines use (in files that import MLX only): a model-named
    receiver's generate/chat (GEN) and save_weights (BLOCK), a batch generator's MLX methods and
    `mlx-calls` (GEN: the engine's steps generate)."""
    if method in mlx_api.MODEL_GENERATION and matcher(shared["model-names"])(receiver):
        return GEN
    if method in mlx_api.MODEL_WEIGHT_SAVES and matcher(shared["model-names"])(receiver):
        return BLOCK
    if method in mlx_api.GENERATOR_MLX_METHODS and (
        built_as_generator or matcher(shared["batch-generator-names"])(receiver)
    ):
        return GEN
    if matcher(shared["mlx-calls"])(text):
        return GEN
    return None


def is_forward_pass(text: str, shared: dict) -> bool:
    """Calling a model-named object (`self.model(x)`); a capitalised name builds an object instead."""
    return not text.rsplit(".", 1)[-1][:1].isupper() and matcher(shared["model-names"])(text)
