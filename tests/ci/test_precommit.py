"""pre-commit: the consumer hook runs from this repo as a hook source and installs without MLX.

The hook source is a throwaway git repo holding this working tree's files (tracked and
untracked-not-ignored), so the test sees what would be committed; pre-commit clones it by
local path, so only PyPI is reached (for the hook env's libcst and pathspec).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml


ROOT = Path(__file__).resolve().parents[2]
HOOK_ID = "invariants-check"

# The STYLE example of INV105 and its fix: the fix differs only by shield + drain.
BAD = '''\
import asyncio


class Engine:
    def __init__(self):
        # Serializes MLX (Metal command buffer) access; not an admission gate.
        self._mlx_lock = asyncio.Lock()

    async def generate(self, step):
        async with self._mlx_lock:
            return await asyncio.to_thread(step)
'''
CLEAN = '''\
def add(a, b):
    return a + b
'''


def _git(*args: str, cwd: Path) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.com",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.com")
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def _pre_commit(*args: str, cwd: Path, home: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PRE_COMMIT_HOME=str(home), PRE_COMMIT_COLOR="never")
    env.pop("VIRTUAL_ENV", None)
    return subprocess.run([sys.executable, "-m", "pre_commit", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def _hook_source(tmp: Path) -> tuple[Path, str]:
    """This working tree as committed-to-be, in a fresh git repo; returns (path, commit)."""
    source = tmp / "hook-source"
    source.mkdir()
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        path = ROOT / name
        if path.is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, source / name)
    _git("init", "-q", cwd=source)
    _git("add", "-A", cwd=source)
    _git("commit", "-q", "-m", "hook source", cwd=source)
    return source, _git("rev-parse", "HEAD", cwd=source).strip()


def _hook_manifest() -> list[dict[str, Any]]:
    return yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())


@pytest.fixture(scope="module")
def consumer(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A consumer repo using the hook, with one bad and one clean file; the hook run once, env kept."""
    _hook_manifest()
    tmp = tmp_path_factory.mktemp("pre-commit")
    source, rev = _hook_source(tmp)
    repo = tmp / "consumer"
    repo.mkdir()
    (repo / "bad.py").write_text(BAD)
    (repo / "clean.py").write_text(CLEAN)
    config = {"repos": [{"repo": str(source), "rev": rev, "hooks": [{"id": HOOK_ID}]}]}
    (repo / ".pre-commit-config.yaml").write_text(yaml.safe_dump(config))
    _git("init", "-q", cwd=repo)
    _git("add", "-A", cwd=repo)
    home = tmp / "pre-commit-home"
    done = _pre_commit("run", "--all-files", cwd=repo, home=home)
    return {"repo": repo, "home": home, "run": done}


def test_consumer_manifest_defines_the_invariants_check_hook() -> None:
    hooks = {hook["id"]: hook for hook in _hook_manifest()}
    assert HOOK_ID in hooks
    hook = hooks[HOOK_ID]
    assert hook["language"] == "python"
    assert hook.get("types") == ["python"] or "python" in hook.get("types_or", [])
    done = subprocess.run([sys.executable, "-m", "pre_commit", "validate-manifest",
                           str(ROOT / ".pre-commit-hooks.yaml")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_hook_reports_the_bad_file_and_passes_the_clean_one(consumer: dict[str, Any]) -> None:
    done = consumer["run"]
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "INV105" in output and "bad.py" in output, output
    assert "clean.py" not in output, output


def test_hook_passes_once_the_bad_file_is_fixed(consumer: dict[str, Any]) -> None:
    repo = consumer["repo"]
    (repo / "bad.py").unlink()
    _git("add", "-A", cwd=repo)
    done = _pre_commit("run", "--all-files", cwd=repo, home=consumer["home"])
    assert done.returncode == 0, done.stdout + done.stderr


def test_hook_env_has_the_checker_and_no_mlx(consumer: dict[str, Any]) -> None:
    envs = sorted(consumer["home"].glob("repo*/py_env-*"))
    assert envs, f"no python hook env under {consumer['home']}"
    python = next(envs[0].glob("bin/python*"), None) or envs[0] / "Scripts" / "python.exe"
    listing = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m, json; "
                            "print(json.dumps(sorted({d.metadata['Name'].lower() for d in m.distributions()})))"],
        capture_output=True, text=True, timeout=60, check=True,
    )
    installed = set(json.loads(listing.stdout))
    assert {"mlx-invariants", "libcst"} <= installed, installed
    heavy = {name for name in installed if name.startswith("mlx") and name != "mlx-invariants"}
    heavy |= installed & {"numpy", "hypothesis", "starlette", "uvicorn", "transformers"}
    assert not heavy, f"the hook env pulled in {sorted(heavy)}"


def test_this_repos_own_config_is_valid_and_uses_the_base_dependencies() -> None:
    done = subprocess.run([sys.executable, "-m", "pre_commit", "validate-config",
                           str(ROOT / ".pre-commit-config.yaml")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    hook = next(h for repo in config["repos"] for h in repo["hooks"] if h["id"] == HOOK_ID)
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    base = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert sorted(hook["additional_dependencies"]) == sorted(base), \
        "the local hook must install exactly the base dependencies, as a consumer's hook env does"
