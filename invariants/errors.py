"""Exceptions of the static checker.

    InvariantsError          anything the checker reports instead of a traceback (exit 2)
     ├── ConfigError         bad `[tool.invariants]` table or `--config` file
     ├── UsageError          bad command line: unknown rule id, missing path
     └── SourceError         one file cannot be read or parsed; becomes an INV000 finding

Only `SourceError` is caught per file; the other two end the run with exit code 2.
"""

from __future__ import annotations


class InvariantsError(Exception):
    """A problem the checker explains in one sentence instead of a traceback."""


class ConfigError(InvariantsError):
    """The configuration is invalid; the message names the file and the key."""


class UsageError(InvariantsError):
    """The command line asks for something that does not exist."""


class SourceError(InvariantsError):
    """A file cannot be checked; `line` is where the problem is, when known."""

    def __init__(self, reason: str, line: int = 1, col: int = 1) -> None:
        super().__init__(reason)
        self.reason = reason
        self.line = line
        self.col = col
