"""Fuzzing your own engine from your own pytest: a scratch project with its own engine factory, run with
its own `python -m pytest`; the failure message names the finding and a replay command that reproduces
it when pasted into a shell elsewhere. Also: the `mlx_sentinel` fixture reports distinct violations,
with a count, not one entry per stray thread."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mlx_invariants.errors import UsageError
from mlx_invariants.fuzz.api import as_target
from mlx_invariants.fuzz.oracles import Violation
from mlx_invariants.fuzz.pytest_plugin import distinct_violations
from mlx_invariants.fuzz.reproduce import factory_root
from mlx_invariants.fuzz.target import Target
from tests.fuzz.fastpath_engine import SOURCE as FASTPATH_SOURCE


TESTS = """
    import threading

    import mlx.core as mx
    import pytest
    from mlx_invariants.fuzz import FuzzFailure, fuzz_engine
    from mlx_invariants.fuzz.baseline import write_baseline
    from myengine import make

    # The count ends each run and shrinking ends on its own, not the clock (the defaults: 120 s, 60 s).
    QUICK = dict(examples=3, budget_s=3600, shrink_s=3600, debug_run=False, replays=1)


    def test_fixture_on_a_factory_function(mlx_fuzz):
        mlx_fuzz(make, **QUICK)


    def test_fixture_on_a_clean_engine(mlx_fuzz):
        assert mlx_fuzz("myengine:make_clean", **QUICK).ok


    def test_sentinel_fixture_on_fifty_stray_threads(mlx_sentinel):
        mlx_sentinel.owner = "MainThread"
        for number in range(50):
            worker = threading.Thread(target=lambda: mx.eval(mx.ones(2)), name=f"stray-{number}")
            worker.start()
            worker.join()


    def test_function_raises_an_assertion_error_and_a_baseline_accepts_the_finding(tmp_path):
        with pytest.raises(FuzzFailure) as caught:
            fuzz_engine("myengine:make", report_dir=tmp_path, **QUICK)
        assert isinstance(caught.value, AssertionError)
        assert caught.value.result.failure.violations[0].kind == "mlx-off-owner"
        baseline = tmp_path / "baseline.json"
        write_baseline(baseline, [finding.to_json() for finding in caught.value.result.findings])
        assert fuzz_engine("myengine:make", report_dir=tmp_path, baseline=str(baseline), **QUICK).ok
"""


def test_a_failing_fuzz_test_prints_a_replay_command_that_reproduces_when_pasted(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "myengine.py").write_text(FASTPATH_SOURCE)
    (project / "test_engine_fuzz.py").write_text(textwrap.dedent(TESTS))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rN", "--fuzz-reports=runs"],
                         cwd=project, capture_output=True, text=True, timeout=300)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "1 failed, 3 passed, 1 error" in out, out  # the sentinel fixture fails its test at teardown
    assert "MLX sentinel: 1 distinct violation(s) (50 in all)" in out, out
    assert "[1] mlx-off-owner (x50): thread" in out and out.count("second stack:") == 1, out
    failed = out[out.index("_ test_fixture_on_a_factory_function _"):]
    assert "Traceback" not in failed and "During handling" not in failed, out
    assert "fuzzing myengine:make: 1 new finding(s)" in failed and "[1] mlx-off-owner: " in failed, out
    assert "shrunk scenario: [r0(p1 m1)]" in failed, out
    report = re.search(r"^ *report: (\S+)$", failed, re.M)
    replay = re.search(r"^ *replay: (.+)$", failed, re.M)
    assert report and replay, out
    assert Path(report.group(1)).is_file() and str(project / "runs") in report.group(1)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    pasted = subprocess.run(["bash", "-c", replay.group(1)], cwd=elsewhere, capture_output=True, text=True,
                            timeout=300)
    assert pasted.returncode == 1, pasted.stdout + pasted.stderr
    assert "on myengine:make: violations in 3/3 run(s)" in pasted.stdout, pasted.stdout + pasted.stderr


def _local_factory():
    def make():
        return None
    return make


def test_a_factory_function_is_named_module_colon_function() -> None:
    assert as_target(test_a_factory_function_is_named_module_colon_function).name == \
        f"{__name__}:test_a_factory_function_is_named_module_colon_function"
    assert as_target("simple") == Target.reference("simple")
    assert as_target("python -m server --port {port}") == Target.server("python -m server --port {port}")


def test_a_factory_no_new_process_can_import_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="module-level function"):
        as_target(_local_factory())
    with pytest.raises(UsageError, match="module-level function"):
        as_target(lambda: None)


def test_the_replay_path_is_the_folder_the_factory_module_is_imported_from(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "userpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "fuzzing.py").write_text("def make():\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    __import__("userpkg.fuzzing")
    try:
        assert factory_root(Target.module_factory("userpkg.fuzzing:make")) == tmp_path.resolve()
        assert factory_root(Target.module_factory("userpkg:make")) == tmp_path.resolve()
    finally:
        for name in ("userpkg.fuzzing", "userpkg"):
            sys.modules.pop(name, None)
    __import__("hypothesis.strategies")
    assert factory_root(Target.module_factory("hypothesis.strategies:integers")) is None  # installed
    assert factory_root(Target.reference("simple")) is None


def test_the_sentinel_fixture_reports_each_distinct_violation_once() -> None:
    loop = ("main.py:1 in run", "engine.py:40 in step")
    stray = ("main.py:1 in run", "worker.py:9 in helper")
    found = [Violation("mlx-concurrent", f"pair {i}", stacks=(loop, stray)) for i in range(100)]
    found.append(Violation("mlx-off-owner", "thread #7 entered core.eval", stacks=((), stray)))
    message = distinct_violations(found)
    assert message.splitlines()[0] == "MLX sentinel: 2 distinct violation(s) (101 in all)"
    assert "[1] mlx-concurrent (x100): pair 0" in message and "pair 1\n" not in message
    assert "[2] mlx-off-owner: thread #7" in message
    assert message.count("engine.py:40 in step") == 1

