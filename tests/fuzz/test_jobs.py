"""`--jobs N`: one merged run folder over the jobs (totals, per-job seeds, each distinct finding once,
pointing at its job's report), beside each job's own, and the exit code of one job."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from mlx_invariants.fuzz.evidence import merge_summaries
from mlx_invariants.fuzz.target import Target

REPO = Path(__file__).resolve().parents[2]


def test_two_jobs_that_find_the_same_bug_write_one_merged_run_folder(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "mlx_invariants", "fuzz", "--engine", "tests.fuzz.fastpath_engine:make",
                          "--jobs", "2", "--examples", "4", "--seed", "7", "--replays", "0", "--report", str(tmp_path)],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stdout + run.stderr
    [folder] = [p for p in tmp_path.iterdir() if (p / "summary.json").is_file()]
    assert f"run folder: {folder} " in run.stdout and run.stdout.count("VIOLATION") == 1, run.stdout
    summary = json.loads((folder / "summary.json").read_text())
    jobs = [json.loads((folder / f"job{i}" / "summary.json").read_text()) for i in (0, 1)]
    assert [j["seed"] for j in summary["jobs"]] == ["7", "1007"] == [j["seed"] for j in jobs]
    assert summary["examples"] == sum(j["examples"] for j in jobs) >= 2
    assert summary["scenario_runs"] == sum(j["scenario_runs"] for j in jobs)
    assert summary["result"] == "fail" and summary["counts"]["violation"] == 1
    [finding] = summary["findings"]  # each job found it; it is listed once
    assert finding["oracle"] == "mlx-off-owner" and finding["jobs"] == [0, 1] and finding["seen"] == 2
    report = Path(finding["report"])
    assert report.parent == folder / f"job{finding['job']}" / "findings" and (report / "report.txt").is_file()
    assert summary["replay"][finding["id"]].endswith(f"--replay {report / 'scenario.json'}")
    suite = ET.parse(folder / "junit.xml").getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures")) == ("2", "1")
    markdown = (folder / "summary.md").read_text()
    assert "| seed | job0 7, job1 1007 |" in markdown and "### Jobs" in markdown
    assert f"](job{finding['job']}/findings/{report.name}/timeline.svg)" in markdown


def _job(folder: Path, seed: str, findings: list[dict], examples: int = 10) -> str:
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({
        "seed": seed, "budget_s": 5.0, "elapsed_s": 4.0, "examples": examples, "examples_cap": None,
        "requests": None, "scenario_runs": examples + 2, "engines_started": 2, "oracle_counts": {"stalled": 1},
        "sentinel": {"mlx_calls": 100, "threads": 2, "thread_names": ["MainThread", "owner"], "mlx_s": 0.5},
        "findings": findings, "replay": {f["id"]: f"replay {f['report']}" for f in findings}}))
    return str(folder)


def _finding(sig: str, status: str, report: str) -> dict:
    return {"signature": sig, "id": sig[:8], "status": status, "oracle": sig, "exact": False, "headline": sig,
            "confirmation": [1, 3], "reproduced": None, "shrunk": False, "seen": 1, "scenario": "[r0]",
            "report": report}


def test_a_confirmed_finding_outranks_the_same_one_unconfirmed_and_a_crashed_job_fails_the_run(tmp_path: Path) -> None:
    target = Target.reference("simple")
    job0 = _job(tmp_path / "job0", "1", [_finding("stalled", "unconfirmed", "r0"), _finding("slot-leaked", "accepted", "r1")])
    job1 = _job(tmp_path / "job1", "1001", [_finding("stalled", "violation", "r2")])
    rows = [{"job": 0, "seed": 1, "run_dir": job0}, {"job": 1, "seed": 1001, "run_dir": job1}]
    summary = merge_summaries(target, rows)
    assert [(f["signature"], f["status"], f["job"], f["jobs"]) for f in summary["findings"]] == \
        [("stalled", "violation", 1, [0, 1]), ("slot-leaked", "accepted", 0, [0])]
    assert summary["result"] == "fail" and summary["replay"]["stalled"] == "replay r2"
    assert (summary["examples"], summary["sentinel"]["mlx_calls"], summary["oracle_counts"]) == (20, 200, {"stalled": 2})

    clean = merge_summaries(target, [{"job": 0, "seed": 1, "run_dir": _job(tmp_path / "a", "1", [])},
                                     {"job": 1, "seed": 1001, "run_dir": _job(tmp_path / "b", "1001", [])}])
    assert clean["result"] == "pass" and clean["crashes"] == []
    crashed = merge_summaries(target, [{"job": 0, "seed": 1, "run_dir": _job(tmp_path / "c", "1", [])},
                                       {"job": 1, "seed": 1001, "run_dir": None, "examples": 3,
                                        "crashed": "the fuzz process was killed by SIGKILL", "report": None}])
    assert crashed["result"] == "fail" and crashed["examples"] == 13
    assert crashed["crashes"] == [{"job": 1, "why": "the fuzz process was killed by SIGKILL", "report": None,
                                   "replay": None}]
