"""Python's cyclic collector is paused while files are analyzed and during the package-wide steps,
and always turned back on.

Paused, it stops re-traversing the large acyclic trees the analysis keeps alive (a third
of the run on a 1.9 MB module, docs/benchmarks.md); left paused, it would leak every
later cycle of the process that embeds the checker.
"""

from __future__ import annotations

import gc

import pytest

from mlx_invariants.checker import analysis, runner
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


def test_the_package_wide_steps_leave_no_cycle(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """They run with the collector paused (runner._cyclic_gc_paused): a cycle left there, such as one
    holding a summarized file's ast tree, would stay in memory until the end of the run."""
    found: dict[str, int] = {}

    def counted(name, real):
        def run(*args, **kwargs):
            gc.collect()
            value = real(*args, **kwargs)
            found[name] = gc.collect()  # what became unreachable in between: cycles only
            return value
        return run

    monkeypatch.setattr(runner.phase, "package_findings", counted("model", runner.phase.package_findings))
    monkeypatch.setattr(runner.Unreferenced, "dead_lines", counted("unreferenced", runner.Unreferenced.dead_lines))
    project.write("pkg/__init__.py", "")
    project.write("pkg/helpers.py", "import mlx.core as mx\n\n\ndef step():\n    mx.eval(1)\n")
    project.write("pkg/engine.py", BAD_LOCK + """
from .helpers import step


class Server:
    async def handle(self):
        def inner():
            return step()

        await asyncio.to_thread(inner)
        return lambda: step()

    def _never_called(self):
        step()
""")
    assert project.run("check", "--no-cache", ".").code == 1
    assert found == {"model": 0, "unreferenced": 0}
