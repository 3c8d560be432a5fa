"""Which Python a checked file is written for: the lower bound of `requires-python` in the
nearest pyproject.toml above it that declares one.

The grammar a file is judged by must not be the grammar of whatever Python runs the
checker: under 3.11, CPython's own parser calls `class Box[T]:` (3.12) a syntax error in
a project that requires 3.13. A file under no such pyproject gets the newest grammar the
checker knows (`None` here).

Only what a syntax verdict needs: `X.Y` from `>=X.Y`, `~=X.Y`, `==X.Y.*`, `>X.Y`;
several clauses give the highest of their lower bounds; upper bounds and exclusions are
ignored; a specifier with no lower bound, or one that cannot be read, counts as none.
"""

from __future__ import annotations

import os
import re
import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

Version = tuple[int, int]
_CLAUSE = re.compile(r"\s*(~=|===|==|>=|>)\s*v?(\d+)(?:\.(\d+))?")


def lower_bound(specifier: str) -> Version | None:
    """The oldest `major.minor` a `requires-python` specifier allows, or None if it sets no floor."""
    floor: Version | None = None
    for clause in specifier.split(","):
        match = _CLAUSE.match(clause)
        if match is None:
            continue
        version = (int(match.group(2)), int(match.group(3) or 0))
        if floor is None or version > floor:
            floor = version
    return floor


def requires_python(pyproject: str) -> Version | None:
    """The floor of `[project] requires-python` in this file; None if absent or unreadable."""
    try:
        with open(pyproject, "rb") as handle:
            data = tomllib.load(handle)
    except (OSError, ValueError):  # tomllib.TOMLDecodeError is a ValueError
        return None
    project = data.get("project")
    specifier = project.get("requires-python") if isinstance(project, dict) else None
    return lower_bound(specifier) if isinstance(specifier, str) else None


def text(version: Version | None) -> str:
    return "newest" if version is None else f"{version[0]}.{version[1]}"


class Targets:
    """The target version of each file, looked up once per folder."""

    def __init__(self) -> None:
        self._folders: dict[str, Version | None] = {}

    def of(self, path: str) -> Version | None:
        return self._folder(os.path.dirname(os.path.abspath(path)))

    def _folder(self, folder: str) -> Version | None:
        if folder in self._folders:
            return self._folders[folder]
        found: Version | None = None
        candidate = os.path.join(folder, "pyproject.toml")
        if os.path.isfile(candidate):
            found = requires_python(candidate)
        if found is None:
            parent = os.path.dirname(folder)
            found = self._folder(parent) if parent != folder else None
        self._folders[folder] = found
        return found
