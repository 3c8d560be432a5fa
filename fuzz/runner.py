"""`run_fuzz`: generate scenarios with Hypothesis, run them on an engine, confirm and shrink what fails.

The programmatic entry point (the CLI, the fuzz-kill tests, the benchmark
and `invariants mutants` all call it): what to fuzz is a `fuzz.target.Target`,
how is a `fuzz.settings.FuzzSettings`. Each scenario is written, with its
target, to `workdir/current.json` before it runs, so a process that dies
inside MLX still leaves the case that killed it, ready to replay.

A violation becomes a finding (`fuzz.findings`) with a signature. A new
signature is first re-run on fresh engines: it counts only if it repeats
there often enough (`confirm` of `replays`) or its oracle is exact; one that
does not is listed as unconfirmed and the search goes on. A confirmed one is
shrunk (Hypothesis, on fresh engines), replayed ("reproduced k/N"), and then
the run stops, or with `keep_going` searches on, skipping signatures it has,
until the budget ends. The budget is wall time: the profile's example cap
applies only when neither a budget nor a count was given. Generated
scenarios draw past the target's capacity: `settings.capacity`, else what
its adapter reported during the baseline (`fuzz.profiles.requests_for`).

With an example database (`settings.database`, or the profile's; a directory
or a Redis server shared by a fleet, `fuzz.database`), the failures it holds
for the target are replayed before the seed corpus and the search, and what
the search finds is written to it (unless it is read-only).

Scenarios share one started engine while they leave it clean (see
`fuzz.session`); confirmation, shrinking, replays and the debug run use a
fresh engine for every scenario, as `reuse=False` (`--fresh-engine`) does
throughout. Setup is not a finding: a server that does not come up, or an
engine that does not start on the run's first try, raises a `UsageError`.
"""

from __future__ import annotations

import random
import time
from unittest import SkipTest
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from mlx_invariants.fuzz.aims import Aims, aims_for
from mlx_invariants.fuzz.case import dumps_case
from mlx_invariants.fuzz.corpus import CLASS_SCENARIOS, SEED_SCENARIOS, aimed_within, burst, surface_tour
from mlx_invariants.fuzz.defaults import BUDGET_GRACE_S, FIRST_START_S, FIRST_USE_STALL_S
from mlx_invariants.fuzz.driver import DriverSettings
from mlx_invariants.fuzz.errors import ViolationFound
from mlx_invariants.fuzz.followup import FollowupOutcome, reference_of
from mlx_invariants.fuzz.findings import Finding, FindingsBook, confirmed, signature
from mlx_invariants.fuzz.oracles import Violation, judge
from mlx_invariants.fuzz.pace import Pace, driver_settings, gone_budget, measure
from mlx_invariants.fuzz.profiles import (PROFILES, Profile, Requests, hypothesis_settings, requests_for,
                                          search_phases)
from mlx_invariants.fuzz.report import Failure, device_info
from mlx_invariants.fuzz.rest import DRIFT_SCENARIOS, REPEATED_KINDS
from mlx_invariants.fuzz.scenario import (DEFAULT_KINDS, FAULT_KINDS, INDEXED_POINTS, POINTS, At,
                                           FaultSpec, RequestSpec, Scenario, aimable)
from mlx_invariants.fuzz.sentinel import Sentinel
from mlx_invariants.fuzz.summary import RunSummary
from mlx_invariants.fuzz.session import EngineSession
from mlx_invariants.fuzz.settings import FuzzSettings
from mlx_invariants.fuzz.shrinking import Shrinking, lead_with, shrink_limit, violation_type
from mlx_invariants.fuzz.statistics import RunStatistics
from mlx_invariants.fuzz.steering import distances
from mlx_invariants.fuzz.target import Engines, Target
from mlx_invariants.fuzz.trace import Trace

# The asyncio debug-mode run: two requests, one cancelled mid-decode.
DEBUG_SCENARIO = Scenario((RequestSpec("r0", 4, 6, True), RequestSpec("r1", 3, 4, False)),
                          (FaultSpec("cancel", At("r0", "BEFORE_DECODE", 1)),), debug=True)
# Violations a cold baseline may show (first imports hold the GIL on the owner thread).
_BASELINE_EXEMPT = {"loop-lag"}
# While shrinking, a smaller candidate counts only if it repeats this many times on a fresh engine.
CONFIRM_RUNS = 1
# The database's replay round: the failures it holds for the target, smallest first, up to the first that still
# fails, then (if none does) this many at most of those that once failed on the way to one (its secondary corpus).
REPLAY_EXAMPLES = 2


