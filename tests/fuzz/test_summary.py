"""What a run reports is a value: each summary type reads back exactly what it wrote, reads summary.json
files written before its newer keys, and a finding renders as one text wherever it is printed."""

from __future__ import annotations

import json
from dataclasses import replace

from mlx_invariants.fuzz.aims import Aims
from mlx_invariants.fuzz.pace import Pace
from mlx_invariants.fuzz.profiles import Requests
from mlx_invariants.fuzz.summary import (CrashSummary, FindingSummary, JobSummary, RunSummary, SentinelTotals, Status,
                                          render_finding)
from mlx_invariants.fuzz.target import Target

FINDING = FindingSummary(
    signature="slot-freed-early @ serial.py:_release < serial.py:_close", id="0957fa50", status=Status.VIOLATION,
    oracle="slot-freed-early", exact=False, headline="slot-freed-early: r0: SLOT_RELEASED at #12 while ...",
    confirmation=(2, 3), reproduced=(3, 3), shrunk=True, seen=4, scenario="[r0(p1 m1)] cancel at r0@ADMITTED",
    report="/runs/x/findings/01-violation-slot-freed-early-0957fa50", replay="/py -m mlx_invariants fuzz --replay /r",
    found_after_s=2.71, examples_before=12)
UNCONFIRMED = FindingSummary(
    signature="stalled", id="5d1f0bc2", status=Status.UNCONFIRMED, oracle="stalled", exact=False,
    headline="stalled: nothing moved for 5 s", confirmation=(0, 3), reproduced=None, shrunk=False, seen=1,
    scenario="[r0(p2 m3)]")
RUN = RunSummary(
    label="simple", target=Target.reference("simple"), examples=40, elapsed_s=12.34, budget_s=120.0, seed="1234",
    examples_cap=300, requests=Requests(7, 5, "engine"), aims=Aims(("ADMITTED", "CHUNK_SENT"), "declared", 24),
    scenario_runs=52, engines_started=9,
    pace=Pace(step_s=0.0123, startup_s=1.5, mlx_per_step=3.0, mlx_step_s=0.00456), oracle_counts={"stalled": 1,
                                                                                                  "slot-freed-early": 4},
    sentinel=SentinelTotals(1200, 2, ("MainThread", "mlx-owner-simple"), 3.21), findings=(FINDING, UNCONFIRMED),
    versions={"mlx": "0.32.4", "mlx-lm": None}, device={"default_device": "Device(cpu, 0)", "metal": None},
    run_dir="/runs/x")


def _through_json(data: dict) -> dict:
    return json.loads(json.dumps(data))


def test_each_summary_type_reads_back_exactly_what_it_wrote() -> None:
    for value in (FINDING, UNCONFIRMED, CrashSummary(1, "the fuzz process was killed by SIGKILL", "/r/c", "/py x"),
                  JobSummary(0, "7", 10, 12, 1, None, "/runs/x/job0"), SentinelTotals(3, 1, ("owner",), 0.5)):
        assert type(value).from_json(_through_json(value.to_json())) == value
    assert RunSummary.from_json(_through_json(RUN.to_json())) == RUN


def test_a_merged_run_with_jobs_crashes_and_per_job_seeds_reads_back_exactly() -> None:
    merged = RunSummary(
        label="http:python -m srv --port {port}", target=Target.server("python -m srv --port {port}"), examples=13,
        elapsed_s=4.0, budget_s=5.0, seed=("1", None), findings=(FindingSummary(**{**vars(FINDING), "job": 0,
                                                                                    "jobs": (0, 1)}),),
        crashes=(CrashSummary(1, "the fuzz process was killed by SIGKILL"),),
        jobs=(JobSummary(0, "1", 10, 12, 1, None, "/r/job0"), JobSummary(1, None, 3, None, 0, "killed", None)))
    data = _through_json(merged.to_json())
    assert RunSummary.from_json(data) == merged
    assert data["result"] == "fail" and data["seed"] == ["1", None] and data["findings"][0]["jobs"] == [0, 1]
    assert merged.exit_code == 1 and merged.pace is None and merged.startup_s is None


def test_summary_json_keeps_the_keys_earlier_readers_use() -> None:
    data = RUN.to_json()
    assert data["result"] == "fail" and data["counts"] == {"violation": 1, "accepted": 0, "unconfirmed": 1}
    assert data["target"]["label"] == "simple" and data["target"]["name"] == "simple"
    assert data["replay"] == {FINDING.id: FINDING.replay}   # the per-id map, beside each finding's own `replay`
    assert data["sentinel"]["thread_names"] == ["MainThread", "mlx-owner-simple"]
    finding = data["findings"][0]
    assert {"signature", "id", "status", "oracle", "exact", "headline", "confirmation", "reproduced", "shrunk",
            "seen", "scenario", "report"} <= set(finding)
    assert (finding["found_after_s"], finding["examples_before"]) == (2.71, 12)
    assert RUN.first_found_s == 2.71 and RUN.startup_s == 1.5


def test_a_summary_written_before_the_newer_keys_still_reads() -> None:
    old = RUN.to_json()
    del old["run_dir"]
    for finding in old["findings"]:
        for key in ("replay", "found_after_s", "examples_before"):
            del finding[key]
    read = RunSummary.from_json(_through_json(old))
    assert read.findings[0].replay == FINDING.replay, "the replay comes from the run's per-id map"
    assert read.findings[0].found_after_s is None and read.run_dir is None


def test_a_finding_renders_its_verdict_scenario_judgement_report_and_replay() -> None:
    text = render_finding(FINDING)
    assert text.splitlines() == [
        f"VIOLATION {FINDING.headline}",
        "    shrunk scenario: [r0(p1 m1)] cancel at r0@ADMITTED",
        "    seen again in 2/3 re-run(s) on fresh engines, reproduced 3/3, found after 2.7s at example 12, "
        "in 4 example(s)",
        f"    report: {FINDING.report}/report.txt",
        f"    replay: {FINDING.replay}",
    ]
    assert render_finding(FINDING, "[1]").startswith(f"[1] {FINDING.headline}\n")
    assert render_finding(UNCONFIRMED, detail=False) == "unconfirmed (0 of 3 re-runs): stalled: nothing moved for 5 s"


def test_a_run_ended_by_its_count_alone_has_no_budget_and_writes_strict_json() -> None:
    counted = replace(RUN, budget_s=float("inf"))
    text = json.dumps(counted.to_json(), allow_nan=False)  # summary.json stays plain JSON: no Infinity
    assert RunSummary.from_json(json.loads(text)) == counted
    assert counted.limits().startswith("no budget")


def test_the_verdict_line_reports_the_start_up_apart_from_the_budget(capsys) -> None:
    from mlx_invariants.commands.fuzz import print_summary

    print_summary(replace(RUN, findings=()))
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("simple: no new finding in 40 example(s), 12.3s after a 1.5s start-up (budget 120s")
    print_summary(replace(RUN, findings=(), pace=None))
    assert "start-up" not in capsys.readouterr().out.splitlines()[0]
