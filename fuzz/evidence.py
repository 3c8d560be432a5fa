"""The run folder: what every fuzz run leaves behind, pass or fail.

A run that finds nothing must still show what it did (which target, on what
device, with which seed, how many scenarios, and that the sentinel saw MLX
at all), and a run that finds something must hand over each finding ready
to act on. `write_run_folder` writes, under the report folder:

    <time>-<target>/
      summary.json    target, versions, device, seed, budget, scenarios, requests drawn (past
                      which capacity, from where), per-oracle counts,
                      sentinel totals (MLX calls, threads), every finding with its status
      summary.md      the same for people; a CI job can append it to its job summary as is
      junit.xml       one case for the run, one per distinct finding (new: failure; accepted
                      or unconfirmed: skipped, with why)
      server.log      an HTTP target's server output, when the run started the server
      findings/NN-<status>-<oracle>-<id>/   each finding's report (`fuzz.report.write_report`):
                      report.txt, report.json, scenario.json (shrunk when it replayed), replay.sh

The CLI, child processes (`fuzz.jobs`) and the pytest API all call it. With
`--jobs N` above 1, each child writes its run folder as `job<i>/` inside the
run's folder, and the parent writes the merged summary.json, summary.md and
junit.xml beside them (`write_merged_folder`): totals, per-job seeds, each
distinct finding once (pointing at its job's report), and crashed jobs.
"""

from __future__ import annotations

import json
import re
import shutil
import time
import xml.etree.ElementTree as ET
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from mlx_invariants.fuzz.findings import short_id
from mlx_invariants.fuzz.profiles import Requests
from mlx_invariants.fuzz.report import device_info, device_line, write_report
from mlx_invariants.fuzz.reproduce import replay_shell_command
from mlx_invariants.fuzz.target import Target

if TYPE_CHECKING:
    from mlx_invariants.fuzz.runner import FuzzResult

_VERSIONED = ("mlx-invariants", "mlx", "mlx-lm", "hypothesis")


