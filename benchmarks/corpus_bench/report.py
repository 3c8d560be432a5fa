"""The results as Markdown tables (printed, and written into docs/corpus.md) and summary lines."""

from __future__ import annotations

from corpus_bench.loro import RepoScores, total
from corpus_bench.run import Results
from corpus_bench.scoring import BugScore, Summary, summarise
from corpus_bench.tools import Finding

CLASS_NAMES = {
    "A": "cross-thread MLX stream / owner thread",
    "B": "concurrent Metal access",
    "C": "lock released before the worker finished / cancel not propagated",
    "D": "event loop blocked by a sync MLX call",
    "E": "admission pile-up / head-of-line",
    "F": "swallowed or mishandled cancellation/exception",
    "G": "shutdown/teardown",
    "H": "request-slot leak / zombie request",
    "I": "timeout policy",
    "J": "cross-thread hand-off race (non-MLX state)",
    "K": "busy-wait / GIL starvation",
}


def cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def table(header: list[str], rows: list[list[object]], right: set[int] | None = None) -> list[str]:
    """A Markdown table; columns numbered in `right` are right-aligned."""
    align = ["---:" if i in (right or ()) else "---" for i in range(len(header))]
    return ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |",
            *("| " + " | ".join(cell(c) for c in row) + " |" for row in rows)]


def rules_of(findings: tuple[Finding, ...]) -> str:
    return ", ".join(dict.fromkeys(f.rule for f in findings)) or "-"


def detected(score: BugScore) -> str:
    return f"yes ({rules_of(score.on_defect)})" if score.detected else "no"


def silent(score: BugScore) -> str:
    if score.in_fix_span is None:
        return "not scored"
    return "yes" if not score.in_fix_span else f"no ({rules_of(score.in_fix_span)})"


def summary_line(results: Results, tool: str) -> str:
    """`corpus: ...` for the checker on the main split; the split and the tool, when they are others, in brackets."""
    line = summarise(results.bugs[tool], results.cleans[tool]).line()
    tags = [t for t in (results.split, "" if tool == "invariants" else tool) if t]
    return line.replace("corpus:", f"corpus ({', '.join(tags)}):", 1) if tags else line


def heading(title: str, results: Results) -> str:
    """A section title, naming the split unless it is the main one."""
    return f"{title}, {results.split} split" if results.split else title


def summary_table(results: Results, versions: dict[str, str]) -> list[str]:
    rows = []
    for tool in results.tools:
        s = summarise(results.bugs[tool], results.cleans[tool])
        rows.append([f"{tool} {versions.get(tool, '')}".strip(), f"{s.detected['S']}/{s.bugs['S']}",
                     f"{s.detected['P']}/{s.bugs['P']}", f"{s.silent}/{s.silent_scored}", s.clean_findings,
                     s.clean_justified])
    return table(["tool", "detected S", "detected P", "silent at fix", "clean-file findings", "of them justified"],
                 rows, right={1, 2, 3, 4, 5})


def class_table(results: Results) -> list[str]:
    """Detected per class for each tool, and the checker's silence at the fix."""
    rows = []
    for cls in sorted({b.case.cls for b in results.bugs["invariants"]}):
        row: list[object] = [f"{cls}: {CLASS_NAMES.get(cls, '?')}"]
        for tool in results.tools:
            mine = [b for b in results.bugs[tool] if b.case.cls == cls]
            row.append(f"{sum(b.detected for b in mine)}/{len(mine)}")
        scored = [b for b in results.bugs["invariants"] if b.case.cls == cls and b.silent_at_fix is not None]
        row.append(f"{sum(bool(b.silent_at_fix) for b in scored)}/{len(scored)}")
        rows.append(row)
    header = ["class", *(f"detected: {t}" for t in results.tools), "silent at fix: invariants"]
    return table(header, rows, right=set(range(1, len(header))))


def case_table(results: Results, tool: str = "invariants") -> list[str]:
    rows = [[b.case.id, b.case.cls, b.case.detectability, detected(b), silent(b),
             f"{'-' if b.in_fix_span is None else len(b.in_fix_span)} / {b.fix_total}"]
            for b in results.bugs[tool]]
    return table(["id", "class", "S/P", "detected (rules on the defect)", "silent at fix",
                  "findings at fix (in fix_span / in file)"], rows)


def comparison_table(results: Results) -> list[str]:
    by_tool = {t: {b.case.id: b for b in results.bugs[t]} for t in results.tools}
    rows = []
    for b in results.bugs[results.tools[0]]:
        row: list[object] = [b.case.id, b.case.cls, b.case.detectability]
        for tool in results.tools:
            row += [detected(by_tool[tool][b.case.id]), silent(by_tool[tool][b.case.id])]
        rows.append(row)
    header = ["id", "class", "S/P"]
    for tool in results.tools:
        header += [f"{tool}: detected", f"{tool}: silent at fix"]
    return table(header, rows)


def clean_table(results: Results) -> list[str]:
    by_tool = {t: {c.case.id: c for c in results.cleans[t]} for t in results.tools}
    rows = []
    for c in results.cleans[results.tools[0]]:
        row: list[object] = [c.case.id, c.case.repo, c.case.path]
        for tool in results.tools:
            score = by_tool[tool][c.case.id]
            row.append(f"{score.total} ({len(score.justified)} justified)" if score.total else "0")
        rows.append(row)
    return table(["id", "repo", "path", *(f"{t} findings" for t in results.tools)], rows)