class Phase(Enum):
    """What the run is doing with the scenario it reports."""

    GENERATE = "generate"        # sampling new scenarios
    CONFIRM = "confirm"          # re-running a new finding on fresh engines
    SHRINK = "shrink"            # making a failure smaller
    EXHAUSTIVE = "exhaustive"    # enumerating single-fault scenarios


@dataclass
class Progress:
    examples: int = 0
    elapsed_s: float = 0.0
    budget_s: float = 0.0
    failed: bool = False                  # a new (run-failing) finding so far
    phase: Phase = Phase.GENERATE
    scenario: str = ""
    examples_cap: Optional[int] = None    # the profile's example cap, when one applies
    findings: int = 0                     # distinct findings so far, of any status


@dataclass
class FuzzResult:
    engine: str
    examples: int
    elapsed_s: float
    findings: list[Finding] = field(default_factory=list)   # distinct, in the order found
    report_dir: Optional[Path] = None                # the first new finding's report folder
    run_dir: Optional[Path] = None                   # the run folder (`fuzz.evidence`), with report_dir set
    first_failure_s: Optional[float] = None          # time to the first violating example
    first_failure_examples: Optional[int] = None     # examples run up to and including it
    engines_started: int = 0                         # fresh engines, replays included
    mlx_s: float = 0.0                               # time spent inside MLX, summed over every scenario run
    mlx_calls: int = 0                               # MLX entries the sentinel saw (a server's included)
    mlx_threads: list[str] = field(default_factory=list)   # names of the threads that entered MLX
    scenario_runs: int = 0                           # every scenario run: examples, confirmations, shrinking
    counts: dict[str, int] = field(default_factory=dict)    # examples in which each oracle fired
    seed: Optional[str] = None
    budget_s: float = 0.0
    examples_cap: Optional[int] = None
    pace: Pace = field(default_factory=Pace)
    target: Optional[Target] = None
    requests: Optional[Requests] = None   # how many requests scenarios drew at most, and why (generation only)
    aims: Optional[Aims] = None           # where generated faults aimed, and why (`fuzz.aims`), once a baseline ran
    summary: Optional[RunSummary] = None  # as reported (`fuzz.evidence.summarize`), once its run folder is written

    @property
    def new_findings(self) -> list[Finding]:
        return [f for f in self.findings if f.new]

    @property
    def failure(self) -> Optional[Failure]:
        """The first new finding's failure: what fails the run (None if nothing new was confirmed)."""
        new = self.new_findings
        return new[0].failure if new else None

    @property
    def ok(self) -> bool:
        return not self.new_findings


def run_fuzz(target: Target | Engines, settings: FuzzSettings = FuzzSettings(), *, strategy: Any = None,
             progress: Optional[Callable[[Progress], None]] = None) -> FuzzResult:
    """Fuzz one target until its first new confirmed finding (every one with `keep_going`), `examples`
    examples, or `budget_s` seconds of wall time, whichever comes first.

    `target` may also be the `Engines` built from one, to share what it started
    (a server) with other runs; otherwise it is built here and closed at the
    end. `strategy` replaces `fuzz.strategies.scenarios()` aimed at the
    target's fault kinds and points; `progress` is called before each scenario.
    Raises a `UsageError` subclass if the target cannot be set up at all.
    """
    engines = target if isinstance(target, Engines) else target.build()
    try:
        profile = PROFILES[settings.profile]
        if settings.budget_s is None and settings.examples is None:
            budget_s, examples, cap = profile.budget_s, profile.examples, profile.examples
        else:  # a count alone runs to the count, however long a loaded machine takes for it
            budget_s = float("inf") if settings.budget_s is None else settings.budget_s
            examples = settings.examples
            cap = examples
        explicit = None if settings.explicit is None else list(settings.explicit)  # None: the seed corpus
        debug_run = profile.debug_run if settings.debug_run is None else settings.debug_run
        database = example_database(settings, engines.target)  # a Redis server that is not there fails before a start
        startup_s = engines.prepare()
        sentinel = Sentinel(strict=settings.strict).install()
        fuzz = _Fuzz(engines, settings, profile, budget_s, cap, progress, sentinel, startup_s)
        fuzz.database = database

        def search() -> None:
            fuzz.baseline()
            if not fuzz.done():
                fuzz.hypothesis(strategy, settings.seed, explicit)
            fuzz.teardown()
            if debug_run and not fuzz.done():
                fuzz.debug_run()
            if not fuzz.done():
                fuzz.settle_deferred()

        return _conclude(fuzz, sentinel, search, settings)
    finally:
        if engines is not target:
            engines.close()


