"""Local bare git mirrors, and one commit's files laid out as a tree to check.

Code read from a mirror is only ever written into a temporary folder: none of it
is kept in this project.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path, PurePosixPath

ENV = "MLX_INVARIANTS_MIRRORS"
DEFAULT_ROOT = Path("/work/.mirror")
SOURCE_SUFFIXES = (".py", ".pyi")
REGULAR_FILE_MODES = ("100644", "100755")


class MirrorError(Exception):
    """A mirror is missing or lacks a commit or file; the message says how to get it."""


def default_root() -> Path:
    return Path(os.environ.get(ENV) or DEFAULT_ROOT)


def git_dir_at(folder: Path) -> Path | None:
    """The git directory at `folder`: a bare mirror, the `repo/` (`repo/.git`) inside it that `fetch` lays out, or
    a clone's `.git`; None when there is none."""
    for candidate in (folder, folder / "repo", folder / "repo" / ".git", folder / ".git"):
        if (candidate / "HEAD").is_file() and (candidate / "objects").is_dir():
            return candidate
    return None


def find(root: Path, repo: str) -> Mirror:
    """The mirror of OWNER/NAME: a git directory at ROOT/OWNER+NAME (or its repo/, repo/.git)."""
    folder = root / repo.replace("/", "+")
    found = git_dir_at(folder)
    if found is not None:
        return Mirror(repo, found)
    raise MirrorError(
        f"no mirror of {repo} under {root} (looked for a git directory at {folder}); get it with "
        f"`git clone --mirror https://github.com/{repo} {folder}`, or point --mirrors (or {ENV}) at "
        "the folder that holds it"
    )


class Mirror:
    def __init__(self, repo: str, git_dir: Path) -> None:
        self.repo = repo
        self.git_dir = git_dir

    def _git(self, args: list[str], stdin: bytes | None = None) -> bytes:
        done = subprocess.run(["git", f"--git-dir={self.git_dir}", *args], input=stdin, capture_output=True)
        if done.returncode != 0:
            error = done.stderr.decode(errors="replace").strip().splitlines()
            raise MirrorError(
                f"{self.repo}: `git {' '.join(args)}` failed ({error[-1] if error else done.returncode}); "
                f"if the mirror is older than the case, update it: git --git-dir={self.git_dir} fetch"
            )
        return done.stdout

    def head(self) -> str:
        """The newest commit of the default branch."""
        return self._git(["rev-parse", "--verify", "HEAD^{commit}"]).decode().strip()

    def _files(self, commit: str, pathspecs: list[str] | None, recursive: bool) -> dict[str, str]:
        """path -> blob id of the regular files `git ls-tree` lists for these pathspecs (None: the top folder)."""
        if pathspecs == []:
            return {}
        args = ["ls-tree", "-z", *(["-r"] if recursive else []), f"{commit}^{{tree}}", "--", *(pathspecs or [])]
        found = {}
        for entry in self._git(args).split(b"\0"):
            if not entry:
                continue
            meta, path = entry.decode(errors="surrogateescape").split("\t", 1)
            mode, kind, blob = meta.split(" ")
            if kind == "blob" and mode in REGULAR_FILE_MODES:
                found[path] = blob
        return found

    def _write(self, files: dict[str, str], dest: Path) -> None:
        """Write each listed blob under `dest` at its repository path, read in one `git cat-file`."""
        blobs = list(dict.fromkeys(files.values()))
        out = self._git(["cat-file", "--batch"], "".join(f"{b}\n" for b in blobs).encode())
        contents, at = {}, 0
        for blob in blobs:
            header_end = out.index(b"\n", at)
            size = int(out[at:header_end].split(b" ")[2])
            contents[blob] = out[header_end + 1 : header_end + 1 + size]
            at = header_end + 1 + size + 1
        for path, blob in files.items():
            target = dest / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(contents[blob])

    def materialise(self, commit: str, path: str, dest: Path) -> Path:
        """`path` at `commit` under `dest`, with the .py/.pyi files of its folder, every .py/.pyi
        file of the package it belongs to (the folder of its topmost `__init__.py`: what the checker
        reads to tell a def its package never names, model/unreferenced.py) and the `__init__.py` of
        each parent package, at the same commit; returns the file under test."""
        folder = PurePosixPath(path).parent
        siblings = self._files(commit, [f"{folder}/"] if str(folder) != "." else None, recursive=False)
        if path not in siblings:
            raise MirrorError(f"{self.repo}: commit {commit} has no file {path}")
        files = {p: b for p, b in siblings.items() if p.endswith(SOURCE_SUFFIXES)}
        files[path] = siblings[path]
        inits = self._files(commit, _parent_inits(folder), recursive=False)
        files.update(inits)
        top = _top_package(folder, set(inits) | set(siblings))
        if top is not None:
            files.update({p: b for p, b in self._files(commit, [f"{top}/"], recursive=True).items()
                          if p.endswith(SOURCE_SUFFIXES)})
        self._write(files, dest)
        return dest / path

    def materialise_package(self, commit: str, folder: str, dest: Path) -> Path:
        """Every .py/.pyi file under `folder` at `commit`, with the parent packages' `__init__.py`."""
        files = {p: b for p, b in self._files(commit, [f"{folder}/"], recursive=True).items()
                 if p.endswith(SOURCE_SUFFIXES)}
        if not files:
            raise MirrorError(f"{self.repo}: commit {commit} has no Python files under {folder}/")
        files.update(self._files(commit, _parent_inits(PurePosixPath(folder)), recursive=False))
        self._write(files, dest)
        return dest / folder


def _top_package(folder: PurePosixPath, present: set[str]) -> PurePosixPath | None:
    """The outermost folder of the unbroken chain of packages (an `__init__.py` in each) that ends at
    `folder`; None when `folder` is not a package."""
    top = None
    current = folder
    while str(current) != "." and f"{current}/__init__.py" in present:
        top, current = current, current.parent
    return top


def _parent_inits(folder: PurePosixPath) -> list[str]:
    """`a/__init__.py`, `a/b/__init__.py`, ... for the packages above `folder` (not `folder` itself)."""
    parts = folder.parts if str(folder) != "." else ()
    return [f"{PurePosixPath(*parts[:n])}/__init__.py" for n in range(1, len(parts))]
