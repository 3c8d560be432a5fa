"""`fuzz_engine`: fuzz your own engine from your own test file, and fail with what a maintainer acts on.

A test calls `fuzz_engine(make)` (or the `mlx_fuzz` fixture, which adds the
report folder and a traceback-free failure): the run is `run_fuzz`'s, and a
new finding raises `FuzzFailure`, an AssertionError whose message gives,
for each, the headline, the shrunk scenario, the report path and a replay
command that works when pasted into a shell (`fuzz.reproduce`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Union

from mlx_invariants.fuzz.baseline import load_baseline
from mlx_invariants.fuzz.defaults import REPORT_DIR
from mlx_invariants.fuzz.errors import TargetError
from mlx_invariants.fuzz.evidence import summarize
from mlx_invariants.fuzz.runner import FuzzResult, run_fuzz
from mlx_invariants.fuzz.settings import FuzzSettings
from mlx_invariants.fuzz.summary import render_finding
from mlx_invariants.fuzz.target import Target

# What names an engine here: a Target, "MODULE:FACTORY" or a reference route, a server command with
# {port}, a loopback URL, or the factory function itself.
EngineSpec = Union[Target, str, Callable[[], Any]]


class FuzzFailure(AssertionError):
    """The fuzzer found something new; `result` holds the findings, their reports and the run folder."""

    def __init__(self, result: FuzzResult, target: Target):
        self.result, self.target = result, target
        super().__init__(failure_message(result, target))


def as_target(engine: EngineSpec) -> Target:
    """The `Target` an engine spec names. A factory function is named `module:function`, so the report, the
    scenario file and the replay command all say which one it is."""
    if isinstance(engine, Target):
        return engine
    if isinstance(engine, str):
        if "{port}" in engine:
            return Target.server(engine)
        if engine.startswith(("http://", "https://")):
            return Target.url(engine)
        return Target.engine(engine)
    if callable(engine):
        return Target.module_factory(_factory_spec(engine))
    raise TargetError(f"cannot fuzz {engine!r}: pass a factory function, 'module:function', a route, "
                      "a server command with {port}, a loopback URL or a Target")


def fuzz_engine(engine: EngineSpec, settings: FuzzSettings | None = None, **overrides: Any) -> FuzzResult:
    """Fuzz `engine` and return the result; raise `FuzzFailure` if it found anything new.

    `settings` (default: the `ci` profile) with `overrides` applied, e.g. `examples=30`, `budget_s=20`,
    `keep_going=True`, or `baseline="fuzz-baseline.json"` (a file `--write-baseline` wrote: its
    findings pass). The run folder goes under `report_dir` (default: ./fuzz-reports), made absolute so
    the message's paths work from anywhere."""
    values = {**(settings or FuzzSettings()).to_dict(), **overrides}
    if isinstance(values.get("baseline"), (str, Path)):  # a baseline file, as --baseline reads it
        values["baseline"] = sorted(load_baseline(values["baseline"]))
    report = Path(values.get("report_dir") or REPORT_DIR).resolve()
    values["report_dir"] = str(report)
    values["workdir"] = str(Path(values.get("workdir") or report / "work").resolve())
    target = as_target(engine)
    result = run_fuzz(target, FuzzSettings.from_dict(values))
    if not result.ok:
        raise FuzzFailure(result, target)
    return result


def failure_message(result: FuzzResult, target: Target) -> str:
    """What to read first comes first: per new finding its headline, the shrunk scenario, how it was judged,
    the report and the replay line (`render_finding`, as the CLI prints it); then the run folder, whose
    summary.md also lists accepted and unconfirmed ones."""
    summary = result.summary or summarize(result)
    new = summary.new_findings
    lines = [f"fuzzing {target.label}: {len(new)} new finding(s) in {summary.examples} example(s), "
             f"{summary.elapsed_s:.1f}s"]
    lines += [render_finding(finding, f"[{number}]") for number, finding in enumerate(new, 1)]
    if summary.run_dir is not None:
        others = len(summary.findings) - len(new)
        listed = f"; {others} accepted or unconfirmed finding(s) listed there" if others else ""
        lines.append(f"run folder: {summary.run_dir} (summary.md, junit.xml{listed})")
    return "\n".join(lines)


def _factory_spec(factory: Callable[[], Any]) -> str:
    """`module:function` for a factory a fresh process can import by that name, else a TargetError."""
    module, name = getattr(factory, "__module__", None), getattr(factory, "__qualname__", "")
    loaded = sys.modules.get(module or "")
    if module in (None, "__main__") or "<" in name or "." in name or getattr(loaded, name, None) is not factory:
        raise TargetError(f"{factory!r} must be a module-level function of an importable module (a replay "
                          "imports it by name in a new process); or pass 'module:function'")
    return f"{module}:{name}"
