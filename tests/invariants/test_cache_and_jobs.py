"""A re-run reads only what changed; --jobs N gives the same findings as one process."""

from __future__ import annotations

import os
import subprocess
import sys

from mlx_invariants.checker import config, runner
from mlx_invariants.checker.rules import RULES
from mlx_invariants.checker.runner import check_paths
from tests.invariants.conftest import BAD_LOCK, Project


def _settings(project: Project) -> config.Settings:
    return config.load(None, project.root, RULES)


def test_unchanged_files_come_from_the_cache(project: Project) -> None:
    project.write("a.py", BAD_LOCK)
    project.write("b.py", "def f():\n    return 1\n")
    first = check_paths(["."], _settings(project))
    assert first.analyzed == 2 and [f.rule for f in first.findings] == ["INV105"]
    again = check_paths(["."], _settings(project))
    assert again.analyzed == 0 and again.findings == first.findings
    assert (project.root / ".invariants_cache" / ".gitignore").read_text().strip().endswith("*")


def test_an_edited_file_is_checked_again(project: Project) -> None:
    path = project.write("a.py", BAD_LOCK)
    check_paths(["."], _settings(project))
    path.write_text(BAD_LOCK.replace("await asyncio.to_thread(step)", "step()"))
    after = check_paths(["."], _settings(project))
    assert after.analyzed == 1 and after.findings == []


def test_a_touched_but_identical_file_is_not_parsed_again(project: Project) -> None:
    path = project.write("a.py", BAD_LOCK)
    check_paths(["."], _settings(project))
    os.utime(path, ns=(1, 1))
    after = check_paths(["."], _settings(project))
    assert after.analyzed == 0 and [f.rule for f in after.findings] == ["INV105"]


def test_a_config_change_invalidates_the_cache(project: Project) -> None:
    project.write("h.py", """
        import asyncio

        async def handle(engine, request):
            return await asyncio.wait_for(engine.generate(request), timeout=8)
    """)
    project.config('select = ["INV", "INV101"]\n')  # INV101 is opt-in
    assert [f.rule for f in check_paths(["."], _settings(project)).findings] == ["INV101"]
    project.config('select = ["INV", "INV101"]\n[tool.invariants.INV101]\nmax-seconds = 10\n')
    assert check_paths(["."], _settings(project)).findings == []


def test_balanced_chunks_spread_the_cost() -> None:
    assert runner._balanced_chunks([100, 1, 1, 1, 50, 50], 2) == [[0, 1, 3], [4, 5, 2]]
    assert runner._balanced_chunks([5], 4) == [[0]]


def test_a_corrupt_cache_is_rebuilt(project: Project) -> None:
    project.write("a.py", BAD_LOCK)
    check_paths(["."], _settings(project))
    for cache_file in (project.root / ".invariants_cache").glob("results-*.json"):
        cache_file.write_text("{not json")
    assert [f.rule for f in check_paths(["."], _settings(project)).findings] == ["INV105"]


def test_cache_dir_from_config_and_no_cache_flag(project: Project) -> None:
    project.write("a.py", BAD_LOCK)
    project.config('cache-dir = "build/inv-cache"\n')
    assert project.run("check", "--no-cache").code == 1
    assert not (project.root / "build").exists()
    assert project.run("check").code == 1
    assert list((project.root / "build" / "inv-cache").glob("results-*.json"))


def test_jobs_2_finds_what_one_process_finds(project: Project, monkeypatch) -> None:
    monkeypatch.setattr(runner, "_SMALL_RUN_CHARS", 0)  # use the processes even for this small tree
    for index in range(12):
        project.write(f"pkg/m{index}.py", BAD_LOCK if index % 3 == 0 else "import asyncio\nx = 1\n")
    project.write("pkg/broken.py", "def f(:\n")
    one = check_paths(["pkg"], _settings(project), jobs=1, use_cache=False)
    two = check_paths(["pkg"], _settings(project), jobs=2, use_cache=False)
    assert two.findings == one.findings
    assert [f.rule for f in one.findings].count("INV105") == 4 and "INV000" in {f.rule for f in one.findings}
    assert project.run("check", "--jobs", "0", "--no-cache", "pkg").code == 1


def test_an_unchanged_rerun_imports_no_libcst(project: Project) -> None:
    """The re-run of an unchanged package reads every answer from the cache: nothing on that path may import
    libcst (the per-file rules and the summaries' MLX tables do), or the re-run pays for importing it
    (0.17 s became 0.34 s on vllm-mlx when the package model's queries imported `classify` at the top)."""
    project.write("app/__init__.py", "")
    project.write("app/engine.py", """
        import asyncio

        import mlx.core as mx
        from mlx_lm import stream_generate


        async def generate(model, tokenizer, prompt):
            mx.eval(model(prompt))
            return await asyncio.to_thread(lambda: list(stream_generate(model, tokenizer, prompt)))
    """)
    code = ("import sys; from mlx_invariants.cli import main; code = main(['check', '.']); "
            "print('libcst' in sys.modules, code)")
    runs = [subprocess.run([sys.executable, "-c", code], cwd=project.root, capture_output=True, text=True, check=False)
            for _ in range(2)]
    assert [run.stdout.split()[-2:] for run in runs] == [["True", "1"], ["False", "1"]], [r.stderr for r in runs]
