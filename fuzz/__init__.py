"""The dynamic half of mlx-invariants: an MLX access sentinel and a cancellation fuzzer.

Importing `fuzz` loads nothing heavy (the CLI and the pytest plugin import it
in every process); each public name is imported on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Sentinel": "fuzz.sentinel", "SentinelError": "fuzz.sentinel", "DEFAULT_TARGETS": "fuzz.sentinel",
    "Trace": "fuzz.trace", "Event": "fuzz.trace",
    "ORACLES": "fuzz.oracles", "Violation": "fuzz.oracles", "judge": "fuzz.oracles",
    "Scenario": "fuzz.scenario", "RequestSpec": "fuzz.scenario", "FaultSpec": "fuzz.scenario", "At": "fuzz.scenario",
    "scenarios": "fuzz.strategies",
    "run_scenario": "fuzz.driver", "DriverSettings": "fuzz.driver", "EngineSession": "fuzz.session",
    "run_fuzz": "fuzz.runner", "run_exhaustive": "fuzz.runner", "FuzzResult": "fuzz.runner",
    "replay": "fuzz.replay", "Failure": "fuzz.report", "write_report": "fuzz.report",
    "reference_engine": "fuzz.adapters.reference", "resolve_engine": "fuzz.engines",
    "OwnedLock": "fuzz.locks", "watch_locks": "fuzz.locks",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fuzz' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
