"""The reusable fuzz workflow engine repositories call: its inputs, that our own workflows call it on
Linux and on a self-hosted Apple Silicon runner, and its steps run for real on a scratch engine here
(a new finding fails, the same finding in a baseline passes, a target that builds nothing is a setup
error, summary.md reaches the job summary and links each finding's timeline)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.conftest import BACKSTOP_S
from tests.fuzz.fastpath_engine import SOURCE as FASTPATH_SOURCE

ROOT = Path(__file__).resolve().parents[2]
REUSABLE = ROOT / ".github" / "workflows" / "fuzz-reusable.yml"
CALL = "./.github/workflows/fuzz-reusable.yml"


def _load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the bare key `on` as True
    return data


def _step(name_part: str) -> dict[str, Any]:
    steps = _load(REUSABLE)["jobs"]["fuzz"]["steps"]
    return next(step for step in steps if name_part in step.get("name", ""))


def _callers() -> dict[str, dict[str, Any]]:
    return {f"{path.name}:{name}": job for path in sorted(REUSABLE.parent.glob("*.yml"))
            for name, job in _load(path)["jobs"].items() if job.get("uses") == CALL}


def test_the_reusable_workflow_takes_what_a_caller_needs() -> None:
    workflow = _load(REUSABLE)
    inputs = workflow["on"]["workflow_call"]["inputs"]
    assert {"server-command", "adapter", "budget", "runner", "baseline", "python-version", "package"} <= set(inputs)
    job = workflow["jobs"]["fuzz"]
    assert "fromJSON(inputs.runner)" in job["runs-on"], "a JSON list of labels must reach runs-on"
    fuzz = _step("fuzz (exit")["run"]
    assert "invariants fuzz" in fuzz and "--keep-going" in fuzz and '--baseline "$BASELINE"' in fuzz
    summary = _step("job summary")
    assert summary["if"] == "always()" and "summary.md" in summary["run"] and "GITHUB_STEP_SUMMARY" in summary["run"]
    upload = next(s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact"))
    assert upload["if"] == "always()" and upload["with"]["path"] == "fuzz-run/"
    for step in job["steps"]:  # inputs reach scripts through env only: a caller's string is never code
        assert "${{" not in step.get("run", ""), step


def test_our_workflows_call_it_on_linux_and_on_self_hosted_apple_silicon() -> None:
    callers = _callers()
    linux = [job for key, job in callers.items() if key.startswith("ci.yml:")]
    assert linux and all(job["with"].get("runner", "ubuntu-latest").startswith("ubuntu") for job in linux)
    assert any("server-command" in str(job) for job in linux), "the HTTP form must be exercised too"
    apple = callers.get("apple-silicon-fuzz.yml:fuzz-apple-silicon")
    assert apple is not None, "the Apple Silicon workflow must go through the reusable workflow"
    assert apple["with"]["runner"].startswith('["self-hosted", "macOS", "ARM64", ')
    assert "inputs.runner_label" in apple["with"]["runner"], "the fourth label must be configurable"
    baseline = ROOT / apple["with"]["baseline"]
    assert json.loads(baseline.read_text())["mlx_invariants_fuzz_baseline"] == 1


@pytest.fixture
def scratch(tmp_path: Path) -> dict[str, Any]:
    """A caller's checkout with an engine, and the environment GitHub gives the fuzz step."""
    (tmp_path / "myengine.py").write_text(FASTPATH_SOURCE)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(tmp_path), "SERVER_COMMAND": "", "ADAPTER": "myengine:make",
           "BUDGET": str(BACKSTOP_S),  # --examples ends the run, not a budget a loaded box may spend on start-up
           "BASELINE": "", "PROFILE": "ci", "FUZZ_ARGS": "--jobs 0 --examples 3 --replays 1",
           "GITHUB_STEP_SUMMARY": str(tmp_path / "step-summary.md")}
    return {"dir": tmp_path, "env": env}


def _run_step(name_part: str, scratch: dict[str, Any], **env: str) -> subprocess.CompletedProcess:
    """The step's script as GitHub's bash runs it (bash -e -o pipefail), in the caller's checkout."""
    return subprocess.run(["bash", "--noprofile", "--norc", "-e", "-o", "pipefail", "-c", _step(name_part)["run"]],
                          cwd=scratch["dir"], env={**scratch["env"], **env}, capture_output=True, text=True,
                          timeout=300)


