"""Python's cyclic collector is paused while files are analyzed, and always turned back on.

Paused, it stops re-traversing the large acyclic trees the analysis keeps alive (a third
of the run on a 1.9 MB module, docs/benchmarks.md); left paused, it would leak every
later cycle of the process that embeds the checker.
"""

from __future__ import annotations

import gc

import pytest

from mlx_invariants.checker import analysis
from tests.invariants.conftest import BAD_LOCK, Project


def test_the_collector_is_paused_during_analysis_and_on_again_after(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    real = analysis.analyze_batch

    def watched(*args):
        seen.append(gc.isenabled())
        return real(*args)

    monkeypatch.setattr(analysis, "analyze_batch", watched)
    project.write("a.py", BAD_LOCK)
    assert gc.isenabled()
    assert project.run("check", "--no-cache", ".").code == 1
    assert seen == [False]
    assert gc.isenabled()


def test_the_collector_is_on_again_after_an_internal_error(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args):
        raise RuntimeError("a checker bug")

    monkeypatch.setattr(analysis, "analyze_batch", broken)
    project.write("a.py", BAD_LOCK)
    assert project.run("check", "--no-cache", ".").code == 2
    assert gc.isenabled()


def test_a_collector_the_caller_turned_off_stays_off(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    project.write("a.py", BAD_LOCK)
    gc.disable()
    try:
        assert project.run("check", "--no-cache", ".").code == 1
        assert not gc.isenabled()
    finally:
        gc.enable()
