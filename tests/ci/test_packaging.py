"""What the wheel installs: one top-level import name, and a user's own `fuzz` and `engine` stay theirs.

The scratch project's venv is fresh and holds our wheel; the wheel's
dependencies come from this venv (`tests/venvs.py`), so the only
`mlx_invariants` the scratch venv can import is the wheel's, and the test
asserts that too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.ci import imports
from tests.venvs import borrowing_venv

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(REPO)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    (built,) = out.glob("mlx_invariants-*.whl")
    return built


def _metadata(names: list[str], archive: zipfile.ZipFile, file: str) -> str:
    (path,) = [name for name in names if name.endswith(f".dist-info/{file}")]
    return archive.read(path).decode()


def test_the_wheel_installs_one_top_level_name_with_every_module(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = _metadata(names, archive, "entry_points.txt")
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"mlx_invariants"}
    expected = {"/".join(module.split(".")) + ("/__init__.py" if path.name == "__init__.py" else ".py")
                for module, path in imports.modules(REPO).items()}
    missing = sorted(expected - set(names))
    assert not missing, f"modules the wheel leaves out (pyproject's package list): {missing}"
    assert "invariants = mlx_invariants.cli:main" in entry_points
    assert "mlx_invariants = mlx_invariants.fuzz.pytest_plugin" in entry_points


def test_the_wheel_holds_no_zoo_code(wheel: Path) -> None:
    """The zoo (zoo/: server recipes, installers, reproducers, results) runs from a checkout; it is not product."""
    assert (REPO / "zoo" / "__main__.py").exists(), "the zoo moved: update this test"
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert not [name for name in names if "zoo" in name.split("/")], "zoo files in the wheel"
    assert not [name for name in names if "/reproducers/" in name or name.endswith("vllm_engines.py")]


def test_a_project_with_its_own_fuzz_and_engine_packages_collects_and_passes(wheel: Path, tmp_path: Path) -> None:
    python, site = borrowing_venv(tmp_path / "venv")
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                           "--no-index", str(wheel)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr

    project = tmp_path / "their-engine"
    for name, text in {
        "fuzz/__init__.py": "WHO = 'their fuzz'\n",
        "fuzz/pytest_plugin.py": "raise ImportError('a module of theirs that only looks like ours')\n",
        "engine/__init__.py": "WHO = 'their engine'\n",
        "tests/test_theirs.py": (
            "import engine\nimport fuzz\nimport mlx_invariants\n\n"
            "def test_their_packages_are_theirs():\n"
            "    assert (fuzz.WHO, engine.WHO) == ('their fuzz', 'their engine')\n\n"
            f"def test_ours_comes_from_the_wheel():\n    assert mlx_invariants.__file__.startswith({str(site)!r})\n\n"
            "def test_our_fixture_is_there(mlx_sentinel):\n    assert mlx_sentinel is not None\n"),
    }.items():
        path = project / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    done = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=project, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout, done.stdout
