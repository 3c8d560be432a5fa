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
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from mlx_invariants.fuzz.oracles import Violation, is_exact
from mlx_invariants.fuzz.report import Failure
from mlx_invariants.fuzz.reproduce import replay_shell_command
from mlx_invariants.fuzz.summary import FindingSummary, Status

FRAMES_PER_STACK = 3   # innermost engine frames per stack that make a signature
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
