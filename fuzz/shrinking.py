"""The state of shrinking one confirmed failure, and the exception type Hypothesis shrinks it by.

While a failure is shrunk, Hypothesis runs smaller candidates until it has
the smallest that still raises the same exception type: one type per
signature (`violation_type`), so it shrinks towards the same bug. Shrinking
has a deadline; past it only the scenarios already known to fail still count,
and the finding says it was cut. A scenario known to fail is never run again
while it is shrunk: Hypothesis asks for it again (its final replay) and is
told the run that showed it. If the smallest failing scenario does not
replay often enough, the unshrunk one is reported, as it was confirmed.
Where Hypothesis stops shrinking early (it called the failure flaky), the
smallest scenario shown to fail so far is reported (`Shrinking.smallest`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mlx_invariants.fuzz.defaults import KEEP_GOING_SHRINK_SHARE, SHRINK_FLOOR_S
from mlx_invariants.fuzz.errors import ViolationFound
from mlx_invariants.fuzz.findings import short_id
from mlx_invariants.fuzz.oracles import Violation
from mlx_invariants.fuzz.scenario import Scenario
from mlx_invariants.fuzz.trace import Trace

_KIND_TYPES: dict[str, type] = {}


def violation_type(sig: str) -> type:
    """One exception type per signature, so Hypothesis shrinks towards the same bug."""
    if sig not in _KIND_TYPES:
        kind = sig.split(" ", 1)[0].replace("-", "_")
        _KIND_TYPES[sig] = type(f"Violation_{kind}_{short_id(sig)}", (ViolationFound,), {})
    return _KIND_TYPES[sig]


def shrink_limit(shrink_s: float, keep_going: bool, budget_left_s: float, confirming_s: float = 0.0) -> float:
    """How long a finding may be shrunk: `shrink_s`. With keep-going, the finding's confirming and shrinking
    together get no more than a share of the budget left when it was met (`budget_left_s`; confirming took
    `confirming_s`), and shrinking never less than `SHRINK_FLOOR_S`: the run was asked for every bug it can find,
    and a smaller scenario for one it has is worth less than the search for the next (a zoo run spent 60 of
    its last 70 s shrinking a first finding and never met the second, which a run alone finds in 15 s; on a
    launched server, whose every fresh engine is a restart, confirming alone took a third of the budget)."""
    if not keep_going:
        return shrink_s
    return min(shrink_s, max(SHRINK_FLOOR_S, KEEP_GOING_SHRINK_SHARE * budget_left_s - confirming_s))


def lead_with(violations: list[Violation], kind: str) -> list[Violation]:
    """`violations` with the first one of `kind` first (the report's headline is the first)."""
    lead = next(v for v in violations if v.kind == kind)
    return [lead] + [v for v in violations if v is not lead]


@dataclass
class Shrinking:
    """One confirmed failure being made smaller."""

    signature: str                                       # what every smaller candidate must show again
    confirmation: tuple[int, int]                        # how it was confirmed: k of n fresh re-runs
    unshrunk: tuple[Scenario, Trace, list[Violation]]    # where it was seen: reported if shrinking slides off it
    deadline: float = 0.0                                # monotonic time; past it only known failures run
    # scenarios (by their JSON) that showed it, fresh engines included, each with the run that showed it
    failing: dict[str, tuple[Scenario, Trace, list[Violation]]] = field(default_factory=dict)
    cut: bool = False                                    # candidates were skipped at the deadline
    limit_s: float = 0.0                                 # the time it was given (a cut finding says it)

    def start(self, now: float, shrink_s: float, budget_end: float) -> None:
        """Set the deadline: `shrink_s` from `now`, and no later than the budget's end unless that leaves
        less than `SHRINK_FLOOR_S` (and never more than `shrink_s`)."""
        self.deadline = min(now + shrink_s, max(budget_end, now + min(SHRINK_FLOOR_S, shrink_s)))
        self.limit_s = self.deadline - now

    def smallest(self) -> ViolationFound:
        """The smallest scenario shown to fail (`size`), as Hypothesis would have been told it: what is
        reported when shrinking stops before Hypothesis has named its minimal failure."""
        return violation_type(self.signature)(*min(self.failing.values(), key=lambda shown: size(shown[0])))


def size(scenario: Scenario) -> tuple[int, int, int, int]:
    """How large a scenario is to whoever reads it: its faults, then its requests, then their prompt words
    and token budgets, then the length of its file (what Hypothesis's order on draws roughly follows)."""
    words = sum(r.prompt_len + r.max_tokens for r in scenario.requests)
    return len(scenario.faults), len(scenario.requests), words, len(scenario.dumps())
