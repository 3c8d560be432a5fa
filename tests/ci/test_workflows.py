"""The workflow files: valid against GitHub's schema, a few lines each, calling scripts that exist."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml


ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))


def _load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    # YAML 1.1 reads the bare key `on` as True.
    if True in data:
        data["on"] = data.pop(True)
    return data


def _steps(workflow: dict[str, Any]) -> list[dict[str, Any]]:
    return [step for job in workflow["jobs"].values() for step in job.get("steps", [])]


def _job_running(script: str) -> tuple[str, dict[str, Any]]:
    for path in WORKFLOWS:
        for name, job in _load(path)["jobs"].items():
            if any(script in step.get("run", "") for step in job.get("steps", [])):
                return path.name, job
    raise AssertionError(f"no workflow job runs {script}")


def test_the_expected_workflows_exist() -> None:
    names = {path.name for path in WORKFLOWS}
    assert {"ci.yml", "nightly-fuzz.yml", "code-scanning.yml", "apple-silicon-fuzz.yml"} <= names


def test_workflows_match_github_workflow_schema() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
         *map(str, WORKFLOWS)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_workflow_breaking_the_schema_is_caught(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yml"
    # `runs-on` misspelled and a step with neither `run` nor `uses`.
    broken.write_text("on: push\njobs:\n  x:\n    run-on: ubuntu-latest\n    steps:\n      - name: nothing\n")
    done = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows", str(broken)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr


def test_every_script_a_workflow_calls_exists_and_is_executable() -> None:
    called = set()
    for path in WORKFLOWS:
        for step in _steps(_load(path)):
            for word in step.get("run", "").split():
                if word.startswith("ci/"):
                    called.add(word)
    assert called, "the workflows call no ci/ script"
    for script in sorted(called):
        assert (ROOT / script).is_file(), f"a workflow calls {script}, which does not exist"
        if script.endswith(".sh"):
            assert os.access(ROOT / script, os.X_OK), f"{script} is not executable"


def test_workflow_steps_are_a_few_lines() -> None:
    # Logic belongs in ci/ scripts, where it runs the same on a laptop.
    for path in WORKFLOWS:
        for step in _steps(_load(path)):
            lines = [line for line in step.get("run", "").splitlines() if line.strip()]
            assert len(lines) <= 3, f"{path.name}: a step of {len(lines)} lines belongs in a ci/ script"


def test_linux_cpu_job_runs_tests_selfcheck_and_mutants_on_every_push() -> None:
    ci = _load(ROOT / ".github" / "workflows" / "ci.yml")
    assert "push" in ci["on"] and "pull_request" in ci["on"]
    runs = " ".join(step.get("run", "") for step in _steps(ci))
    for script in ("ci/lint.sh", "ci/test.sh", "ci/selfcheck.sh", "ci/main.sh"):
        assert script in runs
    selfcheck = (ROOT / "ci" / "selfcheck.sh").read_text()
    assert "invariants mutants" in selfcheck and "invariants check" in selfcheck


def test_hosted_macos_job_records_the_device_without_gating_on_metal() -> None:
    _, job = _job_running("ci/metal_smoke.py")
    assert job["runs-on"] == "macos-14"
    runs = [step.get("run", "") for step in job["steps"]]
    assert any("ci/test.sh" in run for run in runs)
    smoke = next(step for step in job["steps"] if "ci/metal_smoke.py" in step.get("run", ""))
    assert "continue-on-error" not in smoke, "the smoke check exits 0 by design; it needs no escape hatch"


def test_apple_silicon_fuzz_targets_a_labelled_self_hosted_runner_and_keeps_reports() -> None:
    # It goes through the reusable workflow (tests/ci/test_fuzz_workflow.py: that one always uploads the run folder).
    apple = _load(ROOT / ".github" / "workflows" / "apple-silicon-fuzz.yml")["jobs"]["fuzz-apple-silicon"]
    assert apple["uses"] == "./.github/workflows/fuzz-reusable.yml"
    labels = apple["with"]["runner"]
    assert labels.startswith('["self-hosted", "macOS", "ARM64", ')
    assert "inputs.runner_label" in labels, "the fourth label must be configurable"
    assert apple["with"]["profile"] == "runner"


def test_code_scanning_uploads_sarif_from_a_base_install() -> None:
    scanning = _load(ROOT / ".github" / "workflows" / "code-scanning.yml")
    job = scanning["jobs"]["invariants-sarif"]
    runs = " ".join(step.get("run", "") for step in job["steps"])
    assert "--format sarif" in runs
    assert re.search(r"pip install \.(\s|$)", runs), "base install only (no extras), so no MLX"
    assert scanning["permissions"]["security-events"] == "write"
    assert any(str(step.get("uses", "")).startswith("github/codeql-action/upload-sarif") for step in job["steps"])


def test_the_checker_cli_offers_the_sarif_format_the_workflow_uses() -> None:
    done = subprocess.run([sys.executable, "-m", "mlx_invariants", "check", "--help"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "--format" in done.stdout and "sarif" in done.stdout