def test_the_steps_fail_on_a_new_finding_and_pass_when_the_baseline_holds_it(scratch: dict[str, Any]) -> None:
    found = _run_step("fuzz (exit", scratch)
    assert found.returncode == 1, found.stdout + found.stderr
    assert _run_step("job summary", scratch).returncode == 0
    summary = Path(scratch["env"]["GITHUB_STEP_SUMMARY"]).read_text()
    assert "**FAILED**: 1 new finding(s)" in summary and "mlx-off-owner" in summary
    run_dir = next((scratch["dir"] / "fuzz-run").glob("*-myengine-make"))
    for link in re.findall(r"\]\((findings/[^)]+/timeline\.svg)\)", summary) or ["no timeline link"]:
        assert (run_dir / link).is_file(), link
    # The caller accepts it: a baseline file (the format --write-baseline writes) with its signature.
    findings = json.loads((run_dir / "summary.json").read_text())["findings"]
    baseline = scratch["dir"] / "baseline.json"
    baseline.write_text(json.dumps({"mlx_invariants_fuzz_baseline": 1,
                                    "accepted": [{"signature": f["signature"]} for f in findings]}))
    passed = _run_step("fuzz (exit", scratch, BASELINE=str(baseline))
    assert passed.returncode == 0, passed.stdout + passed.stderr


def test_the_steps_report_a_target_that_builds_nothing_as_a_setup_error(scratch: dict[str, Any]) -> None:
    broken = _run_step("fuzz (exit", scratch, ADAPTER="myengine:no_such_factory")
    assert broken.returncode == 2, broken.stdout + broken.stderr
    assert "no_such_factory" in broken.stderr + broken.stdout
    assert _run_step("job summary", scratch).returncode == 0
    assert "No summary.md was written" in Path(scratch["env"]["GITHUB_STEP_SUMMARY"]).read_text()


@pytest.mark.parametrize("server, adapter, code", [("", "", 2), ("python -m x --port {port}", "simple", 2),
                                                   ("", "simple", 0)])
def test_exactly_one_target_must_be_named(scratch: dict[str, Any], server: str, adapter: str, code: int) -> None:
    check = _step("one target is named")
    targets = f"{int(bool(server))}{int(bool(adapter))}"
    assert "inputs.server-command" in check["env"]["TARGETS"] and "inputs.adapter" in check["env"]["TARGETS"]
    done = subprocess.run(["bash", "-e", "-c", check["run"]], env={**scratch["env"], "TARGETS": targets},
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == code, done.stdout + done.stderr


@pytest.mark.parametrize("database, readonly, passed", [
    ("", "", []),
    ("redis://fleet:6379/0", "", ["--database", "redis://fleet:6379/0"]),
    ("redis://:p w@fleet:6379/0", "true", ["--database", "redis://:p w@fleet:6379/0", "--database-readonly"]),
    ("", "true", ["--database-readonly"]),  # the runner profile's own, or none (a fork's pull request: no secret)
])
def test_the_example_database_reaches_the_command_line(scratch: dict[str, Any], database: str, readonly: str,
                                                       passed: list[str]) -> None:
    """Nightly calls write to the fleet's database, pull-request calls read it (docs/ci.md's recipe)."""
    inputs = _load(REUSABLE)["on"]["workflow_call"]
    assert {"database", "database-readonly"} <= set(inputs["inputs"]) and "database-url" in inputs["secrets"]
    env = _step("fuzz (exit")["env"]
    assert env["DATABASE"] == "${{ secrets.database-url || inputs.database }}"
    assert env["READONLY"] == "${{ inputs.database-readonly && 'true' || '' }}", "false must reach bash as empty"
    fake = scratch["dir"] / "bin"
    fake.mkdir()
    (fake / "invariants").write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    (fake / "invariants").chmod(0o755)
    done = _run_step("fuzz (exit", scratch, DATABASE=database, READONLY=readonly,
                     PATH=f"{fake}{os.pathsep}{scratch['env']['PATH']}")
    assert done.returncode == 0, done.stdout + done.stderr
    argv = json.loads(done.stdout.splitlines()[-1])
    got = [arg for i, arg in enumerate(argv) if arg.startswith("--database") or (i and argv[i - 1] == "--database")]
    assert got == passed, argv
