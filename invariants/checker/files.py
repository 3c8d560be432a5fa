"""Which files a run checks: the paths given, recursed, minus excludes and .gitignore.

A folder that cannot be listed is part of the answer too, with its reason: skipping it
would report a clean run over code nobody checked.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
import pathspec

from mlx_invariants.checker.config import Settings
from mlx_invariants.checker.source import os_reason
from mlx_invariants.errors import UsageError


@dataclass(frozen=True)
class SourceFile:
    display: str  # as the user will see it: relative to the current folder when inside it
    path: str  # absolute
    relpath: str  # relative to the project root, '/'-separated, for config globs
    problem: str | None = None  # set for a folder that cannot be listed: why, as INV000 says it


def _excludes(settings: Settings) -> pathspec.GitIgnoreSpec:
    lines = list(settings.exclude)
    if settings.respect_gitignore:
        try:
            lines += (settings.root / ".gitignore").read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            pass
    return pathspec.GitIgnoreSpec.from_lines(lines)


def _relative(path: str, base: str) -> str | None:
    rel = os.path.relpath(path, base)
    return None if rel == ".." or rel.startswith(".." + os.sep) else rel.replace(os.sep, "/")


def _display(path: str, cwd: str) -> str:
    return _relative(path, cwd) or path


def discover(paths: list[str], settings: Settings, force_exclude: bool = False) -> list[SourceFile]:
    """Every Python file under `paths`. A path named on the command line is checked even if
    excluded (unless `force_exclude`); files inside it honour the excludes."""
    spec = _excludes(settings)
    root = str(settings.root)
    cwd = os.getcwd()
    found: dict[str, SourceFile] = {}

    def add(path: str, problem: str | None = None) -> None:
        rel = _relative(path, root) or _display(path, cwd).replace(os.sep, "/")
        found.setdefault(path, SourceFile(_display(path, cwd), path, rel, problem))

    def unlistable(exc: OSError) -> None:
        folder = exc.filename if isinstance(exc.filename, str) else path
        add(folder, f"cannot check this folder: {os_reason(exc, folder)}")

    for given in paths:
        path = os.path.abspath(given)
        if not os.path.lexists(path):
            raise UsageError(f"{given}: no such file or directory")
        rel_root = _relative(path, root)
        if not os.path.isdir(path):
            if not (force_exclude and rel_root is not None and spec.match_file(rel_root)):
                add(path)
            continue
        # Excludes are matched below the folder the user named, relative to the
        # project root; if that folder is itself excluded (say, a package inside
        # .venv), relative to the folder.
        excluded_itself = rel_root not in (None, ".") and spec.match_file(rel_root + "/")
        if excluded_itself and force_exclude:
            continue
        base = path if rel_root is None or excluded_itself else root
        for folder, dirs, files in os.walk(path, onerror=unlistable):
            dirs[:] = sorted(
                d for d in dirs
                if not os.path.islink(os.path.join(folder, d))
                and not spec.match_file((_relative(os.path.join(folder, d), base) or d) + "/")
            )
            for name in sorted(files):
                if not name.endswith(".py"):
                    continue
                full = os.path.join(folder, name)
                if not spec.match_file(_relative(full, base) or name):
                    add(full)
    return sorted(found.values(), key=lambda f: f.display)

