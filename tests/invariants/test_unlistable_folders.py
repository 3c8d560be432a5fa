"""A folder the checker cannot list is one INV000 line and exit 1, never a silent clean run.

The tests run as root, where a mode-000 folder still lists; a folder whose path is
longer than the system's path limit (PATH_MAX, 4096 bytes on Linux) cannot be
listed by anyone, root included, so that is the error these tests cause.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.invariants.conftest import BAD_LOCK, Project

_NAME = "d" * 200


def _too_deep(parent: Path) -> str:
    """Nest folders under `parent` until the innermost one's path is over 4096 bytes; put a bad
    file there. Built through directory descriptors, since the full path is too long to name.
    Returns the path of the deepest folder the system can still name, as the checker shows it."""
    levels = (4200 - len(str(parent))) // (len(_NAME) + 1) + 1
    fd = os.open(parent, os.O_RDONLY)
    try:
        for _ in range(levels):
            os.mkdir(_NAME, dir_fd=fd)
            inner = os.open(_NAME, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
        with open(os.open("hidden.py", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "w") as handle:
            handle.write(BAD_LOCK)
    finally:
        os.close(fd)
    return "/".join([parent.name] + [_NAME] * levels)


@pytest.fixture
def deep(project: Project):
    project.write("ok.py", "x = 1\n")
    (project.root / "pkg").mkdir()
    yield _too_deep(project.root / "pkg")
    shutil.rmtree(project.root / "pkg")  # fd-based on Linux: long paths are no obstacle


def test_a_folder_that_cannot_be_listed_is_reported_and_fails_the_run(project: Project, deep: str) -> None:
    run = project.run("check", "--no-cache", ".")
    assert run.code == 1, run.err
    [line] = run.lines()
    where, _, message = line.partition(": ")
    assert where.endswith(":1:1") and where.startswith("pkg/" + _NAME)
    assert message == "INV000 cannot check this folder: cannot read it: File name too long"
    assert "1 finding in 1 file" in run.err  # ok.py was checked; the folder is not counted as a file


def test_an_unlistable_folder_is_reported_again_on_a_cached_rerun(project: Project, deep: str) -> None:
    first = project.run("check", ".")
    again = project.run("check", ".")
    assert (again.code, again.lines()) == (first.code, first.lines()) == (1, first.lines())
    assert len(first.lines()) == 1


def test_an_unlistable_folder_named_on_the_command_line_is_reported(project: Project, deep: str) -> None:
    run = project.run("check", "--no-cache", "pkg")
    assert run.code == 1, run.err
    assert run.rules() == ["INV000"]


def test_an_excluded_unlistable_folder_is_not_reported(project: Project, deep: str) -> None:
    project.config('exclude = ["pkg/"]\n')
    run = project.run("check", "--no-cache", ".")
    assert (run.code, run.lines()) == (0, [])


def test_ignoring_inv000_silences_an_unlistable_folder(project: Project, deep: str) -> None:
    run = project.run("check", "--no-cache", "--ignore", "INV000", ".")
    assert (run.code, run.lines()) == (0, [])


@pytest.mark.skipif(os.geteuid() == 0, reason="root lists folders whatever their mode")
def test_a_chmod_000_folder_is_reported(project: Project) -> None:  # pragma: no cover - non-root only
    secret = project.write("secret/bad.py", BAD_LOCK).parent
    secret.chmod(0)
    try:
        run = project.run("check", "--no-cache", ".")
    finally:
        secret.chmod(0o755)
    assert run.code == 1, run.err
    assert run.lines() == ["secret:1:1: INV000 cannot check this folder: permission denied; make it readable or exclude it"]
