"""Exceptions of the static checker.

    UsageError (mlx_invariants.errors)   bad command line: unknown rule id, missing path (exit 2)
     └── ConfigError                     bad `[tool.invariants]` table or `--config` file (exit 2)
    SourceError                          one file cannot be read or parsed; becomes an INV000 finding

Only `SourceError` is caught per file; a usage error ends the run with exit code 2.
"""

from __future__ import annotations

from mlx_invariants.errors import UsageError


class ConfigError(UsageError):
    """The configuration is invalid; the message names the file and the key."""


class SourceError(Exception):
    """A file cannot be checked; `line` is where the problem is, when known."""

    def __init__(self, reason: str, line: int = 1, col: int = 1) -> None:
        super().__init__(reason)
        self.reason = reason
        self.line = line
        self.col = col
