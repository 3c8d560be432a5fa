"""One replay command everywhere (`fuzz.reproduce`): the line report.txt prints for a module factory in a
scratch folder, one no fresh interpreter finds by itself, replays when pasted into a shell elsewhere."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mlx_invariants.fuzz.oracles import Violation
from mlx_invariants.fuzz.report import Failure, write_report
from mlx_invariants.fuzz.scenario import RequestSpec, Scenario
from mlx_invariants.fuzz.target import Target
from mlx_invariants.fuzz.trace import Trace
from tests.fuzz.fastpath_engine import SOURCE as FASTPATH_SOURCE



def test_the_report_txt_replay_line_of_a_scratch_factory_replays_from_anywhere(tmp_path: Path,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "scratchengine.py").write_text(FASTPATH_SOURCE)
    monkeypatch.syspath_prepend(str(scratch))  # as pytest does for a test module beside it
    __import__("scratchengine")
    try:
        failure = Failure(Scenario((RequestSpec("r0", 1, 1),)), Trace(),
                          [Violation("mlx-off-owner", "MLX ran on the event loop")],
                          Target.module_factory("scratchengine:make"))
        folder = write_report(tmp_path / "reports", failure)
    finally:
        sys.modules.pop("scratchengine", None)
    line = re.search(r"^replay: +(.+)$", (folder / "report.txt").read_text(), re.M)
    assert line, (folder / "report.txt").read_text()
    assert (folder / "replay.sh").read_text() == f"#!/bin/sh\n{line.group(1)}\n"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    pasted = subprocess.run(["bash", "-c", line.group(1)], cwd=elsewhere, env=env, capture_output=True, text=True,
                            timeout=300)
    assert pasted.returncode == 1, pasted.stdout + pasted.stderr
    assert "on scratchengine:make: violations in 3/3 run(s)" in pasted.stdout, pasted.stdout + pasted.stderr
