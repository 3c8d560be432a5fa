"""Run the baseline, then every selected mutant through the layers, cheapest first.

Order per mutant: static (about a second), the engine tests it names (seconds),
then the fuzzer on its routes (up to the ci profile's budget). By default a
mutant stops at its first kill; `all_layers` runs every layer to show each
check that catches it; `must_kill` runs exactly the layers the mutant's entry
says must kill it, every one of them, and a layer among those that does not
kill fails the run even when another did. A fuzz kill only counts once the
fuzzer is clean on the unmutated engine for that route, so its baseline runs
the first time a mutant needs it.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from mlx_invariants.mutants import layers
from mlx_invariants.mutants.layers import Outcome, Settings
from mlx_invariants.mutants.mutant import LAYERS, Mutant
from mlx_invariants.mutants.workspace import Workspace


@dataclass
class Result:
    """What happened to one mutant (or, with `mutant=None`, to the unmutated baseline)."""

    mutant: Optional[Mutant]
    outcomes: list[Outcome] = field(default_factory=list)
    seconds: float = 0.0
    ran: bool = True
    required: tuple[str, ...] = ()  # the layers that must each kill it (must-kill runs only)

    @property
    def kills(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.killed]

    @property
    def killed(self) -> bool:
        return bool(self.kills)

    @property
    def time_to_kill(self) -> Optional[float]:
        """Seconds from the copy being made to the first kill, every earlier layer included."""
        elapsed = 0.0
        for outcome in self.outcomes:
            elapsed += outcome.seconds
            if outcome.killed:
                return elapsed
        return None

    @property
    def missed(self) -> list[str]:
        """The required layers that did not kill it (not run, for lack of budget, counts as missed)."""
        return [layer for layer in self.required if not any(o.layer == layer and o.killed for o in self.outcomes)]

    @property
    def problems(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.verdict in ("error", "timeout")]


@dataclass
class Report:
    baseline: Result
    results: list[Result]
    skipped_layers: dict[str, str]
    not_required: list[Mutant] = field(default_factory=list)  # must-kill runs: no layer run here is required

    @property
    def baseline_clean(self) -> bool:
        return not self.baseline.kills and not self.baseline.problems

    @property
    def survivors(self) -> list[Result]:
        return [r for r in self.results if not r.killed]

    @property
    def missing(self) -> list[Result]:
        """Killed, but not by every layer that must kill it."""
        return [r for r in self.results if r.killed and r.missed]

    @property
    def ok(self) -> bool:
        return self.baseline_clean and not self.survivors and not self.missing


class Runner:
    def __init__(self, repo: Path, settings: Settings = Settings(), jobs: int = 2, budget_s: float = 0.0,
                 all_layers: bool = False, layer_names: Sequence[str] = LAYERS, must_kill: bool = False,
                 progress: Callable[[str], None] = lambda line: None):
        self.repo = repo
        self.settings = settings
        self.jobs = max(1, jobs)
        self.deadline = time.monotonic() + budget_s if budget_s > 0 else None
        self.all_layers = all_layers
        self.must_kill = must_kill
        self.progress = progress
        self.skipped = {name: why for name in layer_names if (why := layers.available(name))}
        self.layers = [name for name in LAYERS if name in layer_names and name not in self.skipped]
        self._fuzz_baseline: dict[str, Outcome] = {}
        self._fuzz_lock = threading.Lock()

    def run(self, mutants: Sequence[Mutant]) -> Report:
        """Baseline first; mutants only if it is clean (a kill on a broken baseline proves nothing)."""
        for mutant in mutants:  # fail before any check runs if an anchor is gone
            with Workspace(self.repo, mutant):
                pass
        not_required = [m for m in mutants if not self._wanted(m)]
        mutants = [m for m in mutants if self._wanted(m)]
        baseline = self._baseline(mutants)
        report = Report(baseline, [], self.skipped, not_required)
        if not report.baseline_clean:
            report.results = [Result(m, ran=False) for m in mutants]
            return report
        with ThreadPoolExecutor(self.jobs, thread_name_prefix="mutant") as pool:
            report.results = list(pool.map(self._mutant, mutants))
        report.baseline.outcomes.extend(self._fuzz_baseline.values())
        return report

    # -- the unmutated engine ------------------------------------------------------
    def _baseline(self, mutants: Sequence[Mutant]) -> Result:
        result = Result(None)
        started = time.monotonic()
        selection = self._selection(mutants)
        with Workspace(self.repo) as ws:
            if "static" in self.layers:
                result.outcomes.append(layers.static(ws, self.settings, self._timeout()))
            if "tests" in self.layers and selection:
                result.outcomes.append(layers.engine_tests(ws, self.settings, self._timeout(), selection))
        result.seconds = time.monotonic() - started
        for outcome in result.outcomes:
            state = "clean" if outcome.verdict == "survived" else f"{outcome.verdict} {outcome.by}".strip()
            self.progress(f"baseline {outcome.layer}: {state} ({outcome.seconds:.1f}s)")
        return result

    def _fuzz_clean(self, route: str) -> Outcome:
        """The fuzzer on the unmutated route, once per run, shared by every mutant that needs it."""
        with self._fuzz_lock:
            if route not in self._fuzz_baseline:
                with Workspace(self.repo) as ws:
                    outcome = layers.fuzz(ws, self.settings, self._timeout(), route)
                self._fuzz_baseline[route] = outcome
                self.progress(f"baseline fuzz {route}: {'clean' if outcome.verdict == 'survived' else outcome.verdict}"
                              f" ({outcome.seconds:.1f}s)")
            return self._fuzz_baseline[route]

    def _selection(self, mutants: Sequence[Mutant]) -> list[str]:
        if self.settings.full_tests:
            return ["tests/engine"]
        return list(dict.fromkeys(test for m in mutants if "tests" in self._wanted(m) for test in m.tests))

    def _wanted(self, mutant: Mutant) -> list[str]:
        """The layers run on `mutant`: all those chosen, or in a must-kill run the chosen ones it names."""
        return [name for name in self.layers if not self.must_kill or name in mutant.must_kill]

    # -- one mutant ------------------------------------------------------------------
    def _mutant(self, mutant: Mutant) -> Result:
        if self._out_of_time():
            self.progress(f"{mutant.id}: not run (budget spent)")
            return Result(mutant, ran=False)
        result = Result(mutant, required=tuple(self._wanted(mutant)) if self.must_kill else ())
        started = time.monotonic()
        with Workspace(self.repo, mutant) as ws:
            for outcome in self._layers(mutant, ws):
                result.outcomes.append(outcome)
                if outcome.killed and not (self.all_layers or self.must_kill):
                    break
        result.seconds = time.monotonic() - started
        verdict = ", ".join(f"{o.layer} {o.by}" for o in result.kills) or "SURVIVED"
        missed = f"; not killed by {', '.join(result.missed)}" if result.killed and result.missed else ""
        self.progress(f"{mutant.id}: {verdict}{missed} ({result.seconds:.1f}s)")
        return result

    def _layers(self, mutant: Mutant, ws: Workspace):
        """Each applicable layer's outcome, lazily, so a kill stops the rest."""
        wanted = self._wanted(mutant)
        if "static" in wanted:
            yield layers.static(ws, self.settings, self._timeout())
        selection = ["tests/engine"] if self.settings.full_tests else list(mutant.tests)
        if "tests" in wanted and selection and not self._out_of_time():
            yield layers.engine_tests(ws, self.settings, self._timeout(), selection)
        if "fuzz" in wanted:
            for route in mutant.routes:
                if self._out_of_time():
                    return
                clean = self._fuzz_clean(route)
                if clean.verdict != "survived":
                    yield Outcome("fuzz", "error", f"{route}: baseline not clean ({clean.verdict} {clean.by})")
                    continue
                outcome = layers.fuzz(ws, self.settings, self._timeout(), route)
                yield outcome
                if outcome.killed:
                    return

    # -- budget ------------------------------------------------------------------------
    def _timeout(self) -> float:
        if self.deadline is None:
            return self.settings.layer_timeout_s
        return max(1.0, min(self.settings.layer_timeout_s, self.deadline - time.monotonic()))

    def _out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline
