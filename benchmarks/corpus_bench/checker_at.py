"""`--checker-at COMMIT`: run `invariants check` as it stood at a commit of this project's history.

The commit's tree comes out of `git archive` into a temporary folder and is laid out the
way its own pyproject.toml installs it: each `[tool.setuptools.package-dir]` entry copied
to its import name (today `invariants/ -> mlx_invariants`, `engine/` and `fuzz/` -> its
subpackages), or, for the early commits that found their packages at the top of the tree,
the tree itself. The checker then runs through the commit's own `invariants` console
script entry (`module:function`) with that layout alone on PYTHONPATH, so an old commit's
rules can be scored on today's cases without installing anything.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the base install's tomli
    import tomli as tomllib  # type: ignore[no-redef]

PROJECT = Path(__file__).resolve().parents[2]
SCRIPT = "invariants"
_RULE_LINE = re.compile(r"^(INV\d{3})\b")


class CheckerError(Exception):
    """The commit cannot be read, or its tree holds no checker this benchmark can run."""


@dataclass(frozen=True)
class CheckerTree:
    commit: str  # the full hash
    date: str  # committer date, YYYY-MM-DD
    subject: str
    pythonpath: Path  # the folder that makes the commit's packages importable
    entry: tuple[str, str]  # the console script's (module, function)

    @property
    def short(self) -> str:
        return self.commit[:7]

    def command(self, args: list[str]) -> list[str]:
        """The command line of `invariants ARGS` at this commit, for this interpreter."""
        module, function = self.entry
        # `-c` puts the working folder first on sys.path; drop it, so that only this tree
        # can provide the packages (not an `invariants/` folder of wherever it runs).
        code = (f"import sys; sys.path[:1] = [] if sys.path[:1] == [''] else sys.path[:1]; "
                f"sys.argv[0] = {SCRIPT!r}; from {module} import {function}; sys.exit({function}())")
        return [sys.executable, "-c", code, *args]

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """`base` with only this tree on PYTHONPATH (ahead of the venv's own, editable, install)."""
        return {**base, "PYTHONPATH": str(self.pythonpath)}

    def rules(self) -> list[str]:
        """The rule ids (INV1xx and up) the commit's `invariants rules` lists."""
        done = subprocess.run(self.command(["rules"]), capture_output=True, text=True, env=self.env(dict(os.environ)))
        if done.returncode != 0:
            raise CheckerError(f"`invariants rules` at {self.short} failed (exit {done.returncode}): "
                               f"{done.stderr.strip()[-400:]}")
        found = (_RULE_LINE.match(line) for line in done.stdout.splitlines())
        return [m.group(1) for m in found if m and m.group(1) >= "INV100"]


def _git(repo: Path, args: list[str]) -> bytes:
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True)
    except OSError as exc:
        raise CheckerError(f"cannot run git ({exc.strerror or exc})") from None
    if done.returncode != 0:
        error = done.stderr.decode(errors="replace").strip().splitlines()
        raise CheckerError(f"{repo}: `git {' '.join(args)}` failed ({error[-1] if error else done.returncode}); "
                           "a shallow clone lacks old commits: `git fetch --unshallow`")
    return done.stdout


def resolve(repo: Path, commit: str) -> tuple[str, str, str]:
    """(full hash, date, subject) of `commit` in `repo`."""
    out = _git(repo, ["log", "-1", "--format=%H%n%cs%n%s", f"{commit}^{{commit}}", "--"]).decode()
    full, date, subject = (out.splitlines() + ["", "", ""])[:3]
    return full, date, subject


def _entry(pyproject: dict, short: str) -> tuple[str, str]:
    target = pyproject.get("project", {}).get("scripts", {}).get(SCRIPT)
    if not isinstance(target, str) or target.count(":") != 1:
        raise CheckerError(f"{short}: its pyproject.toml declares no `{SCRIPT} = \"module:function\"` script; "
                           "that commit has no checker to run")
    module, function = (part.strip() for part in target.split(":"))
    return module, function


def _layout(src: Path, pyproject: dict, dest: Path) -> Path:
    """The folder to put on PYTHONPATH: the packages under their import names, by `package-dir`."""
    package_dir = pyproject.get("tool", {}).get("setuptools", {}).get("package-dir") or {}
    if not package_dir:
        return src  # packages found at the top of the tree (the early layout)
    if "" in package_dir:
        root = src / package_dir[""]
        if len(package_dir) == 1:
            return root
    else:
        root = None
    # Outer packages first, so a subpackage's folder is copied into its parent's copy.
    for name, folder in sorted(((n, f) for n, f in package_dir.items() if n), key=lambda item: item[0].count(".")):
        target = dest.joinpath(*name.split("."))
        shutil.copytree(src / folder, target, dirs_exist_ok=True)
    if root is not None:  # the rest of the packages live under the root folder
        shutil.copytree(root, dest, dirs_exist_ok=True)
    return dest


def build(commit: str, workdir: Path, repo: Path = PROJECT) -> CheckerTree:
    """The checker of `commit` (of the git repository `repo`) laid out under `workdir`."""
    full, date, subject = resolve(repo, commit)
    src, packages = workdir / "src", workdir / "packages"
    src.mkdir(parents=True)
    packages.mkdir()
    with tempfile.TemporaryFile() as archive:
        archive.write(_git(repo, ["archive", "--format=tar", full]))
        archive.seek(0)
        with tarfile.open(fileobj=archive) as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(src, filter="data")
            else:  # a Python without extraction filters; the archive is this project's own
                tar.extractall(src)
    try:
        pyproject = tomllib.loads((src / "pyproject.toml").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckerError(f"{full[:7]}: cannot read its pyproject.toml ({exc})") from None
    entry = _entry(pyproject, full[:7])
    try:
        pythonpath = _layout(src, pyproject, packages)
    except OSError as exc:
        raise CheckerError(f"{full[:7]}: cannot lay out its packages ({exc})") from None
    return CheckerTree(full, date, subject, pythonpath, entry)
