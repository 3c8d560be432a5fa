"""The run folder: what every fuzz run leaves behind, pass or fail.

A run that finds nothing must still show what it did (which target, on what
device, with which seed, how many scenarios, and that the sentinel saw MLX
at all), and a run that finds something must hand over each finding ready
to act on. `write_run_folder` writes, under the report folder:

    <time>-<target>/
      summary.json    a `fuzz.summary.RunSummary`: target, versions, device, seed, budget,
                      scenarios, requests drawn (past which capacity, from where), the points
                      faults aimed at (`fuzz.aims`), per-oracle
                      counts, sentinel totals (MLX calls, threads), every finding with its status,
                      replay command and time to first find
      summary.md      the same for people; a CI job can append it to its job summary as is
      junit.xml       one case for the run, one per distinct finding (new: failure; accepted
                      or unconfirmed: skipped, with why)
      server.log      an HTTP target's server output, when the run started the server
      findings/NN-<status>-<oracle>-<id>/   each finding's report (`fuzz.report.write_report`):
                      report.txt, report.json, scenario.json (shrunk when it replayed), replay.sh

The CLI, child processes (`fuzz.jobs`) and the pytest API all call it. With
`--jobs N` above 1, each child writes its run folder as `job<i>/` inside the
run's folder, and the parent writes the merged summary.json, summary.md and
junit.xml beside them (`write_merged_folder`), from the children's
`RunSummary` values: totals, per-job seeds, each distinct finding once
(pointing at its job's report), and crashed jobs.
"""

from __future__ import annotations

import json
import re
import shutil
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from mlx_invariants.fuzz.findings import short_id
from mlx_invariants.fuzz.pace import Pace
from mlx_invariants.fuzz.report import device_info, device_line, write_report
from mlx_invariants.fuzz.reproduce import replay_shell_command
from mlx_invariants.fuzz.summary import (CrashSummary, FindingSummary, JobSummary, RunSummary, SentinelTotals, Status,
                                          render_finding)
from mlx_invariants.fuzz.target import Target

if TYPE_CHECKING:
    from mlx_invariants.fuzz.runner import FuzzResult

_VERSIONED = ("mlx-invariants", "mlx", "mlx-lm", "hypothesis")


def write_run_folder(result: "FuzzResult", directory: str | Path, *, server_log: Optional[Path] = None,
                     new_folder: bool = True) -> Path:
    """Write `result`'s run folder: a new `<time>-<target>` folder under `directory` (or `directory` itself
    with `new_folder=False`). Sets each finding's `report_dir`, `result.run_dir`, `result.report_dir`
    (the first new finding's report) and `result.summary`; returns the run folder."""
    folder = _new_folder(Path(directory), result.engine) if new_folder else Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    for number, finding in enumerate(result.findings, 1):
        name = f"{number:02d}-{finding.status.value}-{finding.kind}-{short_id(finding.signature)}"
        finding.report_dir = write_report(folder / "findings", finding.failure, name=name)
    new = result.new_findings
    result.run_dir = folder
    result.report_dir = new[0].report_dir if new else None
    if server_log is not None and server_log.is_file():
        shutil.copyfile(server_log, folder / "server.log")
    result.summary = summarize(result)
    write_summary(folder, result.summary)
    return folder


def write_summary(folder: Path, summary: RunSummary) -> None:
    """summary.json, summary.md and junit.xml of `summary` in `folder`."""
    (folder / "summary.json").write_text(json.dumps(summary.to_json(), indent=2, default=str) + "\n")
    (folder / "summary.md").write_text(render_markdown(summary))
    (folder / "junit.xml").write_text(render_junit(summary))


