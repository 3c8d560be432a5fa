"""Re-run a saved scenario without Hypothesis: `invariants fuzz --replay FILE`.

FILE is a `scenario.json`, a `report.json`, a report folder, or the
`current.json` a crashed run left behind; each names the target it ran on
(`fuzz.case`), which is used unless another is given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from mlx_invariants.fuzz.case import load_case
from mlx_invariants.fuzz.driver import DriverSettings
from mlx_invariants.fuzz.errors import ReplayError
from mlx_invariants.fuzz.followup import reference_of
from mlx_invariants.fuzz.oracles import Violation, judge
from mlx_invariants.fuzz.pace import Pace, driver_settings, measure
from mlx_invariants.fuzz.report import Failure, device_info
from mlx_invariants.fuzz.scenario import Scenario
from mlx_invariants.fuzz.sentinel import Sentinel
from mlx_invariants.fuzz.session import run_scenario
from mlx_invariants.fuzz.target import Engines, Target
from mlx_invariants.fuzz.trace import Trace


@dataclass
class ReplayResult:
    scenario: Scenario
    target: Target
    runs: list[list[Violation]] = field(default_factory=list)
    failure: Optional[Failure] = None

    @property
    def reproduced(self) -> int:
        return sum(bool(run) for run in self.runs)


def replay(path: str | Path, target: Target | Engines | None = None, *, times: int = 1,
           strict: bool = False) -> ReplayResult:
    """Run the scenario in `path` `times` times, each on a fresh engine of `target` (default: the
    file's), after a request-free baseline that gives the fresh-engine follow-up output."""
    scenario, recorded = load_case(path)
    chosen = target if target is not None else recorded
    if chosen is None:
        raise ReplayError(f"{path} does not say which engine it ran on; pass --engine, --url or --server-cmd")
    engines = chosen if isinstance(chosen, Engines) else chosen.build()
    result = ReplayResult(scenario, engines.target)
    remote = engines.target.kind.http
    sentinel = None
    try:
        startup_s = engines.prepare()  # a server that cannot start is a setup error here too
        sentinel = Sentinel(strict=strict).install()
        # The liveness waits scale with the target's pace, measured on the baseline, as in a search.
        settings, _ = driver_settings(DriverSettings(strict=strict), Pace(startup_s=startup_s), remote)
        baseline = run_scenario(engines, Scenario(()), sentinel=sentinel, settings=settings)
        expected = reference_of(baseline, engines.target.label, engines.log_tail(),
                                sees_server_mlx=engines.sees_server_mlx)
        settings, _ = driver_settings(DriverSettings(strict=strict), measure(baseline, startup_s), remote)
        last: Optional[Trace] = None
        for _ in range(times):
            last = run_scenario(engines, scenario, sentinel=sentinel, expected_followup=expected, settings=settings)
            violations = judge(last)
            result.runs.append(violations)
            if violations and result.failure is None:
                result.failure = Failure(scenario, last, violations, engines.target, seed="replay",
                                         server_log=engines.log_tail())
    finally:
        if sentinel is not None:
            sentinel.uninstall()
        if engines is not chosen:
            engines.close()  # built here: a server it started stops here
    if result.failure is not None:
        result.failure.reproduced = (result.reproduced, times)
        result.failure.device = device_info()
    return result
