"""The report as a plain-text table: mutant, killed by, time to kill, survived."""

from __future__ import annotations

from mlx_invariants.mutants.runner import Report, Result

HEADER = ("mutant", "killed by", "time to kill", "survived")


def _killed_by(result: Result) -> str:
    if not result.ran:
        return "not run"
    kills = result.kills
    if not kills:
        problems = "; ".join(f"{o.layer} {o.verdict}" for o in result.problems)
        return f"nothing ({problems})" if problems else "nothing"
    return "; ".join(f"{o.layer}: {o.by}" for o in kills)


def _row(result: Result) -> tuple[str, str, str, str]:
    assert result.mutant is not None
    ttk = result.time_to_kill
    survived = "-" if not result.ran else ("no" if result.killed else "YES")
    return result.mutant.id, _killed_by(result), f"{ttk:.1f}s" if ttk is not None else "-", survived


def render(report: Report) -> str:
    """The table, then one line per layer that could not run and per mutant whose checks broke."""
    rows = [HEADER, *(_row(r) for r in report.results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    for layer, why in report.skipped_layers.items():
        lines.append(f"note: the {layer} layer did not run: {why}")
    for result in report.results:
        for outcome in result.problems:
            lines.append(f"note: {result.mutant.id}: {outcome.layer} {outcome.verdict} {outcome.by}".rstrip())
    return "\n".join(lines)


def summary(report: Report) -> str:
    if not report.baseline_clean:
        failing = [o for o in report.baseline.outcomes if o.verdict != "survived"]
        details = "\n".join(f"  {o.layer}: {o.verdict} {o.by}\n{o.detail}" for o in failing)
        return ("the unmutated engine fails its own checks, so no mutant result would mean anything; "
                f"fix the baseline first:\n{details}")
    total, survivors = len(report.results), report.survivors
    if not survivors:
        return f"all {total} mutants killed"
    ids = ", ".join(r.mutant.id for r in survivors if r.mutant)
    return (f"{len(survivors)} of {total} mutants not killed: {ids}. A survivor is a hole in the harness: "
            "add the missing rule, oracle or engine test (never weaken the mutant).")
