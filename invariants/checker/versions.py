"""Which Python a checked file is written for: the lower bound of `requires-python` in the
nearest pyproject.toml above it that declares one.

The grammar a file is judged by must not be the grammar of whatever Python runs the
checker: under 3.11, CPython's own parser calls `class Box[T]:` (3.12) a syntax error in
a project that requires 3.13. A file under no such pyproject gets the newest grammar the
checker knows (`None` here).

Only what a verdict needs: the floor of a PEP 440 specifier, `X.Y.Z` from `>=X.Y.Z`,
`~=X.Y.Z`, `==X.Y.*`, `===X.Y.Z`, `>X.Y.Z` (itself: the floor never claims more than the
specifier says); several clauses give the highest of their lower bounds; upper bounds and
exclusions are ignored; a specifier with no lower bound, or one that cannot be read, counts
as none. The same grammar reads the MLX versions a project pins (`pins.py`).
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
# (major, minor, micro, 1), or 0 last for a pre-release of it, which comes before the release.
Release = tuple[int, int, int, int]
_CLAUSE = re.compile(r"\s*(~=|===|==|>=|>)\s*v?(\d+(?:\.\d+)*)(?:\.\*)?\s*((?:[A-Za-z._+-][A-Za-z0-9._+-]*)?)")
_VERSION = re.compile(r"v?\d+(?:\.\d+)*(?:[._-]?(?:a|b|c|rc|alpha|beta|pre|preview|dev|post)[._-]?\d*)*",
                      re.IGNORECASE)
_PRE = re.compile(r"[._-]?(a|b|c|rc|alpha|beta|pre|preview|dev)", re.IGNORECASE)


def release(text: str) -> Release | None:
    """`0.31.2` -> (0, 31, 2, 1), `0.32.0rc1` -> (0, 32, 0, 0); None if it is no version."""
    if _VERSION.fullmatch(text.strip()) is None:
        return None
    match = _CLAUSE.match(">=" + text.strip())
    return _release(match) if match is not None else None


def _release(match: re.Match[str]) -> Release:
    parts = [int(p) for p in match.group(2).split(".")][:3]
    parts += [0] * (3 - len(parts))
    final = 0 if _PRE.match(match.group(3) or "") else 1
    return parts[0], parts[1], parts[2], final


def release_floor(specifier: str) -> Release | None:
    """The lowest release a specifier admits (the highest of its lower bounds), or None if it sets none."""
    floor: Release | None = None
    for clause in specifier.split(","):
        match = _CLAUSE.match(clause)
        if match is None:
            continue
        version = _release(match)
        if floor is None or version > floor:
            floor = version
    return floor


def release_text(version: Release) -> str:
    return f"{version[0]}.{version[1]}.{version[2]}" + ("" if version[3] else " (a pre-release)")


def lower_bound(specifier: str) -> Version | None:
    """The oldest `major.minor` a `requires-python` specifier allows, or None if it sets no floor."""
    floor = release_floor(specifier)
    return None if floor is None else (floor[0], floor[1])


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
