"""Distinct findings of one run: a signature per bug, and whether each counts.

A run that keeps going (`--keep-going`) sees the same bug in many scenarios;
it must report it once. Two violations are the same finding when their
oracle is the same and so are "the frames that matter": the innermost frames
of each stack that belong to the engine, not to Python, installed packages or
the fuzzer, named by file and function (line numbers move with every edit).

Each finding has a status:

- `violation`: confirmed (it replayed often enough on fresh engines, or its
  oracle is exact by construction, `oracles.EXACT_KINDS`) and not in the
  baseline: it fails the run;
- `accepted`: confirmed, and its signature is in the baseline (`fuzz.baseline`):
  listed, never failing;
- `unconfirmed`: seen, but it replayed less than the confirmation rate and its
  oracle judges timing or outputs: listed with its replay rate, never failing.

A run keeps its findings in a `FindingsBook`: one per signature, which
signatures are still open (unseen, or unconfirmed with tries left), and when
each was first seen.
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Collection, Iterable, Optional

from mlx_invariants.fuzz.oracles import Violation, is_exact
from mlx_invariants.fuzz.report import Failure
from mlx_invariants.fuzz.reproduce import replay_shell_command
from mlx_invariants.fuzz.summary import FindingSummary, Status

FRAMES_PER_STACK = 3   # innermost engine frames per stack that make a signature
# An unconfirmed signature is tried again at most this many times (a frequent flaky race would
# otherwise spend the budget on confirmation re-runs); a confirmed one is never tried again.
RETRIES = 5
_FUZZ_DIR = os.path.dirname(os.path.abspath(__file__))
_NOT_ENGINE = tuple({p for p in (sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("purelib"),
                                 sysconfig.get_paths().get("platlib"), sys.base_prefix, _FUZZ_DIR) if p})


def frames_that_matter(stack: tuple[str, ...]) -> tuple[str, ...]:
    """The innermost `FRAMES_PER_STACK` frames of `stack` ("file:line in function", innermost last) that
    are the engine's, as "file.py:function"."""
    kept = []
    for frame in stack:
        path, _, function = frame.rpartition(" in ")
        filename = path.rsplit(":", 1)[0]
        if not filename or filename.startswith("<") or filename.startswith(_NOT_ENGINE):
            continue
        kept.append(f"{Path(filename).name}:{function}")
    return tuple(kept[-FRAMES_PER_STACK:])


def signature(violation: Violation) -> str:
    """The oracle and the frames that matter of the offending stack: "kind" or "kind @ b.py:g < a.py:f"
    (innermost first). The offending stack is the last one a violation carries (the second entrant, the
    early release, the re-acquire); the first is context (the owner's entry, the worker's start) and
    differs between a fresh engine and a reused one. Readable on purpose: a baseline file lists these."""
    stacks = [frames for frames in map(frames_that_matter, violation.stacks) if frames]
    return violation.kind + (" @ " + " < ".join(reversed(stacks[-1])) if stacks else "")


def short_id(sig: str) -> str:
    """A stable eight-character name for a signature (folder names, JUnit case names)."""
    return hashlib.sha1(sig.encode()).hexdigest()[:8]


@dataclass
class Finding:
    """One distinct bug of a run: the failure that shows it (shrunk when it replayed), how it was judged,
    and where its report went."""

    failure: Failure
    signature: str
    status: Status
    confirmation: tuple[int, int]          # k of n re-runs on fresh engines showed it, before shrinking
    shrunk: bool = False
    seen: int = 1                          # examples that showed this signature
    report_dir: Optional[Path] = None
    found_after_s: Optional[float] = None  # seconds from the run's start to the example that first showed it
    examples_before: Optional[int] = None  # examples run by then, that one included

    @property
    def kind(self) -> str:
        return self.failure.violations[0].kind

    @property
    def exact(self) -> bool:
        return is_exact(self.kind)

    @property
    def new(self) -> bool:
        """Fails the run."""
        return self.status is Status.VIOLATION

    def summary(self) -> FindingSummary:
        """The finding as reported; its replay command is built here, once its report is written."""
        failure = self.failure
        replay = replay_shell_command(self.report_dir / "scenario.json", failure.target) if self.report_dir else None
        return FindingSummary(
            signature=self.signature, id=short_id(self.signature), status=self.status, oracle=self.kind,
            exact=self.exact, headline=failure.headline, confirmation=tuple(self.confirmation),
            reproduced=tuple(failure.reproduced) if failure.reproduced else None, shrunk=self.shrunk,
            seen=self.seen, scenario=failure.scenario.describe(), report=str(self.report_dir) if self.report_dir else None,
            replay=replay, found_after_s=None if self.found_after_s is None else round(self.found_after_s, 2),
            examples_before=self.examples_before)

    def to_json(self) -> dict:
        """`summary().to_json()`: the finding as summary.json lists it."""
        return self.summary().to_json()


