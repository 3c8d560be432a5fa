"""`run_fuzz`: generate scenarios with Hypothesis, run them on an engine, shrink what fails.

The programmatic entry point (the CLI, the fuzz-kill tests, the benchmark
and `invariants mutants` all call it): what to fuzz is a `fuzz.target.Target`,
how is a `fuzz.settings.FuzzSettings`. Each scenario is written, with its
target, to `workdir/current.json` before it runs, so a process that dies
inside MLX still leaves the case that killed it, ready to replay.

Scenarios share one started engine while they leave it clean (see
`fuzz.session`); a violation seen on a reused engine counts only once it
repeats on a fresh one, and shrinking, replays and the debug run use a fresh
engine for every scenario, as `reuse=False` (`--fresh-engine`) does throughout.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from mlx_invariants.fuzz.case import dumps_case
from mlx_invariants.fuzz.corpus import SEED_SCENARIOS
from mlx_invariants.fuzz.driver import DriverSettings
from mlx_invariants.fuzz.errors import ViolationFound
from mlx_invariants.fuzz.oracles import Violation, judge
from mlx_invariants.fuzz.profiles import PROFILES, Profile, hypothesis_settings
from mlx_invariants.fuzz.report import Failure, device_info, write_report
from mlx_invariants.fuzz.scenario import (FAULT_KINDS, INDEXED_POINTS, POINTS, RAISE_POINTS, At, FaultSpec,
                                           RequestSpec, Scenario)
from mlx_invariants.fuzz.sentinel import Sentinel
from mlx_invariants.fuzz.session import EngineSession
from mlx_invariants.fuzz.settings import FuzzSettings
from mlx_invariants.fuzz.target import Engines, Target
from mlx_invariants.fuzz.trace import Trace

# The asyncio debug-mode run: two requests, one cancelled mid-decode.
DEBUG_SCENARIO = Scenario((RequestSpec("r0", 4, 6, True), RequestSpec("r1", 3, 4, False)),
                          (FaultSpec("cancel", At("r0", "BEFORE_DECODE", 1)),), debug=True)
# Violations a cold baseline may show (first imports hold the GIL on the owner thread).
_BASELINE_EXEMPT = {"loop-lag"}
# A failure counts (and shrinks) only if it repeats this many times on a fresh engine.
CONFIRM_RUNS = 1


class Phase(Enum):
    """What the run is doing with the scenario it reports."""

    GENERATE = "generate"        # sampling new scenarios
    SHRINK = "shrink"            # making a failure smaller
    EXHAUSTIVE = "exhaustive"    # enumerating single-fault scenarios


@dataclass
class Progress:
    examples: int = 0
    elapsed_s: float = 0.0
    budget_s: float = 0.0
    failed: bool = False
    phase: Phase = Phase.GENERATE
    scenario: str = ""


@dataclass
class FuzzResult:
    engine: str
    examples: int
    elapsed_s: float
    failure: Optional[Failure] = None
    report_dir: Optional[Path] = None
    first_failure_s: Optional[float] = None          # time to the first violating example
    first_failure_examples: Optional[int] = None     # examples run up to and including it
    engines_started: int = 0                         # fresh engines, replays included
    mlx_s: float = 0.0                               # time spent inside MLX, summed over every scenario run

    @property
    def ok(self) -> bool:
        return self.failure is None


_KIND_TYPES: dict[str, type] = {}


def _violation_type(kind: str) -> type:
    if kind not in _KIND_TYPES:
        _KIND_TYPES[kind] = type(f"Violation_{kind.replace('-', '_')}", (ViolationFound,), {})
    return _KIND_TYPES[kind]


def run_fuzz(target: Target | Engines, settings: FuzzSettings = FuzzSettings(), *, strategy: Any = None,
             progress: Optional[Callable[[Progress], None]] = None) -> FuzzResult:
    """Fuzz one target until a violation, `examples` examples, or `budget_s` seconds, whichever comes first.

    `target` may also be the `Engines` built from one, to share what it started
    (a server) with other runs; otherwise it is built here and closed at the
    end. `strategy` replaces `fuzz.strategies.scenarios()` aimed at the
    target's fault kinds and points; `progress` is called before each scenario.
    """
    engines = target if isinstance(target, Engines) else target.build()
    profile = PROFILES[settings.profile]
    budget_s = profile.budget_s if settings.budget_s is None else settings.budget_s
    examples = profile.examples if settings.examples is None else settings.examples
    explicit = list(SEED_SCENARIOS.values()) if settings.explicit is None else list(settings.explicit)
    debug_run = profile.debug_run if settings.debug_run is None else settings.debug_run
    sentinel = Sentinel(strict=settings.strict).install()
    fuzz = _Fuzz(engines, settings, profile, budget_s, examples, progress, sentinel)

    def search() -> Optional[Failure]:
        failure = fuzz.baseline()
        if failure is None:
            failure = fuzz.hypothesis(strategy, settings.seed, explicit)
        if failure is None:
            failure = fuzz.teardown()
        if failure is None and debug_run:
            failure = fuzz.debug_run()
        return failure

    try:
        return _conclude(fuzz, sentinel, search, settings)
    finally:
        if engines is not target:
            engines.close()


def _conclude(fuzz: "_Fuzz", sentinel: Sentinel, search: Callable[[], Optional[Failure]],
              settings: FuzzSettings) -> FuzzResult:
    """Run `search`, replay what it found on fresh engines, and always release the engine and the sentinel.

    The report is written last, after the sentinel is gone, so a report that
    fails to write never leaves MLX wrapped.
    """
    try:
        failure = search()
        if failure is not None:
            fuzz.session.close()
            failure.reproduced = fuzz.replay_count(failure, settings.replays)
    finally:
        try:
            fuzz.session.close()
        finally:
            sentinel.uninstall()
    result = FuzzResult(fuzz.target.label, fuzz.state.examples, time.monotonic() - fuzz.started, failure,
                        first_failure_s=fuzz.first_failure_s, first_failure_examples=fuzz.first_failure_examples,
                        engines_started=fuzz.session.starts, mlx_s=fuzz.mlx_s)
    if failure is not None:
        failure.device = device_info()
        if settings.report_dir is not None:
            result.report_dir = write_report(settings.report_dir, failure)
    return result


class _Fuzz:
    """One run's state: the kept engine's session, the clock, and what failed so far."""

    def __init__(self, engines: Engines, settings: FuzzSettings, profile: Profile, budget_s: float, examples: int,
                 progress: Optional[Callable[[Progress], None]], sentinel: Sentinel):
        self.target, self.profile = engines.target, profile
        self.budget_s, self.examples = budget_s, examples
        self.progress = progress
        self.workdir = Path(settings.workdir) if settings.workdir else None
        reuse = profile.reuse_engine if settings.reuse is None else settings.reuse
        self.session = EngineSession(engines, sentinel, DriverSettings(strict=settings.strict), reuse)
        self.mlx_s = 0.0
        # The fresh-engine output of the follow-up request: computed once per run, by the baseline.
        self.expected_followup: Optional[list[Any]] = None
        self.started = time.monotonic()
        self.state = Progress(budget_s=budget_s)
        self.first_failure_s: Optional[float] = None
        self.first_failure_examples: Optional[int] = None
        self.seed_label: Optional[str] = None
        self.shrink_s, self.shrink = settings.shrink_s, settings.shrink
        self.unconfirmed: list[Failure] = []
        self._failing: set[str] = set()
        self._shrink_deadline = 0.0

    def run(self, scenario: Scenario, fresh: bool = False) -> tuple[Trace, list[Violation]]:
        """Run one scenario (on the kept engine unless `fresh`); save it first so a crash leaves it behind.
        While a failure is being shrunk every scenario gets a fresh engine, so shrinking stays exact."""
        if self.workdir is not None:
            self.workdir.mkdir(parents=True, exist_ok=True)
            (self.workdir / "current.json").write_text(dumps_case(scenario, self.target))
        if (fresh or self._failing) and self.session.engine is not None:
            dropped = self.teardown()  # rare: a violation has normally retired the engine already
            if dropped is not None and not self.unconfirmed:
                self.unconfirmed.append(dropped)
        trace = self.session.run(scenario, self.expected_followup,
                                 keep=False if fresh or self._failing else None)
        self.mlx_s += sum(span.duration for span in trace.of("mlx"))
        return trace, judge(trace)

    def failure(self, scenario: Scenario, trace: Trace, violations: list[Violation]) -> Failure:
        return Failure(scenario, trace, violations, self.target, seed=self.seed_label)

    def baseline(self) -> Optional[Failure]:
        """A request-free scenario on a fresh engine: warms imports, and its follow-up output is the
        fresh-engine reference for the whole run (the engine goes on to the next scenario)."""
        scenario = Scenario(())
        trace, violations = self.run(scenario)
        self.expected_followup = trace.meta.get("followup")
        violations = [v for v in violations if v.kind not in _BASELINE_EXEMPT]
        return self.failure(scenario, trace, violations) if violations else None

    def debug_run(self) -> Optional[Failure]:
        """The asyncio debug-mode scenario, on a fresh engine started on a debug-mode loop."""
        trace, violations = self.run(DEBUG_SCENARIO, fresh=True)
        return self.failure(DEBUG_SCENARIO, trace, violations) if violations else None

    def teardown(self) -> Optional[Failure]:
        """Shut the kept engine down with the after-shutdown checks; a violation there is reported
        against the scenario it ran last (not shrunk: shutting down is not part of that scenario)."""
        last = self.session.last
        trace = self.session.close()
        violations = judge(trace) if trace is not None else []
        if not violations or last is None:
            return None
        failure = self.failure(last, trace, violations)
        failure.blob = "found when the reused engine was shut down after this scenario; not shrunk"
        return failure

    def replay_count(self, failure: Failure, times: int) -> tuple[int, int]:
        kind = failure.violations[0].kind
        hits = sum(any(v.kind == kind for v in self.run(failure.scenario, fresh=True)[1]) for _ in range(times))
        return hits, times

    def _tick(self, scenario: Scenario, phase: Phase) -> None:
        self.state.elapsed_s = time.monotonic() - self.started
        self.state.phase = phase
        self.state.scenario = scenario.describe()
        if self.progress is not None:
            self.progress(self.state)

    def hypothesis(self, strategy: Any, seed: Optional[int], explicit: list[Scenario]) -> Optional[Failure]:
        from hypothesis import example, given
        from hypothesis import seed as fixed_seed
        from hypothesis.errors import Flaky

        from mlx_invariants.fuzz.strategies import scenarios

        if strategy is None:
            strategy = scenarios(kinds=self.target.fault_kinds, points=self.target.points)
        derandomize = self.profile.derandomize and seed is None
        base_seed = seed if seed is not None else (None if derandomize else random.getrandbits(32))
        self.seed_label = "derandomized (ci profile)" if derandomize else str(base_seed)

        def property_(scenario: Scenario) -> None:
            self._example(scenario)

        round_number = 0
        while True:
            remaining = self.examples - self.state.examples
            if remaining <= 0 or time.monotonic() - self.started > self.budget_s:
                break
            count = remaining if derandomize else min(remaining, self.profile.round_examples)
            test = given(strategy)(property_)
            if round_number == 0:
                for scenario in reversed(explicit):
                    test = example(scenario)(test)
            if base_seed is not None:
                test = fixed_seed(base_seed + round_number)(test)
            test = hypothesis_settings(self.profile, count, derandomize=derandomize, shrink=self.shrink)(test)
            try:
                test()
            except ViolationFound as found:
                return self._found(found)
            except Flaky as flaky:
                inner = [e for e in getattr(flaky, "exceptions", ()) if isinstance(e, ViolationFound)]
                if not inner:
                    raise
                return self._found(inner[0], note="Hypothesis reported the failure as flaky")
            if derandomize:
                break
            round_number += 1
        return self._unconfirmed()

    def _example(self, scenario: Scenario) -> None:
        """One Hypothesis example: run it; raise (per violation kind) only if the failure repeats."""
        key = scenario.dumps()
        if self._failing:
            if time.monotonic() > self._shrink_deadline and key not in self._failing:
                return  # shrinking ran out of time: only the known failures still run
        elif time.monotonic() - self.started > self.budget_s:
            return
        self._tick(scenario, Phase.SHRINK if self._failing else Phase.GENERATE)
        trace, violations = self.run(scenario)
        if not self._failing:
            self.state.examples += 1
        if not violations:
            return
        found = self._confirmed(scenario, trace, violations)
        if found is None:
            return
        trace, violations = found
        kind = violations[0].kind
        if not self._failing:
            self.first_failure_s = time.monotonic() - self.started
            self.first_failure_examples = self.state.examples
            self._shrink_deadline = time.monotonic() + self.shrink_s
            self.state.failed = True
        self._failing.add(key)
        raise _violation_type(kind)(scenario, trace, violations)

    def _confirmed(self, scenario: Scenario, trace: Trace,
                   violations: list[Violation]) -> Optional[tuple[Trace, list[Violation]]]:
        """The failure as seen on a fresh engine, if it repeats there (`CONFIRM_RUNS` times); else None.

        The violation retired the engine, so the re-runs start fresh. A race that did not repeat is kept
        in case nothing steadier turns up, but neither generation nor shrinking builds on it."""
        kind = violations[0].kind
        reruns = []
        for _ in range(CONFIRM_RUNS):
            rerun = self.run(scenario, fresh=True)
            if not any(v.kind == kind for v in rerun[1]):
                if not self.unconfirmed:
                    failure = self.failure(scenario, trace, violations)
                    served = trace.meta.get("reused", 0)
                    if served:
                        failure.blob = (f"seen on an engine reused after {served} scenario(s); "
                                        "it did not repeat on a fresh engine")
                    self.unconfirmed.append(failure)
                return None
            reruns.append(rerun)
        if trace.meta.get("reused", 0) and reruns:
            return reruns[0]  # report the fresh-engine run: it is what replays reproduce
        return trace, violations

    def _unconfirmed(self) -> Optional[Failure]:
        """A failure seen once and not on the immediate re-run: reported only if nothing steadier was found."""
        if not self.unconfirmed:
            return None
        failure = self.unconfirmed[0]
        note = "not shrunk: the failure did not repeat on an immediate re-run"
        failure.blob = f"{note} ({failure.blob})" if failure.blob else note
        if self.first_failure_s is None:
            self.state.failed = True
        return failure

    def enumerate(self, todo: list[Scenario]) -> Optional[Failure]:
        """Run `todo` in order after the baseline; the first failure that repeats on a fresh engine."""
        failure = self.baseline()
        for scenario in todo if failure is None else ():
            self._tick(scenario, Phase.EXHAUSTIVE)
            trace, violations = self.run(scenario)
            self.state.examples += 1
            found = self._confirmed(scenario, trace, violations) if violations else None
            if found is not None:
                self.first_failure_s = time.monotonic() - self.started
                self.first_failure_examples = self.state.examples
                return self.failure(scenario, *found)
        return failure or self.teardown() or self._unconfirmed()

    def _found(self, found: ViolationFound, note: str = "") -> Failure:
        failure = self.failure(found.scenario, found.trace, found.violations)
        notes = getattr(found, "__notes__", [])
        failure.blob = next((n.strip() for n in notes if "@reproduce_failure" in n), None)
        if note:
            failure.blob = f"{failure.blob or ''} ({note})".strip()
        return failure


def exhaustive_scenarios(max_tokens: int = 3, kinds: Iterable[str] = FAULT_KINDS,
                         points: Iterable[str] = POINTS) -> list[Scenario]:
    """Every single-fault scenario for one and for two requests, at every point (and index)."""
    out: list[Scenario] = []
    for count in (1, 2):
        requests = tuple(RequestSpec(f"r{i}", 4, max_tokens, True) for i in range(count))
        for kind in kinds:
            for request in requests:
                for point in points:
                    if kind == "raise" and point not in RAISE_POINTS:
                        continue
                    for index in range(max_tokens if point in INDEXED_POINTS else 1):
                        out.append(Scenario(requests, (FaultSpec(kind, At(request.rid, point, index)),)))
    return out


def run_exhaustive(target: Target | Engines, settings: FuzzSettings = FuzzSettings(), *, max_tokens: int = 3,
                   progress: Optional[Callable[[Progress], None]] = None) -> FuzzResult:
    """Run `exhaustive_scenarios()` in order; stop at the first violation that repeats on a fresh engine.
    Of `settings`, the budget, examples, seed and shrinking do not apply."""
    engines = target if isinstance(target, Engines) else target.build()
    sentinel = Sentinel(strict=settings.strict).install()
    fuzz = _Fuzz(engines, settings, PROFILES[settings.profile], float("inf"), 0, progress, sentinel)
    fuzz.seed_label = "exhaustive"
    todo = exhaustive_scenarios(max_tokens, engines.target.fault_kinds, engines.target.points)
    try:
        return _conclude(fuzz, sentinel, lambda: fuzz.enumerate(todo), settings)
    finally:
        if engines is not target:
            engines.close()
