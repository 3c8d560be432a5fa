"""The pytest plugin as another project sees it: a fixture that fails a test touching MLX off its
owner, the ci/runner profiles, and nothing heavy imported just by loading it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path


def run_pytest(folder: Path, source: str, *args: str) -> subprocess.CompletedProcess:
    (folder / "test_inline.py").write_text(textwrap.dedent(source))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, str(folder)],
                          cwd=folder, capture_output=True, text=True, timeout=300)


def test_fixture_fails_a_test_that_enters_mlx_off_its_owner(tmp_path):
    run = run_pytest(tmp_path, """
        import threading
        import mlx.core as mx

        def test_clean(mlx_sentinel):
            mlx_sentinel.owner = "MainThread"
            mx.eval(mx.ones(2))

        def test_off_owner(mlx_sentinel):
            mlx_sentinel.owner = "mlx-owner*"
            worker = threading.Thread(target=lambda: mx.eval(mx.ones(2)), name="stray-worker")
            worker.start()
            worker.join()
    """)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "2 passed, 1 error" in run.stdout  # the fixture fails the second test at teardown
    assert "mlx-off-owner" in run.stdout and "stray-worker" in run.stdout


def test_profiles_are_registered_for_hypothesis(tmp_path):
    run = run_pytest(tmp_path, """
        from hypothesis import given, settings
        from mlx_invariants.fuzz.strategies import scenarios

        @given(scenarios())
        def test_scenarios_round_trip(scenario):
            assert type(scenario).loads(scenario.dumps()) == scenario
            assert settings().derandomize and settings().database is None
    """, "--hypothesis-profile=ci")
    assert run.returncode == 0, run.stdout + run.stderr


def test_loading_the_plugin_and_the_command_imports_nothing_heavy():
    code = ("import sys, mlx_invariants.fuzz.pytest_plugin, mlx_invariants.commands.fuzz, mlx_invariants.fuzz; "
            "print(sorted(m for m in ('mlx', 'mlx.core', 'hypothesis', 'mlx_invariants.engine', 'httpx') "
            "if m in sys.modules))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.stdout.strip() == "[]", run.stdout + run.stderr