def _where(finding: Finding) -> str:
    return f"L{finding.line} {finding.rule}"


def clean_findings(results: Results, tool: str = "invariants") -> list[str]:
    lines = []
    for score in results.cleans[tool]:
        for f in sorted(score.justified + score.unjustified):
            verdict = "justified" if f in score.justified else "unjustified"
            lines.append(f"- {score.case.id} `{score.case.path}:{f.line}` {f.rule} {f.message} ({verdict})")
    return lines or ["- none"]


def details_table(results: Results, tool: str = "invariants") -> list[str]:
    """Every finding in both files of each bug case; `*` marks those the scoring counted."""
    rows = []
    for b in results.bugs[tool]:
        found = results.findings[tool][b.case.id]
        buggy = [_where(f) + ("*" if f in b.on_defect else "") for f in found["buggy"]]
        fix = [_where(f) + ("*" if b.in_fix_span and f in b.in_fix_span else "") for f in found["fix"]]
        rows.append([b.case.id, b.case.path, ", ".join(buggy) or "-", ", ".join(fix) or "-"])
    return table(["id", "path", "buggy commit (* on the defect)", "fix commit (* inside fix_span)"], rows)


def split_report(results: Results, versions: dict[str, str]) -> list[str]:
    parts = [f"## {heading('Bug cases (invariants)', results)}", "", *case_table(results), ""]
    if len(results.tools) > 1:
        parts += [f"## {heading('Bug cases, side by side', results)}", "", *comparison_table(results), ""]
    parts += [f"## {heading('Clean files', results)}", "", *clean_table(results), "", *clean_findings(results), "",
              f"## {heading('By class', results)}", "", *class_table(results), "",
              f"## {heading('Summary', results)}", "", *summary_table(results, versions), ""]
    return parts


def _rate(summary: Summary | None, key: str) -> str:
    """`x/y` of one column: detected S or P, or silent at fix; `-` where there is nothing to count."""
    if summary is None:
        return "-"
    if key == "silent":
        found, of = summary.silent, summary.silent_scored
    else:
        found, of = summary.detected[key], summary.bugs[key]
    return f"{found}/{of}" if of else "-"


def _before(scores: RepoScores) -> str:
    if scores.checker is None:
        return "-"
    return f"`{scores.checker.short}` ({scores.checker.date})" + ("" if scores.studied.held_out else ", not held out")


def _cases(summary: Summary) -> str:
    return " / ".join(str(summary.bugs[d]) for d in ("S", "P", "N"))


def repo_table(scores: list[RepoScores], baselines: tuple[str, ...]) -> list[str]:
    """Per repository: the checker before it studied the repository's cases, today, and the baselines.

    Two total rows follow: the repositories held out (whose before-studied checker had
    not seen their cases) and all of them."""
    tools = ("invariants", *baselines)

    def row(name: str, split: str, before_at: str, group: list[RepoScores]) -> list[object]:
        today = {tool: total(group, lambda s, t=tool: s.today[t]) for tool in tools}
        before = total(group, lambda s: s.before)
        out: list[object] = [name, split, _cases(today["invariants"]), sum(s.cleans for s in group), before_at]
        out += [_rate(before, k) for k in ("S", "P", "silent")]
        return out + [_rate(today[tool], k) for tool in tools for k in ("S", "P", "silent")]

    rows = [row(s.repo, s.split, _before(s), [s]) for s in scores]
    held = [s for s in scores if s.studied and s.studied.held_out]
    if held:
        rows.append(row("held-out repositories", "", "each its own", held))
    rows.append(row("all repositories", "", "each its own" if all(s.checker for s in scores) else "-", scores))
    header = ["repository", "split", "bug cases S / P / N", "clean files", "rules before studied",
              "before: S", "before: P", "before: silent at fix", "today: S", "today: P", "today: silent at fix"]
    for tool in baselines:
        header += [f"{tool}: S", f"{tool}: P", f"{tool}: silent at fix"]
    return table(header, rows, right=set(range(5, len(header))) | {3})


def repo_clean_table(scores: list[RepoScores], baselines: tuple[str, ...]) -> list[str]:
    """Findings on each repository's clean files: before studied, today, and the baselines."""
    rows = []
    for s in scores:
        if not s.cleans:
            continue
        rows.append([s.repo, s.cleans, "-" if s.before is None else s.before.clean_findings,
                     *(s.today[t].clean_findings for t in ("invariants", *baselines))])
    header = ["repository", "clean files", "before studied", "today", *baselines]
    return table(header, rows, right=set(range(1, len(header)))) if rows else ["No clean files."]


def stdout_report(splits: list[Results], versions: dict[str, str], repos: list[RepoScores] | None = None) -> str:
    """Every split's tables in turn, the per-repository table, then all the summary lines together."""
    parts = [line for results in splits for line in split_report(results, versions)]
    if repos:
        baselines = tuple(t for t in splits[0].tools if t != "invariants")
        parts += ["## By repository", "", *repo_table(repos, baselines), ""]
    parts += [summary_line(results, t) for results in splits for t in results.tools]
    return "\n".join(parts) + "\n"

