"""pre-commit, end to end: README.md's snippet runs the consumer hook; this repo's own hook works.

The consumer's `.pre-commit-config.yaml` is README.md's snippet, taken from the file, with only
its two documented placeholders filled in, so the test fails when the README drifts. The hook
source is a throwaway git repo holding this working tree's files (tracked and
untracked-not-ignored), committed, so the test sees what would be committed; pre-commit clones
it through a file:// URL, so only PyPI is reached (for the hook env's libcst and pathspec).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlx_invariants.checker.rules import RULES


ROOT = Path(__file__).resolve().parents[2]
HOOK_ID = "invariants-check"
# What README.md tells the reader to replace, verbatim.
REPO_PLACEHOLDER = "<path or URL of your mlx-invariants clone>"
REV_PLACEHOLDER = "<full commit sha or tag that exists there>"

INV105 = next(rule for rule in RULES if rule.id == "INV105")
BAD = INV105.invalid()[0]
FIXED = INV105.valid()[0]  # the same code with the fix applied (shield + drain)
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


def _snippet(doc: Path) -> str:
    """The one ```yaml block of `doc` that uses the hook."""
    blocks = re.findall(r"^```yaml\n(.*?)^```$", doc.read_text(), flags=re.MULTILINE | re.DOTALL)
    using = [block for block in blocks if f"id: {HOOK_ID}" in block]
    assert len(using) == 1, f"{doc.name}: expected one yaml block with the {HOOK_ID} hook, found {len(using)}"
    return using[0]


def _filled(snippet: str, repo: str, rev: str) -> str:
    """The snippet with its two documented placeholders replaced, and nothing else touched."""
    for placeholder in (REPO_PLACEHOLDER, REV_PLACEHOLDER):
        assert snippet.count(placeholder) == 1, f"README.md's pre-commit snippet lost {placeholder!r}:\n{snippet}"
    filled = snippet.replace(REPO_PLACEHOLDER, repo).replace(REV_PLACEHOLDER, rev)
    left = re.findall(r"<[^<>\n]*>", filled)
    assert not left, f"README.md's pre-commit snippet has placeholders it does not explain: {left}"
    return filled


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
    """A consumer repo configured by README.md's snippet, with INV105's bad example and a clean
    file; the hook run once, its env kept for the next run."""
    snippet = _snippet(ROOT / "README.md")
    tmp = tmp_path_factory.mktemp("pre-commit")
    source, rev = _hook_source(tmp)
    repo = tmp / "consumer"
    repo.mkdir()
    (repo / ".pre-commit-config.yaml").write_text(_filled(snippet, source.as_uri(), rev))
    (repo / "bad.py").write_text(BAD.source)
    (repo / "clean.py").write_text(CLEAN)
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


def test_docs_ci_shows_the_snippet_the_readme_runs() -> None:
    assert _snippet(ROOT / "docs" / "ci.md") == _snippet(ROOT / "README.md"), \
        "docs/ci.md and README.md show different pre-commit snippets; only README.md's is run here"


def test_readme_snippet_hook_reports_the_bad_file_and_passes_the_clean_one(consumer: dict[str, Any]) -> None:
    done = consumer["run"]
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    for line, rule in BAD.expected():
        assert f"bad.py:{line}:" in output and rule in output, output
    assert "clean.py" not in output, output


def test_readme_snippet_hook_passes_once_the_bad_file_is_fixed(consumer: dict[str, Any]) -> None:
    repo = consumer["repo"]
    (repo / "bad.py").write_text(FIXED.source)
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


def test_this_repos_own_hook_runs_this_trees_checker(tmp_path: Path) -> None:
    """The repo's local hook, run as written from a copy of its config: it finds the planted
    violation under engine/ and passes once it is fixed.

    Its entry runs `.venv/bin/invariants`; the copy's `.venv` is the environment running this
    test, which holds this tree's editable install, as `bash ci/setup.sh` makes it.
    """
    config = ROOT / ".pre-commit-config.yaml"
    done = subprocess.run([sys.executable, "-m", "pre_commit", "validate-config", str(config)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    repo = tmp_path / "copy"
    (repo / "engine").mkdir(parents=True)
    shutil.copy2(config, repo / ".pre-commit-config.yaml")
    (repo / ".venv").symlink_to(sys.prefix, target_is_directory=True)
    (repo / "engine" / "bad.py").write_text(BAD.source)
    _git("init", "-q", cwd=repo)
    _git("add", ".pre-commit-config.yaml", "engine", cwd=repo)
    home = tmp_path / "pre-commit-home"

    done = _pre_commit("run", HOOK_ID, "--all-files", cwd=repo, home=home)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    for line, rule in BAD.expected():
        assert f"engine/bad.py:{line}:" in output and rule in output, output

    (repo / "engine" / "bad.py").write_text(FIXED.source)
    done = _pre_commit("run", HOOK_ID, "--all-files", cwd=repo, home=home)
    assert done.returncode == 0, done.stdout + done.stderr
