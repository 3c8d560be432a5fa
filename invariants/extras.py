"""Name the optional extra a subcommand needs, with its install line."""

from __future__ import annotations

import importlib


class MissingExtra(SystemExit):
    """Raised (as an exit with code 2) when an optional dependency is absent."""


def require(extra: str, *modules: str) -> None:
    """Import-check `modules`; exit 2 with the install line for `extra` if one is missing."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise MissingExtra(
                f"invariants: this command needs the '{extra}' extra ({exc.name or name} is missing); "
                f"install it with: pip install 'mlx-invariants[{extra}]'"
            ) from None
