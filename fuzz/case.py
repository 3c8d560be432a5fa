"""A case file: one scenario and the target it ran on, so `invariants fuzz --replay FILE` needs no flag.

A report's `scenario.json` and the `current.json` a run writes before each
scenario are the scenario's own JSON (hand-editable, see docs/fuzz.md) with
a "target" key beside it; `report.json` names both too. A file without a
target (written by hand) still loads: the replay then needs one named.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from mlx_invariants.fuzz.errors import ReplayError
from mlx_invariants.fuzz.scenario import Scenario
from mlx_invariants.fuzz.target import Target


def dumps_case(scenario: Scenario, target: Target) -> str:
    return json.dumps({**scenario.to_json(), "target": target.to_dict()}, indent=2)


def load_case(path: str | Path) -> tuple[Scenario, Optional[Target]]:
    """The scenario in `path` (a case file, a report.json, or a report folder) and its target, if named."""
    path = Path(path)
    if path.is_dir():
        path = path / "scenario.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ReplayError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ReplayError(f"{path} is not a fuzz scenario: a JSON object was expected")
    try:
        scenario = Scenario.from_json(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise ReplayError(f"{path} is not a fuzz scenario: {exc}") from None
    target = data.get("target")
    return scenario, None if target is None else Target.from_dict(target)
