"""Module names from the file system: how far up `__init__.py` files go."""

from __future__ import annotations

import os


class Layout:
    """Which package a file belongs to, and its dotted module name there."""

    def __init__(self) -> None:
        self._package_dirs: dict[str, bool] = {}

    def _is_package_dir(self, folder: str) -> bool:
        found = self._package_dirs.get(folder)
        if found is None:
            found = self._package_dirs[folder] = os.path.isfile(os.path.join(folder, "__init__.py"))
        return found

    def module_of(self, path: str) -> tuple[str, str, bool]:
        """(root, dotted module name, is a package's `__init__`)."""
        folder, name = os.path.split(os.path.abspath(path))
        stem = name[:-3]
        parts = [] if stem == "__init__" else [stem]
        while self._is_package_dir(folder):
            folder, package = os.path.split(folder)
            parts.insert(0, package)
            if not package:
                break
        if not parts:  # an `__init__.py` in a folder that is not a package: impossible, but harmless
            parts = [stem]
        return folder, ".".join(parts), stem == "__init__"