def write_run_folder(result: "FuzzResult", directory: str | Path, *, server_log: Optional[Path] = None,
                     new_folder: bool = True) -> Path:
    """Write `result`'s run folder: a new `<time>-<target>` folder under `directory` (or `directory` itself
    with `new_folder=False`). Sets each finding's `report_dir`, `result.run_dir` and `result.report_dir`
    (the first new finding's report); returns the run folder."""
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
    summary = summarize(result)
    (folder / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    (folder / "summary.md").write_text(render_markdown(summary))
    (folder / "junit.xml").write_text(render_junit(summary))
    return folder


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


def summarize(result: "FuzzResult") -> dict[str, Any]:
    """The run as one JSON object (summary.json)."""
    findings = [f.to_json() for f in result.findings]
    statuses = [f["status"] for f in findings]
    return {
        "result": "fail" if result.new_findings else "pass",
        "target": {**result.target.to_dict(), "label": result.target.label} if result.target else result.engine,
        "versions": versions(),
        "device": device_info(),
        "seed": result.seed,
        "budget_s": result.budget_s,
        "elapsed_s": round(result.elapsed_s, 2),
        "examples": result.examples,
        "examples_cap": result.examples_cap,
        "requests": result.requests.to_json() if result.requests else None,
        "scenario_runs": result.scenario_runs,
        "engines_started": result.engines_started,
        "pace": result.pace.to_json(),
        "oracle_counts": dict(sorted(result.counts.items())),
        "sentinel": {"mlx_calls": result.mlx_calls, "threads": len(result.mlx_threads),
                     "thread_names": result.mlx_threads, "mlx_s": round(result.mlx_s, 3)},
        "counts": {status: statuses.count(status) for status in ("violation", "accepted", "unconfirmed")},
        "findings": findings,
        "replay": {short_id(f.signature): replay_shell_command(f.report_dir / "scenario.json", f.failure.target)
                   for f in result.findings if f.report_dir},
    }


def render_markdown(summary: dict[str, Any]) -> str:
    """summary.md: a verdict line, the run's facts, then one row per finding with its replay command."""
    target = summary["target"]
    label = target["label"] if isinstance(target, dict) else target
    counts = summary["counts"]
    crashes = summary.get("crashes", [])
    jobs = summary.get("jobs")
    if summary["result"] == "fail":
        verdict = f"**FAILED**: {counts['violation'] + len(crashes)} new finding(s)"
    else:
        verdict = "**passed**: no new finding"
    extra = [f"{counts[s]} {s}" for s in ("accepted", "unconfirmed") if counts[s]]
    lines = [f"## mlx-invariants fuzz: `{label}`", "", verdict + (f" ({', '.join(extra)})" if extra else ""), ""]
    cap = summary["examples_cap"]
    sentinel = summary["sentinel"]
    facts = [
        ("target", f"`{target.get('kind')} {target.get('name')}`" if isinstance(target, dict) else label),
        ("examples", f"{summary['examples']} in {summary['elapsed_s']:.1f}s (budget {summary['budget_s']:g}s"
                     + (f", capped at {cap} examples)" if cap else ", no example cap)")),
        ("scenario runs", f"{summary['scenario_runs']} (confirmation and shrinking included), "
                          f"{summary['engines_started']} engine(s) started"),
        ("requests", _requests(summary.get("requests"))),
        ("seed", ", ".join(f"job{j['job']} {j['seed']}" for j in jobs) if jobs else str(summary["seed"])),
        ("device", device_line(summary["device"])),
        ("versions", ", ".join(f"{k} {v}" for k, v in summary["versions"].items() if v)),
        ("sentinel", f"{sentinel['mlx_calls']} MLX call(s) on {sentinel['threads']} thread(s)"),
    ]
    if summary["pace"]:  # a merged summary has none: each job measured its own (its summary.md)
        facts.append(("pace", f"{summary['pace']['step_s'] * 1000:.1f} ms per decode step, "
                              f"startup {summary['pace']['startup_s']:.1f}s"))
    lines += ["| | |", "|---|---|"] + [f"| {k} | {_cell(v)} |" for k, v in facts] + [""]
    if jobs:
        lines += ["### Jobs", "", "| job | seed | examples | scenario runs | findings | run folder |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {j['job']} | {j['seed']} | {j['examples']} | {j['scenario_runs']} | "
                  f"{_cell(j['crashed'] or j['findings'])} | {_cell(j['run_dir'] or '')} |" for j in jobs] + [""]
    if crashes:
        lines += ["### Crashed jobs", ""] + [f"- job {c['job']}: {_cell(c['why'])}"
                                             + (f", report `{c['report']}`" if c["report"] else "") for c in crashes]
        lines += ["", "```"] + [c["replay"] for c in crashes if c["replay"]] + ["```", ""]
    if summary["findings"]:
        lines += ["### Findings", "", "| status | oracle | headline | confirmation | scenario | picture |",
                  "|---|---|---|---|---|---|"]
        for f in summary["findings"]:
            k, n = f["confirmation"]
            # The finding's timeline (fuzz.timeline), relative to this file: it opens from the run folder
            # (a merged run's findings are in its jobs' folders).
            where = f"job{f['job']}/findings" if "job" in f else "findings"
            picture = f"[timeline]({where}/{Path(f['report']).name}/timeline.svg)" if f["report"] else ""
            lines.append(f"| {f['status']} | `{f['oracle']}`{' (exact)' if f['exact'] else ''} | "
                         f"{_cell(f['headline'][:200])} | {k}/{n} | {_cell(f['scenario'])} | {picture} |")
        lines += ["", "Replay each on a fresh engine:", "", "```"]
        lines += [summary["replay"][f["id"]] for f in summary["findings"] if f["id"] in summary["replay"]]
        lines += ["```", ""]
    if summary["oracle_counts"]:
        lines += ["Oracles that fired (examples): "
                  + ", ".join(f"`{k}` {v}" for k, v in summary["oracle_counts"].items()), ""]
    return "\n".join(lines) + "\n"


def _requests(data: Optional[dict[str, Any]]) -> str:
    """The requests row: how many a scenario drew at most, past which capacity, from where."""
    return Requests(**data).describe() if data else "scenarios given, not generated"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_junit(summary: dict[str, Any]) -> str:
    """junit.xml: the run as one case (failing when something new was found), one case per finding and
    one per crashed job (`--jobs`), written from the summary alone so a merged one renders the same way."""
    target = summary["target"]
    label = target["label"] if isinstance(target, dict) else target
    classname = f"mlx_invariants.fuzz.{re.sub(r'[^A-Za-z0-9_]+', '_', label)}"
    findings, crashes = summary["findings"], summary.get("crashes", [])
    new = [f["headline"] for f in findings if f["status"] == "violation"] + [c["why"] for c in crashes]
    suite = ET.Element("testsuite", name=f"mlx-invariants fuzz {label}", tests=str(len(findings) + len(crashes) + 1),
                       failures=str(len(new)), skipped=str(len(findings) - summary["counts"]["violation"]),
                       time=f"{summary['elapsed_s']:.2f}")
    run = ET.SubElement(suite, "testcase", classname=classname, name="run", time=f"{summary['elapsed_s']:.2f}")
    if summary["result"] == "fail":
        ET.SubElement(run, "failure", message=f"{len(new)} new finding(s)").text = "\n".join(new)
    ET.SubElement(run, "system-out").text = render_markdown(summary)
    for finding in findings:
        case = ET.SubElement(suite, "testcase", classname=classname, name=f"{finding['oracle']} {finding['id']}")
        body = (f"{finding['headline']}\nsignature: {finding['signature']}\n"
                f"replay: {summary['replay'].get(finding['id'], '')}\nreport: {finding['report']}")
        if finding["status"] == "violation":
            ET.SubElement(case, "failure", message=finding["headline"][:500], type=finding["oracle"]).text = body
        else:
            k, n = finding["confirmation"]
            why = "accepted by the baseline" if finding["status"] == "accepted" else \
                f"unconfirmed: {k} of {n} re-runs showed it"
            ET.SubElement(case, "skipped", message=f"{why}: {finding['headline'][:400]}").text = body
    for crash in crashes:
        case = ET.SubElement(suite, "testcase", classname=classname, name=f"process-crashed job{crash['job']}")
        ET.SubElement(case, "failure", message=crash["why"][:500], type="process-crashed").text = \
            f"{crash['why']}\nreplay: {crash['replay'] or ''}\nreport: {crash['report']}"
    suites = ET.Element("testsuites")
    suites.append(suite)
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def write_merged_folder(folder: str | Path, target: Target, jobs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run folder of `--jobs N`: summary.json, summary.md and junit.xml over every job, beside the
    jobs' own run folders. `jobs` has one entry per child, in order: `job`, `seed`, `run_dir` (its run
    folder, whose summary.json is read; None when it died), and for a child that died `crashed` (why),
    `report` (its crash report, if the scenario it was running is known) and `examples` (as last
    reported). Returns the summary."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    summary = merge_summaries(target, jobs)
    (folder / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    (folder / "summary.md").write_text(render_markdown(summary))
    (folder / "junit.xml").write_text(render_junit(summary))
    return summary


def merge_summaries(target: Target, jobs: list[dict[str, Any]]) -> dict[str, Any]:
    """One summary of the same shape as a single run's: totals over the jobs, each distinct finding once
    (pointing at the report of a job that saw it), the crashed jobs, and a row per job."""
    parts, rows = {}, []
    for job in jobs:
        path = Path(job["run_dir"]) / "summary.json" if job.get("run_dir") else None
        part = parts[job["job"]] = json.loads(path.read_text()) if path and path.is_file() else None
        rows.append({"job": job["job"], "seed": part["seed"] if part else job["seed"],
                     "examples": part["examples"] if part else job.get("examples", 0),
                     "scenario_runs": part["scenario_runs"] if part else None,
                     "findings": len(part["findings"]) if part else 0,
                     "crashed": job.get("crashed"), "run_dir": job["run_dir"] if part else None})
    done = [part for part in parts.values() if part]
    findings = distinct([{**f, "job": job} for job, part in parts.items() if part for f in part["findings"]])
    crashes = [{"job": j["job"], "why": j["crashed"], "report": j.get("report"),
                "replay": replay_shell_command(Path(j["report"]) / "scenario.json", target) if j.get("report") else None}
               for j in jobs if j.get("crashed")]
    statuses = [f["status"] for f in findings]
    caps = [part["examples_cap"] for part in done]
    oracle_counts: dict[str, int] = {}
    for part in done:
        for oracle, count in part["oracle_counts"].items():
            oracle_counts[oracle] = oracle_counts.get(oracle, 0) + count
    return {
        "result": "fail" if "violation" in statuses or crashes else "pass",
        "target": {**target.to_dict(), "label": target.label},
        "versions": versions(),
        "device": device_info(),
        "seed": [row["seed"] for row in rows],
        "budget_s": max((part["budget_s"] for part in done), default=0.0),
        "elapsed_s": max((part["elapsed_s"] for part in done), default=0.0),
        "examples": sum(row["examples"] for row in rows),
        "examples_cap": sum(caps) if caps and None not in caps else None,
        "requests": done[0].get("requests") if done else None,
        "scenario_runs": sum(part["scenario_runs"] for part in done),
        "engines_started": sum(part["engines_started"] for part in done),
        "pace": None,
        "oracle_counts": dict(sorted(oracle_counts.items())),
        "sentinel": {"mlx_calls": sum(part["sentinel"]["mlx_calls"] for part in done),
                     "threads": sum(part["sentinel"]["threads"] for part in done),
                     "thread_names": sorted({n for part in done for n in part["sentinel"]["thread_names"]}),
                     "mlx_s": round(sum(part["sentinel"]["mlx_s"] for part in done), 3)},
        "counts": {status: statuses.count(status) for status in ("violation", "accepted", "unconfirmed")},
        "findings": findings,
        "crashes": crashes,
        "replay": {f["id"]: parts[f["job"]]["replay"][f["id"]] for f in findings if f["id"] in parts[f["job"]]["replay"]},
        "jobs": rows,
    }


_RANK = {"violation": 0, "accepted": 1, "unconfirmed": 2}


def distinct(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One finding per signature across jobs (`Finding.to_json()` with its `job`), in the order first seen:
    a job that confirmed it outranks one that did not; `jobs` lists every job that saw it and `seen` sums
    their examples."""
    best: dict[str, dict[str, Any]] = {}
    for finding in findings:
        held = best.get(finding["signature"])
        if held is None:
            best[finding["signature"]] = {**finding, "jobs": [finding["job"]]}
            continue
        seen, jobs = held["seen"] + finding["seen"], held["jobs"] + [finding["job"]]
        if _RANK[finding["status"]] < _RANK[held["status"]]:
            held = best[finding["signature"]] = dict(finding)
        held.update(seen=seen, jobs=jobs)
    return list(best.values())
