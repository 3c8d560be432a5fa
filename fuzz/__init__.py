"""The dynamic half of mlx-invariants: an MLX access sentinel and a cancellation fuzzer.

Importing `fuzz` loads nothing heavy (the CLI and the pytest plugin import it
in every process); each public name is imported on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Sentinel": "mlx_invariants.fuzz.sentinel", "DEFAULT_TARGETS": "mlx_invariants.fuzz.sentinel",
    "SentinelError": "mlx_invariants.fuzz.errors", "Refused": "mlx_invariants.fuzz.errors",
    "Trace": "mlx_invariants.fuzz.trace", "Event": "mlx_invariants.fuzz.trace",
    "ORACLES": "mlx_invariants.fuzz.oracles", "Violation": "mlx_invariants.fuzz.oracles", "judge": "mlx_invariants.fuzz.oracles",
    "Scenario": "mlx_invariants.fuzz.scenario", "RequestSpec": "mlx_invariants.fuzz.scenario", "FaultSpec": "mlx_invariants.fuzz.scenario", "At": "mlx_invariants.fuzz.scenario",
    "scenarios": "mlx_invariants.fuzz.strategies",
    "Target": "mlx_invariants.fuzz.target", "Engines": "mlx_invariants.fuzz.target",
    "FuzzSettings": "mlx_invariants.fuzz.settings",
    "DriverSettings": "mlx_invariants.fuzz.driver",
    "run_scenario": "mlx_invariants.fuzz.session", "EngineSession": "mlx_invariants.fuzz.session",
    "run_fuzz": "mlx_invariants.fuzz.runner", "run_exhaustive": "mlx_invariants.fuzz.runner", "FuzzResult": "mlx_invariants.fuzz.runner",
    "RunSummary": "mlx_invariants.fuzz.summary", "FindingSummary": "mlx_invariants.fuzz.summary",
    "fuzz_engine": "mlx_invariants.fuzz.api", "FuzzFailure": "mlx_invariants.fuzz.api",
    "replay": "mlx_invariants.fuzz.replay", "Failure": "mlx_invariants.fuzz.report", "write_report": "mlx_invariants.fuzz.report",
    "reference_engine": "mlx_invariants.fuzz.adapters.reference",
    "OwnedLock": "mlx_invariants.fuzz.locks", "watch_locks": "mlx_invariants.fuzz.locks",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fuzz' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