def example_database(settings: FuzzSettings, target: Target) -> Any:
    """The run's example database (`fuzz.database`), its entries kept apart per target; None: none."""
    from mlx_invariants.fuzz.database import open_database, scope_of

    path = settings.database_path()
    if path is None:
        return None
    return open_database(path, readonly=settings.database_readonly, scope=scope_of(target))


def _conclude(fuzz: "_Fuzz", sentinel: Sentinel, search: Callable[[], None], settings: FuzzSettings) -> FuzzResult:
    """Run `search`, always release the engine and the sentinel, then write the run folder.

    The reports are written last, after the sentinel is gone, so a report that
    fails to write never leaves MLX wrapped.
    """
    try:
        search()
    finally:
        try:
            fuzz.session.close()
        finally:
            sentinel.uninstall()
    result = fuzz.result()
    if settings.report_dir is not None or settings.run_dir is not None:
        from mlx_invariants.fuzz.evidence import write_run_folder

        write_run_folder(result, settings.run_dir or settings.report_dir, server_log=fuzz.engines.server_log,
                         new_folder=settings.run_dir is None)
    return result


class _Fuzz:
    """One run: the kept engine's session and the clock, driving the baseline, the Hypothesis rounds, the
    confirmation and shrinking of what fails, and the fixed scenarios. What it keeps is in its nouns: the
    findings so far (`book`), the failure being shrunk (`shrinking`) and what the run spent (`stats`)."""

    def __init__(self, engines: Engines, settings: FuzzSettings, profile: Profile, budget_s: float,
                 examples: Optional[int], progress: Optional[Callable[[Progress], None]], sentinel: Sentinel,
                 startup_s: float = 0.0):
        self.engines, self.target, self.profile = engines, engines.target, profile
        self.settings = settings
        self.budget_s, self.examples = budget_s, examples
        self.progress = progress
        self.workdir = Path(settings.workdir) if settings.workdir else None
        reuse = profile.reuse_engine if settings.reuse is None else settings.reuse
        self.remote = engines.target.kind.http
        self.pace = Pace(startup_s=startup_s)
        self._base_driver = DriverSettings(strict=settings.strict)
        driver, self.stall_basis = driver_settings(self._base_driver, self.pace, self.remote)
        self.session = EngineSession(engines, sentinel, driver, reuse)
        self.stats = RunStatistics()
        # The fresh-engine output of the follow-up request: computed once per run, by the baseline.
        self.expected_followup: Optional[FollowupOutcome] = None
        self.capacity: Optional[int] = None       # what the engine says it holds at once, read by the baseline
        self.requests: Optional[Requests] = None  # what generated scenarios draw, past that capacity
        self.aims: Optional[Aims] = None          # where they aim, read by the baseline (`fuzz.aims`)
        self.started = time.monotonic()
        self.state = Progress(budget_s=budget_s, examples_cap=examples)
        self.seed_label: Optional[str] = None
        self.shrink_s, self.shrink = settings.shrink_s, settings.shrink
        self.book = FindingsBook(settings.baseline)
        self.shrinking: Optional[Shrinking] = None   # the confirmed failure being shrunk, if any
        self.database: Any = None                    # the Hypothesis example database, if any (`fuzz.database`)
        self._explicit_done: set[str] = set()
        self._deferred: list[tuple[Scenario, Trace, list[Violation]]] = []
        self._stop = False

    # -- running one scenario ----------------------------------------------------------
    def run(self, scenario: Scenario, fresh: bool = False) -> tuple[Trace, list[Violation]]:
        """Run one scenario (on the kept engine unless `fresh`); save it first so a crash leaves it behind.
        While a failure is being shrunk every scenario gets a fresh engine, so shrinking stays exact."""
        if self.workdir is not None:
            self.workdir.mkdir(parents=True, exist_ok=True)
            (self.workdir / "current.json").write_text(dumps_case(scenario, self.target))
        fresh = fresh or self.shrinking is not None
        if fresh and self.session.engine is not None:
            self.teardown()  # rare: a violation has normally retired the engine already
        trace = self.session.run(scenario, self.expected_followup, keep=False if fresh else None)
        self.stats.add_run(trace)
        trace.meta["stall_basis"] = self.stall_basis
        violations = judge(trace)
        if violations and self.engines.retire_server():
            trace.meta["server_retired"] = True  # the next scenario (a re-run, say) meets a new server
        return trace, violations

    def failure(self, scenario: Scenario, trace: Trace, violations: list[Violation]) -> Failure:
        return Failure(scenario, trace, violations, self.target, seed=self.seed_label,
                       server_log=self.engines.log_tail())

    def done(self) -> bool:
        """A new finding stopped the run (without keep-going)."""
        return self._stop

    def _elapsed(self) -> float:
        return time.monotonic() - self.started

    def _out_of_time(self) -> bool:
        return self._elapsed() > self.budget_s

    def _past_grace(self) -> bool:
        """Past the budget and the few seconds a finding met at its end gets to be confirmed, shrunk and
        replayed: the budget is a wall-clock promise, so what is left undone then is reported as such."""
        return time.monotonic() - self.started > self.budget_s + BUDGET_GRACE_S

    def _replays(self, scenario: Scenario, kind: str, runs: int) -> tuple[int, int, Optional[tuple[Trace, list[Violation]]]]:
        """Re-run `scenario` on fresh engines up to `runs` times, none once past the budget's grace:
        (runs that showed `kind`, runs made, the first such run)."""
        hits, made, first = 0, 0, None
        while made < runs and not self._past_grace():
            rerun = self._repeated(scenario, kind) if kind in REPEATED_KINDS else self.run(scenario, fresh=True)
            made += 1
            if any(v.kind == kind for v in rerun[1]):
                hits += 1
                first = first or rerun
        return hits, made, first

    def _repeated(self, scenario: Scenario, kind: str) -> tuple[Trace, list[Violation]]:
        """One re-run of a kind that shows only over many scenarios on one engine (a drift, `fuzz.rest`):
        `scenario` again and again on one fresh engine, until `kind` shows, the engine is retired, or
        `DRIFT_SCENARIOS` + 2 runs; the last run's trace and violations."""
        if self.session.engine is not None:
            self.teardown()
        for _ in range(DRIFT_SCENARIOS + 2):
            trace, violations = self.run(scenario)
            if any(v.kind == kind for v in violations) or self.session.engine is None:
                break
        if self.session.engine is not None:
            self.teardown()
        return trace, violations

    # -- the fixed scenarios -------------------------------------------------------------
    def baseline(self) -> None:
        """A request-free scenario on a fresh engine: warms imports, measures the target's pace, and its
        follow-up output is the fresh-engine reference for the whole run. An engine that does not start
        here is a setup error, not a finding. Its pace is not known yet, and its first MLX calls compile
        kernels: its stall backstop is `FIRST_USE_STALL_S`, not the paced one. Its first start (imports,
        model load) is timed apart, within `FIRST_START_S`, and kept out of the budget as a launched
        server's start-up is: the run's clock starts again once it returned."""
        scenario = Scenario(())
        paced = self.session.settings
        self.session.settings = replace(paced, stall_s=max(paced.stall_s, FIRST_USE_STALL_S),
                                        start_s=max(paced.start_s, FIRST_START_S))
        try:
            trace, violations = self.run(scenario)
        finally:
            self.session.settings = paced
        self.expected_followup = reference_of(trace, self.target.label, self.engines.log_tail(),
                                              sees_server_mlx=self.engines.sees_server_mlx)
        self.capacity = trace.meta.get("capacity")
        started_s = trace.meta.get("start_s", 0.0)  # an in-process engine's first start (a server's was before)
        self.started += started_s
        self.pace = measure(trace, self.pace.startup_s or started_s)
        driver, self.stall_basis = driver_settings(self._base_driver, self.pace, self.remote)
        self.session.settings = driver
        self._aim(trace)
        violations = [v for v in violations if v.kind not in _BASELINE_EXEMPT]
        if violations:
            # Judged at the end, if the search finds nothing steadier with the same signature: a race the
            # empty scenario shows now and then would otherwise hide the scenario that always shows it.
            self._deferred.append((scenario, trace, violations))

    def _aim(self, baseline: Trace) -> None:
        """Aim generated faults where the target reaches (`fuzz.aims`), and go on with the target narrowed to
        those points: what the run writes then names them, and the example database is scoped by them."""
        self.aims = aims_for(self.target, baseline.meta.get("declared_points"),
                             {e.name for e in baseline.of("point")}, gone_budget(self.pace))
        if self.aims.points != self.target.points:
            self.target = replace(self.target, points=self.aims.points)
            if self.database is not None:
                self.database = example_database(self.settings, self.target)

    def settle_deferred(self) -> None:
        """Judge the baseline's violations whose signatures the search did not settle."""
        for scenario, trace, violations in self._deferred:
            self.consider(scenario, trace, violations, shrinkable=False)
        self._deferred.clear()

    def debug_run(self) -> None:
        """The asyncio debug-mode scenario, on a fresh engine started on a debug-mode loop."""
        trace, violations = self.run(DEBUG_SCENARIO, fresh=True)
        if violations:
            self.consider(DEBUG_SCENARIO, trace, violations, shrinkable=False)

    def teardown(self) -> None:
        """Shut the kept engine down with the after-shutdown checks; a violation there is a finding
        against the scenario it ran last (not shrunk: shutting down is not part of that scenario)."""
        last = self.session.last
        trace = self.session.close()
        violations = judge(trace) if trace is not None else []
        if violations and last is not None:
            self.consider(last, trace, violations, shrinkable=False,
                          note="found when the reused engine was shut down after this scenario")

    # -- findings --------------------------------------------------------------------
    def consider(self, scenario: Scenario, trace: Trace, violations: list[Violation], *, shrinkable: bool,
                 note: str = "") -> Optional[Shrinking]:
        """A violating scenario: count it; if it shows a signature not settled yet, re-run it on fresh
        engines to confirm it. Returns the failure to shrink when it counts and repeats (and `shrinkable`);
        otherwise records the finding as it stands and returns None."""
        self.stats.count(violations)
        self.book.sight(violations, self._elapsed(), self.state.examples)
        chosen = next((v for v in violations if self.book.open(v)), None)
        if chosen is None:
            return None
        sig = signature(chosen)
        self.book.tried(sig)
        hits, runs, fresh_hit = self._confirm(scenario, chosen.kind)
        counted = confirmed(chosen.kind, hits, max(self.settings.replays, 1),
                            self.settings.confirm if self.settings.replays else 0)
        if fresh_hit is not None and trace.meta.get("reused", 0):
            trace, violations = fresh_hit  # report the fresh-engine run: it is what replays reproduce
        if counted and hits and shrinkable and self.shrink and chosen.kind not in REPEATED_KINDS:
            return Shrinking(sig, (hits, runs), (scenario, trace, lead_with(violations, chosen.kind)))
        failure = self.failure(scenario, trace, lead_with(violations, chosen.kind))
        failure.reproduced = (hits, runs)
        notes = [note] if note else []
        if trace.meta.get("reused", 0) and not hits:
            notes.append(f"seen on an engine reused after {trace.meta['reused']} scenario(s)")
        if runs < max(self.settings.replays, 1):
            notes.append(f"the budget ended after {runs} of its {max(self.settings.replays, 1)} re-runs")
        notes.append("not shrunk")
        failure.blob = "; ".join(notes)
        self._record(failure, sig, (hits, runs), counted, shrunk=False)
        return None

    def _confirm(self, scenario: Scenario, kind: str) -> tuple[int, int, Optional[tuple[Trace, list[Violation]]]]:
        """Re-run `scenario` on fresh engines: (runs that showed `kind`, runs, the first such run)."""
        self._tick(scenario, Phase.CONFIRM)
        return self._replays(scenario, kind, max(self.settings.replays, 1))

    def _record(self, failure: Failure, sig: str, confirmation: tuple[int, int], counted: bool,
                shrunk: bool) -> Finding:
        """Keep `failure` in the book as the finding for `sig`; a new one stops the run without keep-going."""
        failure.device = failure.device or device_info()
        finding = self.book.record(failure, sig, confirmation, counted, shrunk, self._elapsed(), self.state.examples)
        if finding.new:
            self.state.failed = True
            self._stop = not self.settings.keep_going
        self.state.findings = len(self.book.findings)
        return finding

    # -- search ----------------------------------------------------------------------
    def _tick(self, scenario: Scenario, phase: Phase) -> None:
        self.state.elapsed_s = time.monotonic() - self.started
        self.state.phase = phase
        self.state.scenario = scenario.describe()
        if self.progress is not None:
            self.progress(self.state)

    def _searching(self) -> bool:
        cap_left = self.examples is None or self.state.examples < self.examples
        return cap_left and not self._stop and not self._out_of_time()

    def hypothesis(self, strategy: Any, seed: Optional[int], explicit: Optional[list[Scenario]]) -> None:
        """Rounds of Hypothesis until the budget, the example cap or a new finding (without keep-going)
        ends the search. Each round that finds something shrinks it and records it; the next round starts
        on a new seed, with the explicit scenarios not yet run, and skips the signatures already settled.

        With an example database, a first round replays its failures for this target (Hypothesis's reuse
        phase alone) before the explicit scenarios and the search: a failure another runner wrote there is
        the run's first example. The search's rounds then only write to it (a failure replayed again in a
        later round, its signature settled, would pass there and be deleted). Hypothesis keeps no database
        in a derandomized round, so the `ci` profile's first round runs on the fixed seed 0 instead. With
        `steer`, rounds that are not derandomized end in Hypothesis's target phase, which climbs towards the
        distances to firing each example reports (`_steer`)."""
        from mlx_invariants.fuzz.strategies import TOP_LOGPROBS, scenarios

        if strategy is None:
            self.requests = requests_for(self.profile, self.settings.capacity, self.capacity)
            strategy = scenarios(kinds=self.target.fault_kinds, points=self.target.points, routes=self.target.routes,
                                 armed=self.target.arms_worker_faults,
                                 gone_tokens=self.aims.gone_tokens,
                                 # over HTTP the sampled token's log-probability only: the reference server
                                 # refuses top_logprobs (docs/http.md), and a refusal tests nothing here
                                 top_logprobs=0 if self.target.kind.over_http else TOP_LOGPROBS,
                                 crowd=self.requests.crowd(self.profile.max_requests),
                                 **{**self.profile.shapes, "max_requests": self.requests.most})
        if explicit is None:
            explicit = self.seed_corpus()
        derandomize = self.profile.derandomize and seed is None
        base_seed = seed if seed is not None else (0 if derandomize else random.getrandbits(32))
        self.seed_label = "derandomized (ci profile)" if derandomize else str(base_seed)
        if self.database is not None:
            derandomize = False
            if self._searching():
                self._round(strategy, [], REPLAY_EXAMPLES, base_seed, False, ("reuse",))
        search = search_phases(derandomize, replayed=self.database is not None, steer=self.settings.steer)
        round_number = 0
        while self._searching():
            remaining = None if self.examples is None else self.examples - self.state.examples
            count = self.profile.round_examples if remaining is None else min(remaining, self.profile.round_examples)
            first_round = derandomize and round_number == 0
            self._round(strategy, explicit, count, None if first_round else base_seed + round_number, first_round,
                        search)
            round_number += 1

    def seed_corpus(self) -> list[Scenario]:
        """What every run tries first (fuzz/corpus.py): the catalogue's seeds; where the target's capacity is
        known (given, or read by the baseline), a burst of one request past it (no more than `requests_for`
        allows); the class scenarios; the request surface's tour. Seeds and class scenarios only where they
        aim at points the target marks, with faults it takes. The burst
        goes before the rest: a short budget on a loaded box can end inside the corpus, and one scenario of
        many requests finds more than one of a few."""
        requests = requests_for(self.profile, self.settings.capacity, self.capacity)
        bursts = [burst(min(requests.capacity, requests.most - 1))] if requests.capacity is not None else []
        # over HTTP the sampled token's log-probability only, as generation asks (`search`)
        tour = surface_tour(0 if self.target.kind.over_http else 2)
        aims = (self.target.points, self.target.fault_kinds)
        return [*aimed_within(SEED_SCENARIOS, *aims), *bursts, *aimed_within(CLASS_SCENARIOS, *aims), tour]

    def _round(self, strategy: Any, explicit: list[Scenario], count: int, seed: Optional[int], derandomize: bool,
               phases: tuple[str, ...]) -> None:
        """One Hypothesis run of `count` examples on `seed` (or derandomized), the explicit scenarios not
        run yet first, through `phases`; a confirmed failure it raises is recorded."""
        from hypothesis import example, given
        from hypothesis import seed as fixed_seed
        from hypothesis.errors import Flaky

        def property_(scenario: Scenario) -> None:
            self._example(scenario)

        test = given(strategy)(property_)
        for scenario in reversed([s for s in explicit if s.dumps() not in self._explicit_done]):
            test = example(scenario)(test)
        if seed is not None:
            test = fixed_seed(seed)(test)
        test = hypothesis_settings(self.profile, count, derandomize=derandomize, shrink=self.shrink,
                                   database=self.database, phases=phases)(test)
        try:
            test()
        except SkipTest:
            pass  # a replay round found nothing in the database to replay: Hypothesis ran no example
        except ViolationFound as found:
            self._found(found)
        except Flaky as flaky:
            if self.shrinking is None:
                raise  # no failure was being shrunk: the harness itself is inconsistent
            # Hypothesis stopped shrinking (an example it replayed answered differently, or the strategy drew
            # differently): the smallest scenario shown to fail so far, not the one it first met.
            reason = str(flaky).splitlines()[0] if str(flaky) else type(flaky).__name__
            self._found(self.shrinking.smallest(), stopped=f"where Hypothesis called it flaky: {reason}")
        finally:
            self.shrinking = None

    def _example(self, scenario: Scenario) -> None:
        """One Hypothesis example: run it; raise (per signature) only for a confirmed, repeating finding.

        Raised from this one line, whether the failure was just shown or is told again: Hypothesis tells
        failures apart by the exception's type and the line that raised it, and calls a failing example
        flaky when a replay of it fails from another line (two raise sites made its first replay of every
        failure it was about to shrink "inconsistent", and the unshrunk scenario was reported)."""
        shown = self._shown(scenario)
        if shown is not None:
            raise violation_type(self.shrinking.signature)(*shown)

    def _shown(self, scenario: Scenario) -> Optional[tuple[Scenario, Trace, list[Violation]]]:
        """Run one example: the failure it shows of the signature being shrunk (a first confirmed one starts
        shrinking it), or None. Every failure shown is kept (`Shrinking.failing`)."""
        key = scenario.dumps()
        if self.shrinking is not None:
            known = self.shrinking.failing.get(key)
            if known is not None:
                # Asked again for a scenario already shown to fail, fresh engines included (Hypothesis's final
                # replay): its run is told again, not made again (a launched server's fresh start each).
                return known
            if self._past_grace() or time.monotonic() > self.shrinking.deadline:
                self.shrinking.cut = True
                return None  # shrinking ran out of time: only the known failures still count
        elif not self._searching():
            return None
        self._explicit_done.add(key)
        self._tick(scenario, Phase.SHRINK if self.shrinking else Phase.GENERATE)
        trace, violations = self.run(scenario)
        if self.shrinking is None:
            self.state.examples += 1
            if self.settings.steer:
                _steer(trace)
            met = time.monotonic()
            shrinking = self.consider(scenario, trace, violations, shrinkable=True) if violations else None
            if shrinking is None:
                return None
            _, trace, violations = shrinking.unshrunk
            now, end = time.monotonic(), self.started + self.budget_s
            shrinking.start(now, shrink_limit(self.shrink_s, self.settings.keep_going, end - met, now - met), end)
            self.shrinking = shrinking
        else:
            same = [v for v in violations if signature(v) == self.shrinking.signature]
            if not same or not self._repeats(scenario, same[0].kind):
                return None
            violations = lead_with(violations, same[0].kind)
        self.shrinking.failing[key] = (scenario, trace, violations)
        return scenario, trace, violations

    def _repeats(self, scenario: Scenario, kind: str) -> bool:
        """While shrinking: a smaller candidate counts only if it shows `kind` again on a fresh engine,
        so shrinking never builds on a one-off race. No re-run starts past the budget's grace: the candidate
        then does not count, and shrinking is marked cut."""
        for _ in range(CONFIRM_RUNS):
            if self._past_grace():
                self.shrinking.cut = True
                return False
            if not any(v.kind == kind for v in self.run(scenario, fresh=True)[1]):
                return False
        return True

    def _found(self, found: ViolationFound, stopped: str = "") -> None:
        """Hypothesis's minimal failure for the signature being shrunk (or, where shrinking was `stopped` for
        that reason, the smallest shown so far): replay it and record the finding."""
        shrinking, self.shrinking = self.shrinking, None
        sig = shrinking.signature if shrinking else signature(found.violations[0])
        confirmation = shrinking.confirmation if shrinking else (0, 0)
        failure = self.failure(found.scenario, found.trace, found.violations)
        notes = getattr(found, "__notes__", [])
        failure.blob = next((n.strip() for n in notes if "@reproduce_failure" in n), None)
        kind = found.violations[0].kind
        if not self.settings.replays:
            hits, runs = 0, 0
        elif shrinking and found.scenario.dumps() == shrinking.unshrunk[0].dumps():
            # Nothing smaller showed it: the confirmation's fresh re-runs were of this very scenario, so they are its
            # replays (three more fresh starts cost a launched server half a minute of the search's budget).
            hits, runs = confirmation
        else:
            hits, runs, _ = self._replays(found.scenario, kind, self.settings.replays)
        failure.reproduced = (hits, runs)
        shrunk = True
        if runs and shrinking and not confirmed(kind, hits, self.settings.replays, self.settings.confirm):
            # Shrinking slid onto a scenario that rarely shows it: report the one that was confirmed.
            failure = self.failure(*shrinking.unshrunk)
            failure.reproduced, shrunk = confirmation, False
            failure.blob = f"not shrunk: the smallest failing scenario replayed only {hits}/{runs}"
        elif shrunk and shrinking and (shrinking.cut or stopped):
            # The deadline or Hypothesis's doubt, not the shrinker's end, ended it: smaller scenarios may still
            # show the bug.
            shrunk = False
            why = stopped or f"at its {shrinking.limit_s:.3g}s limit"
            failure.blob = f"{failure.blob or ''} (shrinking stopped {why})".strip()
        self._record(failure, sig, confirmation, True, shrunk=shrunk)

    def enumerate(self, todo: list[Scenario]) -> None:
        """Run `todo` in order after the baseline, each violation confirmed as in a search (not shrunk:
        every scenario has one fault already), until a new finding stops the run."""
        self.baseline()
        for scenario in todo:
            if self.done():
                break
            self._tick(scenario, Phase.EXHAUSTIVE)
            trace, violations = self.run(scenario)
            self.state.examples += 1
            if violations:
                self.consider(scenario, trace, violations, shrinkable=False)
        self.teardown()
        if not self.done():
            self.settle_deferred()

    def result(self) -> FuzzResult:
        book, stats = self.book, self.stats
        return FuzzResult(
            self.target.label, self.state.examples, self._elapsed(), list(book.findings.values()),
            first_failure_s=book.first_failure_s, first_failure_examples=book.first_failure_examples,
            engines_started=self.session.starts, mlx_s=stats.mlx_s, mlx_calls=stats.mlx_calls,
            mlx_threads=sorted(stats.threads), scenario_runs=stats.runs, counts=dict(stats.counts),
            seed=self.seed_label, budget_s=self.budget_s, examples_cap=self.examples, pace=self.pace,
            target=self.target, requests=self.requests, aims=self.aims if self.requests else None)