def confirmed(kind: str, hits: int, runs: int, needed: int) -> bool:
    """Whether a violation of `kind` seen once and then in `hits` of `runs` fresh re-runs counts:
    an exact oracle always, any other once it repeated `needed` times (at most `runs`)."""
    return is_exact(kind) or hits >= min(needed, runs)


class FindingsBook:
    """One run's findings, one per signature in the order found, and what the run knows about each
    signature: when it was first seen, and how often it was tried (confirmation re-runs)."""

    def __init__(self, baseline: Collection[str] = ()):
        self.baseline = baseline                  # signatures accepted in advance (`fuzz.baseline`)
        self.findings: dict[str, Finding] = {}
        self.first_failure_s: Optional[float] = None       # when the first new finding was recorded
        self.first_failure_examples: Optional[int] = None  # examples run by then
        self._sighted: dict[str, tuple[float, int]] = {}   # signature: (seconds, examples) when first seen
        self._tries: Counter[str] = Counter()

    def sight(self, violations: Iterable[Violation], elapsed_s: float, examples: int) -> None:
        """An example showed `violations`: note when each signature was first seen, and count one more
        example for each signature already a finding."""
        sigs = {signature(v) for v in violations}
        for sig in sigs:
            self._sighted.setdefault(sig, (elapsed_s, examples))
        for sig in sigs & set(self.findings):
            self.findings[sig].seen += 1

    def open(self, violation: Violation) -> bool:
        """Whether a violation is worth confirming: its signature is not settled and has tries left."""
        found = self.findings.get(signature(violation))
        if found is None:
            return True
        return found.status is Status.UNCONFIRMED and self._tries[found.signature] < RETRIES

    def tried(self, sig: str) -> None:
        """One more confirmation of `sig` begins."""
        self._tries[sig] += 1

    def record(self, failure: Failure, sig: str, confirmation: tuple[int, int], counted: bool, shrunk: bool,
               elapsed_s: float, examples: int) -> Finding:
        """Keep `failure` as the finding for `sig` (replacing an unconfirmed one), judged against the baseline;
        `elapsed_s` and `examples` are the run's clock and count now. An unconfirmed one never replaces an
        earlier finding: the steadier of the two scenarios is kept, and the earlier finding returned."""
        if not counted:
            status = Status.UNCONFIRMED
        elif sig in self.baseline:
            status = Status.ACCEPTED
        else:
            status = Status.VIOLATION
        earlier = self.findings.get(sig)
        if earlier is not None and status is Status.UNCONFIRMED:
            if confirmation[0] * earlier.confirmation[1] > earlier.confirmation[0] * confirmation[1]:
                earlier.failure, earlier.confirmation = failure, confirmation  # keep the steadier scenario
            return earlier
        found_after_s, examples_before = self._sighted.get(sig, (elapsed_s, examples))
        finding = Finding(failure, sig, status, confirmation, shrunk=shrunk, seen=earlier.seen if earlier else 1,
                          found_after_s=found_after_s, examples_before=examples_before)
        if status is Status.UNCONFIRMED:
            failure.verdict = f"FINDING (unconfirmed: {confirmation[0]} of {confirmation[1]} re-runs showed it)"
        elif status is Status.ACCEPTED:
            failure.verdict = "FINDING (accepted: in the baseline)"
        self.findings.pop(sig, None)
        self.findings[sig] = finding
        if finding.new and self.first_failure_s is None:
            self.first_failure_s, self.first_failure_examples = elapsed_s, examples
        return finding
