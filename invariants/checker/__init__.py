"""mlx-invariants' static checker: libcst tripwires for MLX serving concurrency bugs.

The public names are re-exported here lazily, so `import mlx_invariants.checker` stays free of libcst.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "Rule": "mlx_invariants.checker.rule",
    "Valid": "mlx_invariants.checker.rule",
    "Invalid": "mlx_invariants.checker.rule",
    "Finding": "mlx_invariants.checker.rule",
    "RULES": "mlx_invariants.checker.rules",
    "check_paths": "mlx_invariants.checker.runner",
    "check_source": "mlx_invariants.checker.runner",
    "Settings": "mlx_invariants.checker.config",
    "ConfigError": "mlx_invariants.checker.errors",
}

__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mlx_invariants.checker' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
