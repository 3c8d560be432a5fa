"""The corpus's scoring, exactly as its README defines it, so figures compare across runs and tools.

- Detected: some finding in the buggy file lies within a span widened by +-3 lines.
- Silent at fix: no finding in the fixed file lies inside `fix_span` (not widened);
  a case whose `fix_span` is null is not scored for this.
- Clean files: every finding counts; one inside a `justified` span (+-3 lines) is
  reported separately as justified.
"""

from __future__ import annotations

from dataclasses import dataclass

from corpus_bench.cases import DETECTABILITY, BugCase, CleanCase, Span
from corpus_bench.tools import Finding

WIDEN = 3


def inside(line: int, spans: tuple[Span, ...], widen: int = 0) -> bool:
    return any(start - widen <= line <= end + widen for start, end in spans)


@dataclass(frozen=True)
class BugScore:
    case: BugCase
    on_defect: tuple[Finding, ...]  # findings in the buggy file within the widened spans
    buggy_total: int
    in_fix_span: tuple[Finding, ...] | None  # None: not scored (null fix_span)
    fix_total: int

    @property
    def detected(self) -> bool:
        return bool(self.on_defect)

    @property
    def silent_at_fix(self) -> bool | None:
        return None if self.in_fix_span is None else not self.in_fix_span


@dataclass(frozen=True)
class CleanScore:
    case: CleanCase
    justified: tuple[Finding, ...]
    unjustified: tuple[Finding, ...]

    @property
    def total(self) -> int:
        return len(self.justified) + len(self.unjustified)


def score_bug(case: BugCase, buggy: list[Finding], fixed: list[Finding]) -> BugScore:
    on_defect = tuple(f for f in buggy if inside(f.line, case.spans, WIDEN))
    in_fix = None if case.fix_span is None else tuple(f for f in fixed if inside(f.line, case.fix_span))
    return BugScore(case, on_defect, len(buggy), in_fix, len(fixed))


def score_clean(case: CleanCase, found: list[Finding]) -> CleanScore:
    justified = tuple(f for f in found if inside(f.line, case.justified, WIDEN))
    return CleanScore(case, justified, tuple(f for f in found if f not in justified))


@dataclass(frozen=True)
class Summary:
    detected: dict[str, int]  # by detectability, "S", "P" and "N" (N stays out of the summary line)
    bugs: dict[str, int]
    silent: int
    silent_scored: int
    clean_findings: int
    clean_justified: int

    def line(self) -> str:
        return (f"corpus: detected S {self.detected['S']}/{self.bugs['S']}, P {self.detected['P']}/{self.bugs['P']}; "
                f"silent-at-fix {self.silent}/{self.silent_scored}; clean-file findings {self.clean_findings}")


def summarise(bugs: list[BugScore], cleans: list[CleanScore]) -> Summary:
    scored = [b for b in bugs if b.silent_at_fix is not None]
    return Summary(
        detected={d: sum(b.detected for b in bugs if b.case.detectability == d) for d in DETECTABILITY},
        bugs={d: sum(b.case.detectability == d for b in bugs) for d in DETECTABILITY},
        silent=sum(bool(b.silent_at_fix) for b in scored),
        silent_scored=len(scored),
        clean_findings=sum(c.total for c in cleans),
        clean_justified=sum(len(c.justified) for c in cleans),
    )
