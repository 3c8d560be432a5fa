"""Re-run a saved scenario without Hypothesis: `invariants fuzz --replay FILE`.

FILE is a `scenario.json`, a `report.json`, a report folder, or the
`current.json` a crashed run left behind. The engine comes from `--engine`,
else from the report next to the scenario.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from mlx_invariants.fuzz.driver import DriverSettings, run_scenario
from mlx_invariants.fuzz.engines import AdapterFactory, engine_label, resolve_engine
from mlx_invariants.fuzz.oracles import Violation, judge
from mlx_invariants.fuzz.report import Failure, device_info
from mlx_invariants.fuzz.scenario import Scenario
from mlx_invariants.fuzz.sentinel import Sentinel
from mlx_invariants.fuzz.trace import Trace


class ReplayError(ValueError):
    """The file to replay cannot be read as a scenario."""


@dataclass
class ReplayResult:
    scenario: Scenario
    runs: list[list[Violation]] = field(default_factory=list)
    failure: Optional[Failure] = None

    @property
    def reproduced(self) -> int:
        return sum(bool(run) for run in self.runs)


def load_scenario(path: str | Path) -> tuple[Scenario, Optional[str]]:
    """The scenario in `path` and the engine options recorded next to it ("--engine simple"), if any."""
    path = Path(path)
    if path.is_dir():
        path = path / "scenario.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ReplayError(f"cannot read {path}: {exc}") from None
    engine = data.get("engine_args") if isinstance(data, dict) else None
    sibling = path.with_name("report.json")
    if engine is None and sibling.is_file() and sibling != path:
        engine = json.loads(sibling.read_text()).get("engine_args")
    try:
        return Scenario.from_json(data), engine
    except (KeyError, TypeError, ValueError) as exc:
        raise ReplayError(f"{path} is not a fuzz scenario: {exc}") from None


def replay(path: str | Path, engine: str | AdapterFactory | None = None, *, times: int = 1,
           settings: DriverSettings = DriverSettings()) -> ReplayResult:
    scenario, recorded = load_scenario(path)
    chosen = engine
    if chosen is None and recorded and recorded.startswith("--engine "):
        chosen = recorded.split(" ", 1)[1]
    if chosen is None:
        raise ReplayError(f"{path} does not say which engine it ran on; pass --engine, --url or --server-cmd")
    factory = resolve_engine(chosen) if isinstance(chosen, str) else chosen
    result = ReplayResult(scenario)
    sentinel = Sentinel(strict=settings.strict).install()
    try:
        baseline = run_scenario(factory, Scenario(()), sentinel=sentinel, settings=settings)
        expected: Any = baseline.meta.get("followup")
        last: Optional[Trace] = None
        for _ in range(times):
            last = run_scenario(factory, scenario, sentinel=sentinel, expected_followup=expected,
                                settings=settings)
            violations = judge(last)
            result.runs.append(violations)
            if violations and result.failure is None:
                result.failure = Failure(scenario, last, violations, engine_label(factory),
                                         f"--engine {chosen}" if isinstance(chosen, str)
                                         else getattr(chosen, "engine_args", None), seed="replay")
    finally:
        sentinel.uninstall()
    if result.failure is not None:
        result.failure.reproduced = (result.reproduced, times)
        result.failure.device = device_info()
    return result
