"""The report as a plain-text table: mutant, killed by, time to kill, survived.

In a must-kill run, "survived" also names each layer that must kill the
mutant and did not, even when another layer killed it.
"""

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
    if not result.ran:
        survived = "-"
    elif result.killed and result.missed:  # a must-kill run: caught, but not by every layer that must catch it
        survived = f"YES ({', '.join(result.missed)})"
    else:
        survived = "no" if result.killed else "YES"
    return result.mutant.id, _killed_by(result), f"{ttk:.1f}s" if ttk is not None else "-", survived


def render(report: Report) -> str:
    """The table, then one line per layer that could not run and per mutant whose checks broke."""
    rows = [HEADER, *(_row(r) for r in report.results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    for layer, why in report.skipped_layers.items():
        lines.append(f"note: the {layer} layer did not run: {why}")
    if report.not_required:
        ids = ", ".join(m.id for m in report.not_required)
        lines.append(f"note: not run, no layer run here must kill them: {ids}")
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
    total, survivors, missing = len(report.results), report.survivors, report.missing
    if not survivors and not missing:
        return f"all {total} mutants killed" + (" by every layer that must kill them" if any(
            r.required for r in report.results) else "")
    lines = []
    if survivors:
        ids = ", ".join(r.mutant.id for r in survivors if r.mutant)
        lines.append(f"{len(survivors)} of {total} mutants not killed: {ids}.")
    if missing:
        ids = ", ".join(f"{r.mutant.id} ({', '.join(r.missed)})" for r in missing if r.mutant)
        lines.append(f"{len(missing)} of {total} mutants not killed by a layer that must kill them: {ids}.")
    return " ".join(lines) + (" A survivor is a hole in the harness: add the missing rule, oracle or engine test "
                              "(never weaken the mutant).")
