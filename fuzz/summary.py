"""What a fuzz run found, as values: a `FindingSummary` per distinct finding, a `RunSummary` per run.

These are what leave the run: a `--jobs` child sends its `RunSummary` to the
parent as one JSON line (`fuzz.jobs`), `summary.json` is one `RunSummary`
(merged over the jobs with `--jobs N`), and the CLI's final lines,
`fuzz_engine`'s failure message, `summary.md` and `junit.xml` are all
rendered from them; `render_finding` is the one text of a finding the
first three share. Each is frozen, and `from_json(to_json())` gives it back
exactly; `from_json` also reads summary.json files written before a key was
added (a finding's `replay`, `found_after_s`, `examples_before`; the run's
`run_dir`, `aims`).

`fuzz.evidence.summarize` builds a `RunSummary` from a run's `FuzzResult`
(`Finding.summary()` each finding), once its reports are written: the
replay command is computed there, once per finding (`fuzz.reproduce`), and
every renderer prints that value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, Optional, Union

from mlx_invariants.fuzz.aims import Aims
from mlx_invariants.fuzz.pace import Pace
from mlx_invariants.fuzz.profiles import Requests
from mlx_invariants.fuzz.target import Target


class Status(Enum):
    VIOLATION = "violation"       # fails the run
    ACCEPTED = "accepted"         # in the baseline
    UNCONFIRMED = "unconfirmed"   # replayed too rarely for an oracle that judges timing or outputs


def _pair(value: Any) -> Optional[tuple[int, int]]:
    return (int(value[0]), int(value[1])) if value is not None else None


@dataclass(frozen=True)
class FindingSummary:
    """One distinct finding as it is reported: what it is, how it was judged, where its report is, how to
    replay it, and when the run first saw it. `job` and `jobs` are set in a merged summary only: the job
    whose report `report` is, and every job that saw it."""

    signature: str
    id: str                                  # `fuzz.findings.short_id(signature)`
    status: Status
    oracle: str
    exact: bool                              # its oracle is exact by construction
    headline: str
    confirmation: tuple[int, int]            # k of n re-runs on fresh engines showed it
    reproduced: Optional[tuple[int, int]]    # k of n replays of the reported scenario
    shrunk: bool
    seen: int                                # examples that showed its signature
    scenario: str                            # `Scenario.describe()` of the reported scenario
    report: Optional[str] = None             # its report folder
    replay: Optional[str] = None             # the shell command that replays it (`fuzz.reproduce`)
    found_after_s: Optional[float] = None    # seconds from the run's start to the example that first showed it
    examples_before: Optional[int] = None    # examples run by then, that one included
    job: Optional[int] = None
    jobs: tuple[int, ...] = ()

    @property
    def new(self) -> bool:
        """Fails the run."""
        return self.status is Status.VIOLATION

    @property
    def verdict(self) -> str:
        """How the CLI names it before its headline."""
        if self.status is Status.VIOLATION:
            return "VIOLATION"
        if self.status is Status.ACCEPTED:
            return "accepted (baseline):"
        k, n = self.confirmation
        return f"unconfirmed ({k} of {n} re-runs):"

    def judged(self) -> str:
        """How it was judged and when it was found, in one line."""
        k, n = self.confirmation
        parts = [f"seen again in {k}/{n} re-run(s) on fresh engines" + (" (exact oracle)" if self.exact else "")]
        if self.reproduced is not None:
            parts.append(f"reproduced {self.reproduced[0]}/{self.reproduced[1]}")
        if self.found_after_s is not None:
            at = f" at example {self.examples_before}" if self.examples_before is not None else ""
            parts.append(f"found after {self.found_after_s:.1f}s{at}")
        parts.append(f"in {self.seen} example(s)")
        return ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        data = {"signature": self.signature, "id": self.id, "status": self.status.value, "oracle": self.oracle,
                "exact": self.exact, "headline": self.headline, "confirmation": list(self.confirmation),
                "reproduced": list(self.reproduced) if self.reproduced is not None else None,
                "shrunk": self.shrunk, "seen": self.seen, "scenario": self.scenario, "report": self.report,
                "replay": self.replay, "found_after_s": self.found_after_s, "examples_before": self.examples_before}
        if self.job is not None:
            data.update(job=self.job, jobs=list(self.jobs))
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "FindingSummary":
        return cls(signature=data["signature"], id=data["id"], status=Status(data["status"]), oracle=data["oracle"],
                   exact=bool(data["exact"]), headline=data["headline"], confirmation=_pair(data["confirmation"]),
                   reproduced=_pair(data.get("reproduced")), shrunk=bool(data["shrunk"]), seen=int(data["seen"]),
                   scenario=data["scenario"], report=data.get("report"), replay=data.get("replay"),
                   found_after_s=data.get("found_after_s"), examples_before=data.get("examples_before"),
                   job=data.get("job"), jobs=tuple(data.get("jobs", ())))


def render_finding(finding: FindingSummary, head: Optional[str] = None, *, detail: bool = True) -> str:
    """A finding as text: `head` (default: its verdict) and headline; with `detail`, the scenario, how it
    was judged and when found, its report and its replay command. The CLI, `fuzz_engine`'s failure
    message, summary.md and junit.xml print this."""
    lines = [f"{head or finding.verdict} {finding.headline}"]
    if detail:
        lines.append(f"    {'shrunk' if finding.shrunk else 'unshrunk'} scenario: {finding.scenario}")
        lines.append(f"    {finding.judged()}")
        if finding.report:
            lines.append(f"    report: {finding.report.rstrip('/')}/report.txt")
        if finding.replay:
            lines.append(f"    replay: {finding.replay}")
    return "\n".join(lines)


@dataclass(frozen=True)
class CrashSummary:
    """A `--jobs` child that died (inside MLX, most likely) before it could report."""

    job: int
    why: str
    report: Optional[str] = None   # the crash report of the scenario it was running, if that is known
    replay: Optional[str] = None

    def to_json(self) -> dict[str, Any]:
        return {"job": self.job, "why": self.why, "report": self.report, "replay": self.replay}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "CrashSummary":
        return cls(int(data["job"]), data["why"], data.get("report"), data.get("replay"))


@dataclass(frozen=True)
class JobSummary:
    """One `--jobs` child's row in the merged summary."""

    job: int
    seed: Optional[str]
    examples: int
    scenario_runs: Optional[int]   # None: it died before reporting
    findings: int
    crashed: Optional[str] = None
    run_dir: Optional[str] = None

    def to_json(self) -> dict[str, Any]:
        return {"job": self.job, "seed": self.seed, "examples": self.examples, "scenario_runs": self.scenario_runs,
                "findings": self.findings, "crashed": self.crashed, "run_dir": self.run_dir}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "JobSummary":
        seed = data.get("seed")
        return cls(int(data["job"]), None if seed is None else str(seed), int(data["examples"]),
                   data.get("scenario_runs"), int(data["findings"]), data.get("crashed"), data.get("run_dir"))