def _new_folder(directory: Path, label: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{time.strftime('%Y%m%d-%H%M%S')}-{label}")[:80]
    folder, suffix = directory / slug, 1
    while folder.exists():
        suffix += 1
        folder = directory / f"{slug}-{suffix}"
    return folder


def versions() -> dict[str, Optional[str]]:
    """Installed versions of what the run depends on (None where not installed)."""
    found: dict[str, Optional[str]] = {}
    for name in _VERSIONED:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def summarize(result: "FuzzResult") -> RunSummary:
    """The run as reported (summary.json), its findings' reports as far as they are written."""
    return RunSummary(
        label=result.target.label if result.target else result.engine, target=result.target,
        examples=result.examples, elapsed_s=round(result.elapsed_s, 2), budget_s=result.budget_s,
        seed=result.seed, examples_cap=result.examples_cap, requests=result.requests, aims=result.aims,
        scenario_runs=result.scenario_runs, engines_started=result.engines_started,
        pace=Pace(**result.pace.to_json()),  # as summary.json rounds it, so it reads back the same
        oracle_counts=dict(sorted(result.counts.items())),
        sentinel=SentinelTotals(result.mlx_calls, len(result.mlx_threads), tuple(result.mlx_threads),
                                round(result.mlx_s, 3)),
        findings=tuple(f.summary() for f in result.findings),
        versions=versions(), device=device_info(), run_dir=str(result.run_dir) if result.run_dir else None)


def render_markdown(summary: RunSummary) -> str:
    """summary.md: a verdict line, the run's facts, a row per finding, then each finding as the command
    line prints it (`render_finding`: how it was judged, when found, its report and replay command)."""
    counts = summary.counts
    if summary.failed:
        verdict = f"**FAILED**: {counts['violation'] + len(summary.crashes)} new finding(s)"
    else:
        verdict = "**passed**: no new finding"
    extra = [f"{counts[s]} {s}" for s in ("accepted", "unconfirmed") if counts[s]]
    lines = [f"## mlx-invariants fuzz: `{summary.label}`", "",
             verdict + (f" ({', '.join(extra)})" if extra else ""), ""]
    cap = summary.examples_cap
    sentinel, target = summary.sentinel, summary.target
    facts = [
        ("target", f"`{target.kind.value} {target.name}`" if target else summary.label),
        ("examples", f"{summary.examples} in {summary.elapsed_s:.1f}s ({summary.limits()})"),
        ("scenario runs", f"{summary.scenario_runs} (confirmation and shrinking included), "
                          f"{summary.engines_started} engine(s) started"),
        ("requests", summary.requests.describe() if summary.requests else "scenarios given, not generated"),
        ("seed", ", ".join(f"job{j.job} {j.seed}" for j in summary.jobs) if summary.jobs else str(summary.seed)),
        ("device", device_line(summary.device)),
        ("versions", ", ".join(f"{k} {v}" for k, v in summary.versions.items() if v)),
        ("sentinel", f"{sentinel.mlx_calls} MLX call(s) on {sentinel.threads} thread(s)"),
    ]
    if summary.pace is not None:  # a merged summary has none: each job measured its own (its summary.md)
        facts.append(("pace", f"{summary.pace.step_s * 1000:.1f} ms per decode step, "
                              f"startup {summary.pace.startup_s:.1f}s"))
    lines += ["| | |", "|---|---|"] + [f"| {k} | {_cell(v)} |" for k, v in facts] + [""]
    if summary.jobs:
        lines += ["### Jobs", "", "| job | seed | examples | scenario runs | findings | run folder |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {j.job} | {j.seed} | {j.examples} | {j.scenario_runs} | "
                  f"{_cell(j.crashed or j.findings)} | {_cell(j.run_dir or '')} |" for j in summary.jobs] + [""]
    if summary.crashes:
        lines += ["### Crashed jobs", ""] + [f"- job {c.job}: {_cell(c.why)}"
                                             + (f", report `{c.report}`" if c.report else "") for c in summary.crashes]
        lines += ["", "```"] + [c.replay for c in summary.crashes if c.replay] + ["```", ""]
    if summary.findings:
        lines += ["### Findings", "", "| status | oracle | headline | confirmation | found after | scenario | picture |",
                  "|---|---|---|---|---|---|---|"]
        for f in summary.findings:
            k, n = f.confirmation
            # The finding's timeline (fuzz.timeline), relative to this file: it opens from the run folder
            # (a merged run's findings are in its jobs' folders).
            where = f"job{f.job}/findings" if f.job is not None else "findings"
            picture = f"[timeline]({where}/{Path(f.report).name}/timeline.svg)" if f.report else ""
            found = (f"{f.found_after_s:.1f}s" + (f", example {f.examples_before}" if f.examples_before else "")
                     if f.found_after_s is not None else "")
            lines.append(f"| {f.status.value} | `{f.oracle}`{' (exact)' if f.exact else ''} | "
                         f"{_cell(f.headline[:200])} | {k}/{n} | {found} | {_cell(f.scenario)} | {picture} |")
        lines += ["", "Each finding, with the command that replays it on a fresh engine:", "", "```text"]
        lines += [render_finding(f) for f in summary.findings]
        lines += ["```", ""]
    if summary.oracle_counts:
        lines += ["Oracles that fired (examples): "
                  + ", ".join(f"`{k}` {v}" for k, v in summary.oracle_counts.items()), ""]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_junit(summary: RunSummary) -> str:
    """junit.xml: the run as one case (failing when something new was found), one case per finding and
    one per crashed job (`--jobs`), written from the summary alone so a merged one renders the same way."""
    classname = f"mlx_invariants.fuzz.{re.sub(r'[^A-Za-z0-9_]+', '_', summary.label)}"
    findings, crashes = summary.findings, summary.crashes
    new = [f.headline for f in summary.new_findings] + [c.why for c in crashes]
    suite = ET.Element("testsuite", name=f"mlx-invariants fuzz {summary.label}",
                       tests=str(len(findings) + len(crashes) + 1), failures=str(len(new)),
                       skipped=str(len(findings) - len(summary.new_findings)), time=f"{summary.elapsed_s:.2f}")
    run = ET.SubElement(suite, "testcase", classname=classname, name="run", time=f"{summary.elapsed_s:.2f}")
    if summary.failed:
        ET.SubElement(run, "failure", message=f"{len(new)} new finding(s)").text = "\n".join(new)
    ET.SubElement(run, "system-out").text = render_markdown(summary)
    for finding in findings:
        case = ET.SubElement(suite, "testcase", classname=classname, name=f"{finding.oracle} {finding.id}")
        body = f"{render_finding(finding)}\nsignature: {finding.signature}"
        if finding.new:
            ET.SubElement(case, "failure", message=finding.headline[:500], type=finding.oracle).text = body
        else:
            k, n = finding.confirmation
            why = "accepted by the baseline" if finding.status is Status.ACCEPTED else \
                f"unconfirmed: {k} of {n} re-runs showed it"
            ET.SubElement(case, "skipped", message=f"{why}: {finding.headline[:400]}").text = body
    for crash in crashes:
        case = ET.SubElement(suite, "testcase", classname=classname, name=f"process-crashed job{crash.job}")
        ET.SubElement(case, "failure", message=crash.why[:500], type="process-crashed").text = \
            f"{crash.why}\nreplay: {crash.replay or ''}\nreport: {crash.report}"
    suites = ET.Element("testsuites")
    suites.append(suite)
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


@dataclass(frozen=True)
class JobPart:
    """One `--jobs` child as the parent knows it at the end: its `RunSummary` (None if it died first),
    and for one that died, why, its crash report (if the scenario it was running is known) and the
    examples it had last reported."""

    job: int
    seed: Optional[int]
    summary: Optional[RunSummary]
    crashed: Optional[str] = None
    report: Optional[str] = None
    examples: int = 0


def write_merged_folder(folder: str | Path, target: Target, jobs: list[JobPart]) -> RunSummary:
    """The run folder of `--jobs N`: summary.json, summary.md and junit.xml over every job, beside the
    jobs' own run folders. Returns the merged summary."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    summary = replace(merge_summaries(target, jobs), run_dir=str(folder))
    write_summary(folder, summary)
    return summary


def merge_summaries(target: Target, jobs: list[JobPart]) -> RunSummary:
    """One summary of the same shape as a single run's: totals over the jobs, each distinct finding once
    (pointing at the report of a job that saw it), the crashed jobs, and a row per job."""
    done = [job.summary for job in jobs if job.summary is not None]
    rows = tuple(JobSummary(job.job, job.summary.seed if job.summary else (None if job.seed is None else str(job.seed)),
                            job.summary.examples if job.summary else job.examples,
                            job.summary.scenario_runs if job.summary else None,
                            len(job.summary.findings) if job.summary else 0, job.crashed,
                            job.summary.run_dir if job.summary else None) for job in jobs)
    findings = distinct([replace(f, job=job.job) for job in jobs if job.summary for f in job.summary.findings])
    crashes = tuple(CrashSummary(j.job, j.crashed, j.report,
                                 replay_shell_command(Path(j.report) / "scenario.json", target) if j.report else None)
                    for j in jobs if j.crashed)
    caps = [part.examples_cap for part in done]
    oracle_counts: dict[str, int] = {}
    for part in done:
        for oracle, count in part.oracle_counts.items():
            oracle_counts[oracle] = oracle_counts.get(oracle, 0) + count
    return RunSummary(
        label=target.label, target=target, examples=sum(row.examples for row in rows),
        elapsed_s=max((part.elapsed_s for part in done), default=0.0),
        budget_s=max((part.budget_s for part in done), default=0.0), seed=tuple(row.seed for row in rows),
        examples_cap=sum(caps) if caps and None not in caps else None,
        requests=done[0].requests if done else None, aims=done[0].aims if done else None,
        scenario_runs=sum(part.scenario_runs for part in done),
        engines_started=sum(part.engines_started for part in done), pace=None,
        oracle_counts=dict(sorted(oracle_counts.items())),
        sentinel=SentinelTotals(sum(part.sentinel.mlx_calls for part in done), sum(part.sentinel.threads for part in done),
                                tuple(sorted({n for part in done for n in part.sentinel.thread_names})),
                                round(sum(part.sentinel.mlx_s for part in done), 3)),
        findings=tuple(findings), crashes=crashes, jobs=rows, versions=versions(), device=device_info())


_RANK = {Status.VIOLATION: 0, Status.ACCEPTED: 1, Status.UNCONFIRMED: 2}


def distinct(findings: list[FindingSummary]) -> list[FindingSummary]:
    """One finding per signature across jobs (each with its `job`), in the order first seen: a job that
    confirmed it outranks one that did not; `jobs` lists every job that saw it, `seen` sums their
    examples, and `found_after_s` is the earliest (in its own job's time: the jobs started together)."""
    best: dict[str, FindingSummary] = {}
    for finding in findings:
        held = best.get(finding.signature)
        if held is None:
            best[finding.signature] = replace(finding, jobs=(finding.job,))
            continue
        kept = finding if _RANK[finding.status] < _RANK[held.status] else held
        times = [f for f in (held, finding) if f.found_after_s is not None]
        first = min(times, key=lambda f: f.found_after_s) if times else kept
        best[finding.signature] = replace(kept, seen=held.seen + finding.seen, jobs=held.jobs + (finding.job,),
                                          found_after_s=first.found_after_s, examples_before=first.examples_before)
    return list(best.values())
