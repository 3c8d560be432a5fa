"""mlx-invariants' static checker: libcst tripwires for MLX serving concurrency bugs.

The public names are re-exported here lazily, so `import invariants` (done by the
console script for every subcommand) stays free of libcst.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Rule": "invariants.rule",
    "Valid": "invariants.rule",
    "Invalid": "invariants.rule",
    "Finding": "invariants.rule",
    "RULES": "invariants.rules",
    "check_paths": "invariants.runner",
    "check_source": "invariants.runner",
    "Settings": "invariants.config",
    "InvariantsError": "invariants.errors",
    "ConfigError": "invariants.errors",
    "UsageError": "invariants.errors",
}

__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'invariants' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
