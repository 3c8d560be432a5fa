"""ci/fuzz_runner.sh: records the device, fuzzes the routes it is given, exits with the worst route."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_runner_records_the_device_and_fuzzes_a_route(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    env = dict(os.environ, CI_PYTHON=sys.executable, FUZZ_BUDGET="3", FUZZ_PROFILE="ci",
               FUZZ_REPORTS=str(reports), FUZZ_JOBS="0")
    done = subprocess.run(["bash", str(ROOT / "ci" / "fuzz_runner.sh"), "simple"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    device = json.loads((reports / "device.json").read_text())
    assert device["verdict"] and device["mlx"]["default_device"]
    log = (reports / "simple.log").read_text()
    assert "no new finding in" in log
    assert "== simple: exit 0" in done.stdout


def test_runner_refuses_a_bad_route_with_exit_2(tmp_path: Path) -> None:
    env = dict(os.environ, CI_PYTHON=sys.executable, FUZZ_BUDGET="1", FUZZ_REPORTS=str(tmp_path / "r"))
    done = subprocess.run(["bash", str(ROOT / "ci" / "fuzz_runner.sh"), "no-such-route"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
