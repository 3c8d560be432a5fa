"""Findings a maintainer can act on: `--keep-going` reports every distinct bug once, shrunk and
replayable; a baseline accepts known ones; a finding that does not replay is listed as unconfirmed and
fails nothing; setup mistakes exit 2 with their cause; every run leaves its run folder."""

from __future__ import annotations

import dataclasses
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from mlx_invariants.cli import main
from mlx_invariants.fuzz.baseline import load_baseline, write_baseline
from mlx_invariants.fuzz.case import dumps_case
from mlx_invariants.fuzz.findings import frames_that_matter, signature
from mlx_invariants.fuzz.oracles import Violation, is_exact
from mlx_invariants.fuzz.replay import replay
from mlx_invariants.fuzz.scenario import RequestSpec, Scenario
from mlx_invariants.mutants import select
from mlx_invariants.mutants.copies import import_copy
from tests.conftest import BACKSTOP_S
from tests.fuzz import flaky_engine

NO_BUDGET = ("--budget", str(BACKSTOP_S))  # runs that end on --examples, not on the profile's budget


def fuzz(*argv: str) -> int:
    return main(["fuzz", "--jobs", "0", *argv])


@pytest.fixture
def unhurried_shrinking(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command has no option for the shrinking time (60 s by default, which a loaded box has run out
    of before reaching one fault): in-process runs (`--jobs 0`) get the backstop, as run_fuzz callers can."""
    from mlx_invariants.commands import fuzz as command

    settings_of = command.settings_of
    monkeypatch.setattr(command, "settings_of",
                        lambda args: dataclasses.replace(settings_of(args), shrink_s=BACKSTOP_S))


def run_folder(reports: Path) -> Path:
    [folder] = [p for p in reports.iterdir() if (p / "summary.json").is_file()]
    return folder


def summary_of(reports: Path) -> dict:
    return json.loads((run_folder(reports) / "summary.json").read_text())


@pytest.fixture(scope="module")
def two_bugs(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The simple engine with two catalogue bugs at once: M01 (slot freed on cancel) and M22 (an array
    built on the loop, evaluated on the owner)."""
    m01, m22 = select(["M01", "M22"])
    both = dataclasses.replace(m01, id="M01-M22-two-bugs", edits=m01.edits + m22.edits)
    return f"{import_copy(both, tmp_path_factory.mktemp('plants'))}:SimpleEngine"


def test_keep_going_reports_both_bugs_and_a_baseline_fails_only_on_the_new_one(two_bugs, tmp_path, capsys,
                                                                                unhurried_shrinking):
    first = tmp_path / "first"
    # Both are found within the first 5 examples (the seed corpus); the count, not a budget, ends the search.
    assert fuzz("--engine", two_bugs, "--keep-going", "--examples", "6", *NO_BUDGET, "--report", str(first)) == 1
    summary = summary_of(first)
    found = {f["oracle"]: f for f in summary["findings"]}
    assert set(found) == {"slot-freed-early", "mlx-no-stream"}, summary["findings"]
    assert all(f["status"] == "violation" for f in found.values())
    for finding in found.values():
        report = Path(finding["report"])
        scenario = json.loads((report / "scenario.json").read_text())
        assert len(scenario["requests"]) <= 2 and len(scenario["faults"]) <= 1, finding["scenario"]
        assert (report / "replay.sh").read_text().strip().endswith(f"--replay {report / 'scenario.json'}")
        replayed = replay(report / "scenario.json")  # the file names its target: the two-bug copy
        assert replayed.reproduced == 1 and finding["oracle"] in {v.kind for v in replayed.runs[0]}
    out = capsys.readouterr().out
    assert out.count("VIOLATION") == 2 and out.count(" -m mlx_invariants fuzz --replay ") == 2

    one = write_baseline(tmp_path / "one.json", [found["slot-freed-early"]])
    both = write_baseline(tmp_path / "both.json", found.values())
    second, third = tmp_path / "second", tmp_path / "third"
    assert fuzz("--engine", two_bugs, "--examples", "5", *NO_BUDGET, "--report", str(second),
                "--baseline", str(one)) == 1
    statuses = {f["oracle"]: f["status"] for f in summary_of(second)["findings"]}
    assert statuses["mlx-no-stream"] == "violation" and statuses.get("slot-freed-early") in (None, "accepted")
    assert fuzz("--engine", two_bugs, "--examples", "5", *NO_BUDGET, "--report", str(third),
                "--baseline", str(both)) == 0
    assert {f["status"] for f in summary_of(third)["findings"]} == {"accepted"}
    junit = ET.parse(run_folder(first) / "junit.xml").getroot()
    cases = junit.findall("testsuite/testcase")
    assert [c.get("name") for c in cases][0] == "run" and len(cases) == 3
    assert all(c.find("failure") is not None for c in cases)
    assert ET.parse(run_folder(third) / "junit.xml").getroot().find("testsuite").get("failures") == "0"


def test_a_finding_that_does_not_replay_is_unconfirmed_and_the_search_goes_on(tmp_path, capsys):
    flaky_engine.reset()
    assert fuzz("--engine", "tests.fuzz.flaky_engine:make_leaky", "--examples", "12", *NO_BUDGET,
                "--report", str(tmp_path)) == 0
    summary = summary_of(tmp_path)
    [finding] = [f for f in summary["findings"] if f["oracle"] == "slot-leaked"]  # a busy box may add loop-lag
    assert finding["status"] == "unconfirmed"
    assert finding["confirmation"] == [0, 3] and not finding["exact"]
    assert summary["examples"] == 12, "the search stopped at an unconfirmed finding"
    assert "unconfirmed (0 of 3 re-runs): slot-leaked" in capsys.readouterr().out
    report = (Path(finding["report"]) / "report.txt").read_text()
    assert report.startswith("FUZZ FINDING (unconfirmed: 0 of 3 re-runs showed it)")
    junit = ET.parse(run_folder(tmp_path) / "junit.xml").getroot()
    assert [c.find("skipped") is not None for c in junit.findall("testsuite/testcase")] == [False, True]


def test_write_baseline_accepts_what_the_run_found(tmp_path, capsys):
    flaky_engine.reset()  # the leak never repeats: even the loosest confirmation leaves it unconfirmed
    written = tmp_path / "baseline.json"
    assert fuzz("--engine", "tests.fuzz.flaky_engine:make_leaky", "--examples", "6", *NO_BUDGET, "--replays", "1",
                "--confirm", "1", "--report", str(tmp_path / "r"), "--write-baseline", str(written)) == 0
    [finding] = [f for f in summary_of(tmp_path / "r")["findings"] if f["oracle"] == "slot-leaked"]
    assert finding["confirmation"] == [0, 1]
    assert finding["signature"] in load_baseline(written)
    assert f"baseline: wrote {written}" in capsys.readouterr().out


def test_a_busy_refusal_is_named_in_the_headline(tmp_path):
    flaky_engine.reset()
    assert fuzz("--engine", "tests.fuzz.flaky_engine:make_busy", "--examples", "6", *NO_BUDGET,
                "--report", str(tmp_path)) == 0
    [finding] = [f for f in summary_of(tmp_path)["findings"] if f["oracle"] == "followup-differs"]
    assert "the follow-up was refused as busy" in finding["headline"], finding["headline"]


def test_a_release_within_the_grace_is_not_a_leak(tmp_path):
    assert fuzz("--engine", "tests.fuzz.flaky_engine:make_late", "--examples", "6", *NO_BUDGET,
                "--report", str(tmp_path)) == 0
    assert summary_of(tmp_path)["findings"] == []


def test_a_clean_run_leaves_its_evidence(tmp_path, capsys):
    assert fuzz("--engine", "simple", "--examples", "4", *NO_BUDGET, "--report", str(tmp_path)) == 0
    folder = run_folder(tmp_path)
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["result"] == "pass" and summary["target"]["name"] == "simple"
    assert summary["versions"]["mlx-invariants"] and summary["device"]["default_device"]
    assert summary["seed"]
    assert summary["examples"] > 0 and summary["scenario_runs"] >= summary["examples"]
    assert summary["sentinel"]["mlx_calls"] > 0 and summary["sentinel"]["thread_names"] == ["mlx-owner-simple"]
    assert summary["pace"]["step_s"] > 0
    markdown = (folder / "summary.md").read_text()
    assert "**passed**" in markdown and "MLX call(s)" in markdown
    suite = ET.parse(folder / "junit.xml").getroot().find("testsuite")
    assert suite.get("tests") == "1" and suite.get("failures") == "0"
    assert [c.get("name") for c in suite.findall("testcase")] == ["run"]
    assert f"run folder: {folder}" in capsys.readouterr().out


def test_a_budget_alone_is_wall_time_with_no_example_cap(tmp_path):
    """Only what a slow box cannot break: the run lasts at least its budget, however few examples fit in it
    (on a loaded box the baseline alone may take the 3 s, so no count of examples is asserted)."""
    assert fuzz("--engine", "simple", "--budget", "3", "--report", str(tmp_path)) == 0
    summary = summary_of(tmp_path)
    assert summary["result"] == "pass" and summary["budget_s"] == 3 and summary["examples_cap"] is None
    assert summary["elapsed_s"] >= 3, "the budget is wall time: nothing may stop the search before it"
    assert "no example cap" in (run_folder(tmp_path) / "summary.md").read_text()


def test_an_example_cap_is_stated(tmp_path):
    assert fuzz("--engine", "simple", "--examples", "4", *NO_BUDGET, "--report", str(tmp_path)) == 0
    summary = summary_of(tmp_path)
    assert summary["examples_cap"] == 4 and summary["examples"] == 4
    assert "capped at 4 examples" in (run_folder(tmp_path) / "summary.md").read_text()


@pytest.mark.parametrize("jobs", ["0", "1"])
def test_a_server_that_cannot_start_is_a_setup_error(jobs, tmp_path, capsys):
    command = f"{sys.executable} -m no_such_server_package --port {{port}}"
    assert main(["fuzz", "--server-cmd", command, "--jobs", jobs, "--report", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert "exited with status 1 before it listened" in captured.err
    [error] = [line for line in captured.err.splitlines() if line.startswith("invariants fuzz:")]
    assert "No module named no_such_server_package" in error  # the cause, on the line that says what failed
    assert "replay" not in captured.out and "VIOLATION" not in captured.out + captured.err


def test_a_server_that_never_answers_is_a_setup_error_naming_the_wait():
    from mlx_invariants.fuzz.adapters.http import ServerProcess
    from mlx_invariants.fuzz.errors import ServerError

    # The wait must outlast the interpreter's start, or the log line the error quotes is not written yet:
    # 1 s did not under load (the message's log tail was empty); 10 s is nothing to a process that prints first.
    server = ServerProcess(f"{sys.executable} -c 'import time; print(\"loading\", flush=True); time.sleep(600)' "
                           "{port}", startup_s=10.0)
    with pytest.raises(ServerError, match=r"never became ready: nothing answered .* within 10s") as raised:
        server.ensure()
    assert "loading" in str(raised.value)  # its last log lines
    assert server.process is None  # stopped, not left running


def test_an_engine_that_never_starts_is_a_setup_error(tmp_path, capsys):
    assert fuzz("--engine", "tests.fuzz.flaky_engine:make_broken", "--report", str(tmp_path)) == 2
    captured = capsys.readouterr()
    assert "the engine did not start: FileNotFoundError: model weights not found" in captured.err
    assert "replay" not in captured.out


def test_a_missing_baseline_is_a_usage_error(tmp_path, capsys):
    assert fuzz("--baseline", str(tmp_path / "none.json"), "--report", str(tmp_path)) == 2
    assert "cannot read the baseline" in capsys.readouterr().err


def test_signatures_keep_the_engine_frames_without_line_numbers():
    stack = ("/usr/lib/python3.11/threading.py:1002 in _bootstrap",
             "/site/mlx_invariants/fuzz/driver.py:10 in hook",
             "/tmp/plants/pkg/serial.py:72 in _iteration", "/tmp/plants/pkg/serial.py:93 in _generate",
             "/tmp/plants/pkg/points.py:44 in reach")
    assert frames_that_matter(stack) == ("serial.py:_iteration", "serial.py:_generate", "points.py:reach")
    moved = tuple(line.replace(":93 ", ":97 ") for line in stack)
    first = Violation("slot-freed-early", "r0: ...", stacks=(("/x/owner.py:1 in run",), stack))
    again = Violation("slot-freed-early", "followup: ...", stacks=(("/x/other.py:5 in start",), moved))
    assert signature(first) == signature(again) == \
        "slot-freed-early @ points.py:reach < serial.py:_generate < serial.py:_iteration"
    assert signature(Violation("stalled", "...")) == "stalled"
    assert is_exact("mlx-concurrent") and not is_exact("stalled") and not is_exact("slot-leaked")


def test_a_slow_server_is_not_called_stalled_and_its_log_is_kept(tmp_path):
    # One request at a time, 0.5 s before the first token: three 0.1 s quiet ticks would call it stalled.
    from mlx_invariants.fuzz.runner import run_fuzz
    from mlx_invariants.fuzz.settings import FuzzSettings
    from mlx_invariants.fuzz.target import Target

    target = Target.server(f"{sys.executable} tests/fuzz/slow_server.py {{port}}")
    result = run_fuzz(target, FuzzSettings(examples=3, budget_s=BACKSTOP_S, explicit=(), debug_run=False,
                                           report_dir=tmp_path))
    assert result.ok and not result.findings, [f.failure.headline for f in result.findings]
    assert result.pace.step_s > 0.02 and result.pace.startup_s > 0
    assert "slow server starting" in (result.run_dir / "server.log").read_text()
    # A replay scales its waits the same way: a request queued behind another is not stalled.
    queued = Scenario((RequestSpec("r0", 2, 4, False), RequestSpec("r1", 2, 4, False)))
    (tmp_path / "case.json").write_text(dumps_case(queued, target))
    assert replay(tmp_path / "case.json").runs == [[]]


def test_keep_going_shrinks_a_finding_for_a_quarter_of_the_budget_left_and_no_run_for_less_than_asked():
    """A zoo run with --keep-going spent 60 of its last 70 s shrinking its first finding and never met a second
    bug that a run alone meets in 15 s: with keep-going the search keeps three quarters of what was left when the
    finding was met, confirming it included."""
    from mlx_invariants.fuzz.defaults import SHRINK_FLOOR_S
    from mlx_invariants.fuzz.shrinking import shrink_limit

    assert shrink_limit(60.0, False, 70.0) == 60.0                      # stopping at the finding: all it may have
    assert shrink_limit(60.0, True, 70.0) == 17.5                       # a quarter of the 70 s left
    assert shrink_limit(60.0, True, 1000.0) == 60.0                     # never more than asked
    assert shrink_limit(60.0, True, float("inf")) == 60.0               # an example-capped run has no budget
    assert shrink_limit(60.0, True, 4.0) == SHRINK_FLOOR_S              # met at the budget's end: still a few s
    assert shrink_limit(0.0, True, 70.0) == 0.0                         # --shrink-s 0 stays 0
    assert shrink_limit(60.0, True, 100.0, 10.0) == 15.0                # confirming took 10 of its 25 s
    assert shrink_limit(60.0, True, 100.0, 36.0) == SHRINK_FLOOR_S      # a server's three restarts took all of it


def test_a_finding_shrinking_could_not_make_smaller_reports_its_confirmation_as_its_replays(tmp_path, monkeypatch):
    """M19 met through its seed scenario, which is already its smallest: the confirmation's fresh re-runs were of
    the reported scenario, so no second round of them is made (each run costs a launched server a fresh start)."""
    from mlx_invariants.fuzz import runner
    from mlx_invariants.fuzz.corpus import SEED_SCENARIOS
    from mlx_invariants.fuzz.settings import FuzzSettings
    from mlx_invariants.fuzz.target import Target

    rounds, runs_of = [], []
    replays, run = runner._Fuzz._replays, runner._Fuzz.run

    def counted(self, scenario, kind, runs):
        rounds.append(scenario.describe())
        return replays(self, scenario, kind, runs)

    def each_run(self, scenario, *args, **kwargs):
        runs_of.append(scenario.describe())
        return run(self, scenario, *args, **kwargs)

    monkeypatch.setattr(runner._Fuzz, "_replays", counted)
    monkeypatch.setattr(runner._Fuzz, "run", each_run)
    [m19] = select(["M19"])
    target = Target.reference(m19.routes[0], package=import_copy(m19, tmp_path / "copies"))
    seed = SEED_SCENARIOS["double_cancel_releases_slot"]
    # one of two re-runs confirms it: what is measured is how the replays are counted, not how often M19 shows
    result = runner.run_fuzz(target, FuzzSettings(examples=1, budget_s=BACKSTOP_S, explicit=(seed,), replays=2,
                                                  confirm=1, report_dir=tmp_path / "r", debug_run=False))
    assert result.findings, (runs_of, rounds)
    finding = result.findings[0]
    assert finding.failure.scenario.dumps() == seed.dumps(), finding.failure.scenario.describe()
    assert rounds == [seed.describe()], rounds  # the confirmation's, and no other
    assert finding.failure.reproduced == finding.confirmation, (finding.failure.reproduced, finding.confirmation)
    # the example and its two confirming re-runs, and no replays after them
    assert runs_of.count(seed.describe()) == 3, runs_of


def test_while_shrinking_a_scenario_already_shown_to_fail_is_told_again_not_run_again():
    """Hypothesis asks again for a failing scenario (its final replay of the smallest); each run of it cost a fresh
    engine and its confirming re-runs, a launched server's restarts. The run that showed it is raised again."""
    from mlx_invariants.fuzz import runner
    from mlx_invariants.fuzz.shrinking import Shrinking, violation_type
    from mlx_invariants.fuzz.trace import Trace

    scenario = Scenario((RequestSpec("r0", 1, 1, False),))
    shown = (Trace(), [Violation("slot-freed-early", "the slot went first")])
    fuzz = object.__new__(runner._Fuzz)  # only what _example reads while shrinking
    fuzz.shrinking = Shrinking("slot-freed-early x", (2, 2), (scenario, *shown),
                               failing={scenario.dumps(): (scenario, *shown)})

    def never(*args, **kwargs):
        raise AssertionError("ran a scenario already shown to fail")

    fuzz.run, fuzz._past_grace = never, lambda: True  # past the budget's grace too: still told
    with pytest.raises(violation_type("slot-freed-early x")) as told:
        fuzz._example(scenario)
    assert told.value.trace is shown[0] and told.value.violations == shown[1]


# Both are M19's hunt (a finding met larger than its core: one from the seed corpus is minimal, shrunk at
# once), minutes on two cores (246 s for "none" in a quiet fresh-clone suite at 7d5aedb): nightly, as that hunt is.
@pytest.mark.slow
@pytest.mark.parametrize("shrink_s, shrunk", [(0.0, False), (BACKSTOP_S, True)], ids=["none", "unhurried"])
def test_a_finding_whose_shrinking_ran_out_of_time_is_not_called_shrunk(tmp_path, shrink_s, shrunk):
    """The zoo once showed a 10-request scenario as "shrunk": its shrinking had met the deadline."""
    from mlx_invariants.fuzz.runner import run_fuzz
    from mlx_invariants.fuzz.settings import FuzzSettings
    from mlx_invariants.fuzz.target import Target

    [m19] = select(["M19"])
    target = Target.reference(m19.routes[0], package=import_copy(m19, tmp_path / "copies"))
    result = run_fuzz(target, FuzzSettings(examples=150, budget_s=BACKSTOP_S, explicit=(), replays=1,
                                           report_dir=tmp_path / "r", shrink_s=shrink_s, debug_run=False))
    finding = result.findings[0]
    assert finding.shrunk is shrunk, (finding.shrunk, finding.failure.blob)
    assert ("shrinking stopped at its 0s limit" in (finding.failure.blob or "")) is not shrunk
    if shrunk:  # unshrunk, it is whatever the search first met (more requests than that, as a rule)
        assert len(finding.failure.scenario.requests) <= 2, finding.failure.scenario.describe()