@dataclass(frozen=True)
class SentinelTotals:
    """What the MLX sentinel saw over the run: entries, the threads that made them, time inside MLX."""

    mlx_calls: int = 0
    threads: int = 0
    thread_names: tuple[str, ...] = ()
    mlx_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"mlx_calls": self.mlx_calls, "threads": self.threads, "thread_names": list(self.thread_names),
                "mlx_s": self.mlx_s}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "SentinelTotals":
        return cls(int(data["mlx_calls"]), int(data["threads"]), tuple(data.get("thread_names", ())),
                   float(data.get("mlx_s", 0.0)))


_STATUSES = tuple(status.value for status in Status)
Seed = Union[str, tuple[Optional[str], ...], None]   # a run's; a merged run's is one per job


@dataclass(frozen=True)
class RunSummary:
    """A whole run as reported (summary.json): the target, where it ran, how long and how much, what the
    sentinel saw, and each distinct finding in the order found. A merged `--jobs` run also has `jobs`
    (a row per child) and `crashes`, its `seed` is one per job and it has no `pace` (each job measured
    its own). `pace`'s values are as summary.json rounds them."""

    label: str
    target: Optional[Target]
    examples: int
    elapsed_s: float
    budget_s: float
    seed: Seed = None
    examples_cap: Optional[int] = None
    requests: Optional[Requests] = None
    aims: Optional[Aims] = None
    scenario_runs: int = 0
    engines_started: int = 0
    pace: Optional[Pace] = None
    oracle_counts: dict[str, int] = field(default_factory=dict)   # examples in which each oracle fired
    sentinel: SentinelTotals = SentinelTotals()
    findings: tuple[FindingSummary, ...] = ()
    crashes: tuple[CrashSummary, ...] = ()
    jobs: tuple[JobSummary, ...] = ()
    versions: dict[str, Optional[str]] = field(default_factory=dict)   # `fuzz.evidence.versions()`
    device: dict[str, Any] = field(default_factory=dict)               # `fuzz.report.device_info()`
    run_dir: Optional[str] = None                                      # its run folder, if one was written

    # -- what it says ----------------------------------------------------------------
    @property
    def new_findings(self) -> list[FindingSummary]:
        return [f for f in self.findings if f.new]

    @property
    def failed(self) -> bool:
        """Something new was found, or a job crashed."""
        return bool(self.new_findings or self.crashes)

    @property
    def exit_code(self) -> int:
        """`invariants fuzz`'s exit status for it: 1 if it failed, else 0."""
        return 1 if self.failed else 0

    @property
    def counts(self) -> dict[str, int]:
        """Findings per status."""
        return {status: sum(f.status.value == status for f in self.findings) for status in _STATUSES}

    @property
    def startup_s(self) -> Optional[float]:
        """How long the engine took to start (a server: until it answered), if this run measured it."""
        return self.pace.startup_s if self.pace is not None else None

    @property
    def first_found_s(self) -> Optional[float]:
        """Seconds to the first example that showed a new finding."""
        times = [f.found_after_s for f in self.new_findings if f.found_after_s is not None]
        return min(times) if times else None

    def limits(self) -> str:
        """The budget, the example cap, the requests drawn and where faults aimed, in a few words."""
        cap = f"capped at {self.examples_cap} examples" if self.examples_cap else "no example cap"
        budget = f"budget {self.budget_s:g}s" if math.isfinite(self.budget_s) else "no budget"
        return (f"{budget}, {cap}" + (f"; {self.requests.describe()}" if self.requests else "")
                + (f"; {self.aims.describe()}" if self.aims else ""))

    # -- JSON (summary.json, the --jobs child's result line) --------------------------
    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "result": "fail" if self.failed else "pass",
            "target": {**self.target.to_dict(), "label": self.label} if self.target is not None else self.label,
            "versions": dict(self.versions),
            "device": dict(self.device),
            "seed": list(self.seed) if isinstance(self.seed, tuple) else self.seed,
            "budget_s": self.budget_s if math.isfinite(self.budget_s) else None,  # None: the count alone ends it
            "elapsed_s": self.elapsed_s,
            "examples": self.examples,
            "examples_cap": self.examples_cap,
            "requests": self.requests.to_json() if self.requests else None,
            "aims": self.aims.to_json() if self.aims else None,
            "scenario_runs": self.scenario_runs,
            "engines_started": self.engines_started,
            "pace": self.pace.to_json() if self.pace is not None else None,
            "oracle_counts": dict(sorted(self.oracle_counts.items())),
            "sentinel": self.sentinel.to_json(),
            "counts": self.counts,
            "findings": [f.to_json() for f in self.findings],
        }
        if self.jobs or self.crashes:
            data["crashes"] = [c.to_json() for c in self.crashes]
        # Kept beside each finding's own `replay` for readers of earlier summary.json files.
        data["replay"] = {f.id: f.replay for f in self.findings if f.replay}
        if self.jobs:
            data["jobs"] = [j.to_json() for j in self.jobs]
        data["run_dir"] = self.run_dir
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "RunSummary":
        target_data = data["target"]
        if isinstance(target_data, dict):
            target = Target.from_dict(target_data)
            label = target_data.get("label") or target.label
        else:
            target, label = None, str(target_data)
        replays = data.get("replay") or {}
        findings = tuple(FindingSummary.from_json({"replay": replays.get(f["id"]), **{k: v for k, v in f.items()
                                                                                      if v is not None}})
                         for f in data.get("findings", ()))
        seed = data.get("seed")
        pace = data.get("pace")
        requests = data.get("requests")
        aims = data.get("aims")
        return cls(
            label=label, target=target, examples=int(data["examples"]), elapsed_s=float(data["elapsed_s"]),
            budget_s=float("inf") if data["budget_s"] is None else float(data["budget_s"]), seed=tuple(seed) if isinstance(seed, list) else seed,
            examples_cap=data.get("examples_cap"), requests=Requests(**requests) if requests else None,
            aims=Aims.from_json(aims) if aims else None,
            scenario_runs=int(data.get("scenario_runs") or 0), engines_started=int(data.get("engines_started") or 0),
            pace=Pace(**{f.name: pace[f.name] for f in fields(Pace) if f.name in pace}) if pace else None,
            oracle_counts=dict(data.get("oracle_counts") or {}),
            sentinel=SentinelTotals.from_json(data["sentinel"]) if data.get("sentinel") else SentinelTotals(),
            findings=findings, crashes=tuple(CrashSummary.from_json(c) for c in data.get("crashes", ())),
            jobs=tuple(JobSummary.from_json(j) for j in data.get("jobs") or ()),
            versions=dict(data.get("versions") or {}), device=dict(data.get("device") or {}),
            run_dir=data.get("run_dir"))
