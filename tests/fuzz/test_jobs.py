"""`--jobs N`: one merged run folder over the jobs (totals, per-job seeds, each distinct finding once,
pointing at its job's report), beside each job's own, and the exit code of one job."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from mlx_invariants.fuzz.evidence import JobPart, merge_summaries
from mlx_invariants.fuzz.jobs import JobOutcome, take_line, result_line
from mlx_invariants.fuzz.summary import FindingSummary, RunSummary, SentinelTotals, Status
from mlx_invariants.fuzz.target import Target
from tests.conftest import BACKSTOP_S

REPO = Path(__file__).resolve().parents[2]


def test_two_jobs_that_find_the_same_bug_write_one_merged_run_folder(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "mlx_invariants", "fuzz", "--engine", "tests.fuzz.fastpath_engine:make",
                          "--jobs", "2", "--examples", "4", "--budget", str(BACKSTOP_S), "--seed", "7",
                          "--replays", "0", "--report", str(tmp_path)],
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
    # The merged finding is the reporting job's, as its summary.json has it, with the jobs that saw it.
    reported = jobs[finding["job"]]
    [own] = reported["findings"]
    assert {**own, "job": finding["job"], "jobs": [0, 1], "seen": 2,
            "found_after_s": finding["found_after_s"], "examples_before": finding["examples_before"]} == finding
    for job in jobs:  # time to first find: from the run's start, within the run
        [seen] = job["findings"]
        assert 0 <= seen["found_after_s"] <= job["elapsed_s"] and 1 <= seen["examples_before"] <= job["examples"]
    assert finding["found_after_s"] == min(job["findings"][0]["found_after_s"] for job in jobs)
    suite = ET.parse(folder / "junit.xml").getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures")) == ("2", "1")
    markdown = (folder / "summary.md").read_text()
    assert "| seed | job0 7, job1 1007 |" in markdown and "### Jobs" in markdown
    assert f"](job{finding['job']}/findings/{report.name}/timeline.svg)" in markdown


def _job(seed: str, findings: list[FindingSummary], examples: int = 10) -> RunSummary:
    """A child's summary, as its result line carries it."""
    return RunSummary(label="simple", target=Target.reference("simple"), examples=examples, elapsed_s=4.0,
                      budget_s=5.0, seed=seed, scenario_runs=examples + 2, engines_started=2,
                      oracle_counts={"stalled": 1},
                      sentinel=SentinelTotals(100, 2, ("MainThread", "owner"), 0.5), findings=tuple(findings),
                      run_dir=f"/runs/{seed}")


def _finding(sig: str, status: str, report: str, found_after_s: float = 1.0) -> FindingSummary:
    return FindingSummary(signature=sig, id=sig[:8], status=Status(status), oracle=sig, exact=False, headline=sig,
                          confirmation=(1, 3), reproduced=None, shrunk=False, seen=1, scenario="[r0]", report=report,
                          replay=f"replay {report}", found_after_s=found_after_s, examples_before=3)


def test_a_confirmed_finding_outranks_the_same_one_unconfirmed_and_a_crashed_job_fails_the_run() -> None:
    target = Target.reference("simple")
    job0 = _job("1", [_finding("stalled", "unconfirmed", "r0", 0.5), _finding("slot-leaked", "accepted", "r1")])
    job1 = _job("1001", [_finding("stalled", "violation", "r2", 2.0)])
    summary = merge_summaries(target, [JobPart(0, 1, job0), JobPart(1, 1001, job1)])
    assert [(f.signature, f.status.value, f.job, f.jobs) for f in summary.findings] == \
        [("stalled", "violation", 1, (0, 1)), ("slot-leaked", "accepted", 0, (0,))]
    stalled = summary.findings[0]
    assert stalled.seen == 2 and stalled.found_after_s == 0.5, "seen sums the jobs; found is the first sighting"
    assert summary.failed and summary.to_json()["replay"]["stalled"] == "replay r2"
    assert (summary.examples, summary.sentinel.mlx_calls, summary.oracle_counts) == (20, 200, {"stalled": 2})
    assert [(j.seed, j.run_dir) for j in summary.jobs] == [("1", "/runs/1"), ("1001", "/runs/1001")]

    clean = merge_summaries(target, [JobPart(0, 1, _job("1", [])), JobPart(1, 1001, _job("1001", []))])
    assert not clean.failed and clean.crashes == () and clean.to_json()["crashes"] == []
    crashed = merge_summaries(target, [JobPart(0, 1, _job("1", [])),
                                       JobPart(1, 1001, None, "the fuzz process was killed by SIGKILL", None, 3)])
    assert crashed.failed and crashed.examples == 13
    assert crashed.to_json()["crashes"] == [{"job": 1, "why": "the fuzz process was killed by SIGKILL",
                                             "report": None, "replay": None}]
    assert RunSummary.from_json(json.loads(json.dumps(crashed.to_json()))) == crashed


def test_a_child_s_result_line_carries_its_findings_to_the_parent_intact() -> None:
    sent = _job("7", [_finding("mlx-off-owner @ a.py:f", "violation", "/runs/7/findings/01", 1.25),
                      _finding("stalled", "unconfirmed", "/runs/7/findings/02")])
    state: dict = {}
    outcome = JobOutcome(0)
    take_line(result_line(sent) + "\n", state, outcome)
    assert outcome.summary == sent and outcome.summary.findings == sent.findings
    assert outcome.failed and outcome.headline == "mlx-off-owner @ a.py:f" and state["examples"] == 10