def _steer(trace: Trace) -> None:
    """Tell Hypothesis how near this example came to firing each timing oracle (`fuzz.steering`): its target
    phase then climbs towards the nearest. Observations made while shrinking are not fed."""
    from hypothesis import target

    for label, value in distances(trace).items():
        target(value, label=label)


def exhaustive_scenarios(max_tokens: int = 3, kinds: Iterable[str] = DEFAULT_KINDS,
                         points: Iterable[str] = POINTS, armed: bool = False) -> list[Scenario]:
    """Every single-fault scenario, at every point (and index), for one streaming request, two, and a streaming
    one beside a plain one: a refusal then meets both transports (`fuzz.transport`) next to the streaming
    follow-up. `armed`: worker faults are armed in a launched server (`aimable`)."""
    out: list[Scenario] = []
    for transports in ((True,), (True, True), (True, False)):
        requests = tuple(RequestSpec(f"r{i}", 4, max_tokens, stream) for i, stream in enumerate(transports))
        for kind in kinds:
            for request in requests:
                for point in points:
                    if not aimable(kind, point, armed):
                        continue
                    for index in range(max_tokens if point in INDEXED_POINTS else 1):
                        out.append(Scenario(requests, (FaultSpec(kind, At(request.rid, point, index)),)))
    return out


def run_exhaustive(target: Target | Engines, settings: FuzzSettings = FuzzSettings(), *, max_tokens: int = 3,
                   progress: Optional[Callable[[Progress], None]] = None) -> FuzzResult:
    """Run `exhaustive_scenarios()` in order; stop at the first new confirmed finding (go through them all
    with `keep_going`). Of `settings`, the budget, examples, seed and shrinking do not apply."""
    engines = target if isinstance(target, Engines) else target.build()
    try:
        startup_s = engines.prepare()
        sentinel = Sentinel(strict=settings.strict).install()
        fuzz = _Fuzz(engines, settings, PROFILES[settings.profile], float("inf"), None, progress, sentinel, startup_s)
        fuzz.seed_label = "exhaustive"
        todo = exhaustive_scenarios(max_tokens, engines.target.fault_kinds, engines.target.points,
                                    engines.target.arms_worker_faults)
        return _conclude(fuzz, sentinel, lambda: fuzz.enumerate(todo), settings)
    finally:
        if engines is not target:
            engines.close()
