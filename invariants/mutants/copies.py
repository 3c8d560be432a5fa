"""Copies of `engine/` with a mutant's edits: the one way any check gets a mutated engine.

Two kinds of copy, one function. `invariants mutants` puts the copy where a
workspace's `site/mlx_invariants/engine` points, and its layers import it in
subprocesses under the real name. The fuzz-kill tests import the copy in
their own process, where `mlx_invariants.engine` is already the unmutated
engine the copy is compared with, so there the copy is renamed: it becomes a
top-level package of its own, and every `mlx_invariants.engine` in its
sources (imports, logger names) names that package instead.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import shutil
import sys
from pathlib import Path
from typing import Optional

from mlx_invariants.mutants.mutant import Mutant

IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
_ENGINE_NAME = re.compile(r"\bmlx_invariants\.engine(?!\w)")


def copy_engine(source: Path, target: Path, mutant: Optional[Mutant] = None, package: Optional[str] = None) -> None:
    """Copy the engine folder `source` to `target`, apply `mutant`'s edits, then rename it to `package` if given.

    The edits apply before the rename, so an anchor or a replacement is always
    written against the engine as the repository has it.
    """
    if not (source / "__init__.py").is_file():
        raise FileNotFoundError(f"{source} is not the engine package; run `invariants mutants` from the repository")
    shutil.copytree(source, target, ignore=IGNORED)
    if mutant is not None:
        mutant.apply(target)
    if package is not None:
        for module in target.rglob("*.py"):
            module.write_text(_ENGINE_NAME.sub(package, module.read_text()))


def import_copy(mutant: Mutant, root: Path) -> str:
    """Import a renamed copy of the installed engine with `mutant` applied; return its package name.

    The copy is written under `root` (put on `sys.path`) once per process: a
    package cannot be imported twice, so a later call returns the one already
    loaded.
    """
    package = mutant.package
    if package not in sys.modules:
        target = root / package
        shutil.rmtree(target, ignore_errors=True)
        copy_engine(_installed_engine(), target, mutant, package=package)
        if str(root) not in sys.path:
            sys.path.insert(0, str(root))
        importlib.invalidate_caches()
        importlib.import_module(package)
    return package


def _installed_engine() -> Path:
    """The folder `mlx_invariants.engine` is imported from, found without importing it (or MLX)."""
    spec = importlib.util.find_spec("mlx_invariants.engine")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("mlx_invariants.engine is not installed; run `bash ci/setup.sh`")
    return Path(list(spec.submodule_search_locations)[0])
