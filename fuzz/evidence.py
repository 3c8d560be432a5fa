"""The run folder: what every fuzz run leaves behind, pass or fail.

A run that finds nothing must still show what it did (which target, on what
device, with which seed, how many scenarios, and that the sentinel saw MLX
at all), and a run that finds something must hand over each finding ready
to act on. `write_run_folder` writes, under the report folder:

    <time>-<target>/
      summary.json    target, versions, device, seed, budget, scenarios, per-oracle counts,
                      sentinel totals (MLX calls, threads), every finding with its status
      summary.md      the same for people; a CI job can append it to its job summary as is
      junit.xml       one case for the run, one per distinct finding (new: failure; accepted
                      or unconfirmed: skipped, with why)
      server.log      an HTTP target's server output, when the run started the server
      findings/NN-<status>-<oracle>-<id>/   each finding's report (`fuzz.report.write_report`):
                      report.txt, report.json, scenario.json (shrunk when it replayed), replay.sh

The CLI, child processes (`fuzz.jobs`) and the pytest API all call it.
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

from mlx_invariants.fuzz.findings import Finding, short_id
from mlx_invariants.fuzz.report import device_info, device_line, replay_command, write_report

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
    (folder / "junit.xml").write_text(render_junit(summary, result.findings))
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
        "scenario_runs": result.scenario_runs,
        "engines_started": result.engines_started,
        "pace": result.pace.to_json(),
        "oracle_counts": dict(sorted(result.counts.items())),
        "sentinel": {"mlx_calls": result.mlx_calls, "threads": len(result.mlx_threads),
                     "thread_names": result.mlx_threads, "mlx_s": round(result.mlx_s, 3)},
        "counts": {status: statuses.count(status) for status in ("violation", "accepted", "unconfirmed")},
        "findings": findings,
        "replay": {f["id"]: replay_command(Path(f["report"]) / "scenario.json") for f in findings if f["report"]},
    }


def render_markdown(summary: dict[str, Any]) -> str:
    """summary.md: a verdict line, the run's facts, then one row per finding with its replay command."""
    target = summary["target"]
    label = target["label"] if isinstance(target, dict) else target
    counts = summary["counts"]
    if summary["result"] == "fail":
        verdict = f"**FAILED**: {counts['violation']} new finding(s)"
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
        ("seed", str(summary["seed"])),
        ("device", device_line(summary["device"])),
        ("versions", ", ".join(f"{k} {v}" for k, v in summary["versions"].items() if v)),
        ("sentinel", f"{sentinel['mlx_calls']} MLX call(s) on {sentinel['threads']} thread(s)"),
        ("pace", f"{summary['pace']['step_s'] * 1000:.1f} ms per decode step, "
                 f"startup {summary['pace']['startup_s']:.1f}s"),
    ]
    lines += ["| | |", "|---|---|"] + [f"| {k} | {_cell(v)} |" for k, v in facts] + [""]
    if summary["findings"]:
        lines += ["### Findings", "", "| status | oracle | headline | confirmation | scenario | picture |",
                  "|---|---|---|---|---|---|"]
        for f in summary["findings"]:
            k, n = f["confirmation"]
            # The finding's timeline (fuzz.timeline), relative to this file: it opens from the run folder.
            picture = f"[timeline](findings/{Path(f['report']).name}/timeline.svg)" if f["report"] else ""
            lines.append(f"| {f['status']} | `{f['oracle']}`{' (exact)' if f['exact'] else ''} | "
                         f"{_cell(f['headline'][:200])} | {k}/{n} | {_cell(f['scenario'])} | {picture} |")
        lines += ["", "Replay each on a fresh engine:", "", "```"]
        lines += [summary["replay"][f["id"]] for f in summary["findings"] if f["id"] in summary["replay"]]
        lines += ["```", ""]
    if summary["oracle_counts"]:
        lines += ["Oracles that fired (examples): "
                  + ", ".join(f"`{k}` {v}" for k, v in summary["oracle_counts"].items()), ""]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_junit(summary: dict[str, Any], findings: list[Finding]) -> str:
    """junit.xml: the run as one case (failing when something new was found), one case per finding."""
    target = summary["target"]
    label = target["label"] if isinstance(target, dict) else target
    classname = f"mlx_invariants.fuzz.{re.sub(r'[^A-Za-z0-9_]+', '_', label)}"
    suite = ET.Element("testsuite", name=f"mlx-invariants fuzz {label}", tests=str(len(findings) + 1),
                       failures=str(summary["counts"]["violation"]),
                       skipped=str(len(findings) - summary["counts"]["violation"]),
                       time=f"{summary['elapsed_s']:.2f}")
    run = ET.SubElement(suite, "testcase", classname=classname, name="run", time=f"{summary['elapsed_s']:.2f}")
    if summary["result"] == "fail":
        ET.SubElement(run, "failure", message=f"{summary['counts']['violation']} new finding(s)").text = \
            "\n".join(f.failure.headline for f in findings if f.new)
    ET.SubElement(run, "system-out").text = render_markdown(summary)
    for finding in findings:
        case = ET.SubElement(suite, "testcase", classname=classname,
                             name=f"{finding.kind} {short_id(finding.signature)}")
        replay = replay_command(finding.report_dir / "scenario.json") if finding.report_dir else ""
        body = f"{finding.failure.headline}\nsignature: {finding.signature}\nreplay: {replay}\nreport: {finding.report_dir}"
        if finding.new:
            ET.SubElement(case, "failure", message=finding.failure.headline[:500], type=finding.kind).text = body
        else:
            k, n = finding.confirmation
            why = "accepted by the baseline" if finding.status.value == "accepted" else \
                f"unconfirmed: {k} of {n} re-runs showed it"
            ET.SubElement(case, "skipped", message=f"{why}: {finding.failure.headline[:400]}").text = body
    suites = ET.Element("testsuites")
    suites.append(suite)
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"
