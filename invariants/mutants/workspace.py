"""A temporary copy of the engine and its tests, with one mutant applied.

The copy keeps the repository's layout (`engine/`, `tests/engine/`); its
engine is made by `copies.copy_engine`, as every mutated engine is. The
checks run in subprocesses whose PYTHONPATH starts with `site/`, a `mlx_invariants` package
laid out as the wheel installs it: this harness's own package and fuzzer (the
ones running now), with `engine` linked to the copy. `import mlx_invariants.engine` then
finds the mutant. The engine tests are copied because pytest puts the rootdir
of the `tests` package first on `sys.path`: run from the copy, that rootdir is
the copy.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional

import mlx_invariants
import mlx_invariants.fuzz
from mlx_invariants.mutants.copies import IGNORED, copy_engine
from mlx_invariants.mutants.mutant import Mutant

# What a copy holds besides the engine: the engine tests and what they import, and the pytest settings.
COPIED = ("tests/__init__.py", "tests/conftest.py", "tests/engine", "pyproject.toml")


class Workspace:
    """`with Workspace(repo, mutant) as ws:` a fresh copy under `ws.root`, removed on exit."""

    def __init__(self, repo: Path, mutant: Optional[Mutant] = None):
        self.repo = repo
        self.mutant = mutant
        self.root = Path()
        self._tmp: Optional[tempfile.TemporaryDirectory] = None

    def __enter__(self) -> "Workspace":
        label = self.mutant.id if self.mutant else "baseline"
        self._tmp = tempfile.TemporaryDirectory(prefix=f"invariants-mutant-{label}-")
        self.root = Path(self._tmp.name)
        try:
            self._copy()
        except BaseException:
            self._tmp.cleanup()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()

    def _copy(self) -> None:
        copy_engine(self.repo / "engine", self.engine_dir, self.mutant)
        for name in COPIED:
            source, target = self.repo / name, self.root / name
            if source.is_dir():
                shutil.copytree(source, target, ignore=IGNORED)
            elif source.is_file():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)
        self._lay_out_package()

    def _lay_out_package(self) -> None:
        """`site/mlx_invariants` as installed: this harness's folders, the engine the mutated copy."""
        package = self.root / "site" / "mlx_invariants"
        own = Path(mlx_invariants.__path__[0])

        def ignored(folder: str, names: list[str]) -> set[str]:  # an installed wheel nests engine/ and fuzz/
            nested = {"engine", "fuzz"} if Path(folder) == own else set()
            return set(IGNORED(folder, names)) | (nested & set(names))
        shutil.copytree(own, package, ignore=ignored)
        shutil.copytree(mlx_invariants.fuzz.__path__[0], package / "fuzz", ignore=IGNORED)
        (package / "engine").symlink_to(self.engine_dir, target_is_directory=True)

    @property
    def engine_dir(self) -> Path:
        return self.root / "engine"

    def env(self) -> dict[str, str]:
        """The environment of every check: the copy first on the import path, no bytecode left behind."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(self.root / "site"), env.get("PYTHONPATH", "")) if p)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        return env
