"""Installing the package gives any project the `mlx_sentinel` fixture and the fuzz profiles."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path


def test_the_plugin_is_registered_as_a_pytest11_entry_point() -> None:
    points = {point.name: point.value for point in importlib.metadata.entry_points(group="pytest11")}
    assert points.get("mlx_invariants") == "mlx_invariants.fuzz.pytest_plugin"


def test_another_project_gets_the_fixture_and_profiles(tmp_path: Path) -> None:
    (tmp_path / "test_elsewhere.py").write_text(
        "from hypothesis import settings\n"
        "def test_profiles_and_fixture(mlx_sentinel):\n"
        "    settings.get_profile('ci'); settings.get_profile('runner')\n"
        "    assert mlx_sentinel is not None\n"
    )
    env = dict(os.environ)
    env.pop("PYTEST_ADDOPTS", None)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
