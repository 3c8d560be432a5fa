"""Analyze one file's text: prefilter, parse once, run every enabled rule in one walk.

Imported only when some file is not in the cache, so a re-run of an unchanged
tree never pays for importing libcst.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import libcst as cst

from mlx_invariants.checker import isolation, source, suppress
from mlx_invariants.checker.config import Settings
from mlx_invariants.checker.errors import SourceError
from mlx_invariants.checker.rule import Rule
from mlx_invariants.checker.rules import RULES
from mlx_invariants.checker.positions import positions as positions_of
from mlx_invariants.checker.versions import Version
from mlx_invariants.checker.walker import COMPOUND, RawFinding, check_module, located_nodes

UNREADABLE = "INV000"
_RULES_BY_ID = {r.id: r for r in RULES}
_NESTED = "cannot check this file: nested too deeply to check"

# {"findings": [[rule, line, col, message, suppressed_by_line(, requires)]], "suppressions": [...]}; `requires`:
# the MLX facts under which the finding is not true (mlx_facts.py), only where there are some.
Report = dict[str, Any]
T = TypeVar("T")


def active(rules: list[tuple[type[Rule], dict[str, Any]]], text: str) -> list[tuple[type[Rule], dict[str, Any]]]:
    return [(r, o) for r, o in rules if all(any(_occurs(t, text) for t in group) for group in r.triggers)]


def _occurs(trigger: str | re.Pattern[str], text: str) -> bool:
    """A substring in the text, or a match of a pattern (a rule whose shape a substring cannot narrow)."""
    return trigger in text if isinstance(trigger, str) else trigger.search(text) is not None


def analyze_text(
    text: str,
    rules: list[tuple[type[Rule], dict[str, Any]]],
    shared: dict[str, Any],
    target: Version | None = None,
    firing: list[tuple[type[Rule], dict[str, Any]]] | None = None,
    holds: frozenset[str] = frozenset(),
) -> Report:
    """Findings of one file's text (before per-path filtering), with suppressions applied.

    `target` is the Python the file is written for (None: the newest), see versions.py;
    `firing`, the rules `active` on it, when the caller has them already; `holds`, the facts of
    mlx_facts.ANALYSIS_FACTS true for its project."""
    suppressions = suppress.scan(text)
    report: Report = {
        "findings": [],
        "suppressions": [[s.line, sorted(s.ids) if s.ids is not None else None] for s in suppressions],
    }
    if firing is None:
        firing = active(rules, text)
    try:
        if firing and all(rule.possible for rule, _ in firing):
            # CPython's tree first, five times cheaper than libcst's: a rule it shows cannot fire is dropped,
            # and a file left with none is done (its syntax was just checked as check_syntax does).
            tree = source.ast_tree(text, target)
            if tree is not None:
                firing = [(rule, options) for rule, options in firing if rule.possible(tree)]  # type: ignore[misc]
                if not firing:
                    return report
        if not firing:
            # No rule can fire here; still say if the file does not compile.
            source.check_syntax(text, target)
            return report
        module = source.parse(text, target)
        raw = check_module(module, firing, shared, holds)
        if raw:
            report["findings"] = _locate(module, raw, text, suppressions)
    except SourceError as exc:
        report["findings"] = [[UNREADABLE, exc.line, exc.col, f"cannot check this file: {exc.reason}", 0]]
    except RecursionError:
        report["findings"] = [[UNREADABLE, 1, 1, _NESTED, 0]]
    except Exception as exc:  # a checker bug on one odd file must not stop the run over the others
        if _from_recursion(exc):  # libcst's cleanup after a RecursionError can raise something else
            report["findings"] = [[UNREADABLE, 1, 1, _NESTED, 0]]
        else:
            message = f"cannot check this file: the checker failed on it ({_describe(exc)}); please report it"
            report["findings"] = [[UNREADABLE, 1, 1, message, 0]]
    return report


def _from_recursion(exc: BaseException) -> bool:
    seen = 0
    cause: BaseException | None = exc
    while cause is not None and seen < 20:
        if isinstance(cause, RecursionError):
            return True
        cause = cause.__cause__ or cause.__context__
        seen += 1
    return False


def _describe(exc: Exception) -> str:
    """`Type: message`, without str() of the arguments: a KeyError's is the repr of a node, as
    deep as the tree under it (that repr itself ran out of stack on a 5 000-branch elif chain)."""
    parts = [str(a) if isinstance(a, (str, int, float)) else type(a).__name__ for a in exc.args]
    detail = ", ".join(parts)
    detail = detail.splitlines()[0][:200] if detail else ""
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


def _header_end(statement: cst.CSTNode, start: int, positions: Any) -> int:
    """Last line of a compound statement's header (the line with its colon)."""
    body = getattr(statement, "body", None)
    if isinstance(body, cst.IndentedBlock) and body.body:
        first = body.body[0]
        return max(start, positions[first].start.line - len(getattr(first, "leading_lines", ())) - 1)
    return start


def _locate(module: cst.Module, raw: list[RawFinding], text: str, suppressions: list[suppress.Suppression]) -> list:
    positions = positions_of(module, located_nodes(raw))
    lines = text.splitlines()
    seen = set()
    located = []
    groups: dict[tuple[str, object], tuple[list, list[str], RawFinding]] = {}  # each group's reported one
    for finding in raw:
        where = positions[finding.node]
        statement = finding.statement
        if statement is None:
            span = (where.start.line, where.end.line)
        else:
            start = positions[statement].start.line
            if type(statement) in COMPOUND:
                span = (start, max(_header_end(statement, start, positions), min(where.end.line, where.start.line)))
            else:
                span = (start, positions[statement].end.line)
        above = suppress.comment_block_above(lines, span[0])
        covering = suppress.covering(suppressions, finding.rule, span, above)
        message = _worded(finding)
        item = (finding.rule, where.start.line, where.start.column + 1, message, covering.line if covering else 0)
        if finding.requires:  # a sixth field only where a finding depends on the MLX version
            item += (list(finding.requires),)
        if finding.group is not None and covering is None:
            reported = groups.get((finding.rule, finding.group))
            if reported is not None:
                reported[1].append(finding.mention)
                continue
        if item[:4] not in seen:
            seen.add(item[:4])
            located.append(list(item))
            if finding.group is not None and covering is None:
                groups[(finding.rule, finding.group)] = (located[-1], [], finding)
    for reported, mentions, first in groups.values():
        if mentions:
            also = f" (and so {'do' if len(mentions) > 1 else 'does'} {' and '.join(mentions)} below)"
            reported[3] = _worded(first, also)
    located.sort(key=lambda f: (f[1], f[2], f[0]))
    return located


def _worded(finding: RawFinding, also: str = "") -> str:
    """A finding's message: what is wrong, then `also` (the group's other members, when merged), then its
    remedy where it keeps one apart."""
    return f"{finding.message}{also}: {finding.remedy}" if finding.remedy else finding.message + also


def in_deep_stack(fn: Callable[..., T], *args: Any) -> T:
    """Run `fn` in a thread with a large stack and a higher recursion limit."""
    return isolation.in_deep_stack(fn, *args)


def rules_for(settings: Settings) -> list[tuple[type[Rule], dict[str, Any]]]:
    return [(r, settings.options_for(r)) for r in settings.enabled(RULES)]


def stopped_report(limit: float) -> Report:
    message = (f"cannot check this file: analysis stopped after {limit:g} s (max-file-seconds); "
               "exclude it or raise max-file-seconds")
    return {"findings": [[UNREADABLE, 1, 1, message, 0]], "suppressions": []}


def analyze_batch(
    texts: list[str],
    rule_ids: list[str],
    options: list[dict[str, Any]],
    shared: dict[str, Any],
    targets: list[Version | None] | None = None,
    limit: float = 0,
    isolate: bool = True,
    holds: list[frozenset[str]] | None = None,
) -> list[Report]:
    """Each text's report. Each file gets `limit` seconds of CPU time (0: no limit), after which
    it is an INV000 finding; one whose libcst parse could stall in native code, which no thread
    can interrupt, is analyzed in a child process (one for the batch, `isolate`). `holds`: each
    file's facts of mlx_facts.ANALYSIS_FACTS (none where not given)."""
    rules = [(_RULES_BY_ID[i], o) for i, o in zip(rule_ids, options)]
    items = list(zip(texts, targets or [None] * len(texts), holds or [frozenset()] * len(texts)))
    firing = [active(rules, t) for t in texts]
    # Only a file some rule fires on is parsed by libcst (the prefilter costs about 1% of that parse).
    isolated = [isolate and bool(f) and source.needs_isolation(t) for t, f in zip(texts, firing)]
    reports: list[Report | None] = [None] * len(items)
    if any(isolated):
        worker = isolation.Worker(partial(_isolated, rule_ids, options, shared, limit), limit)
        try:
            for index, item in enumerate(items):
                if isolated[index]:
                    answer, why = worker.ask(item)
                    reports[index] = answer if why is None else _failed_report(why, limit)
        finally:
            worker.close()
    here = [i for i, flag in enumerate(isolated) if not flag]
    done = isolation.map_limited(lambda i: analyze_text(texts[i], rules, shared, items[i][1], firing[i], items[i][2]),
                                 here, limit)
    for index, report in zip(here, done):
        reports[index] = report if report is not None else stopped_report(limit)
    return reports  # type: ignore[return-value]


def _failed_report(why: str, limit: float) -> Report:
    if why == isolation.STOPPED:
        return stopped_report(limit)
    message = f"cannot check this file: the checker {why} on it; please report it"
    return {"findings": [[UNREADABLE, 1, 1, message, 0]], "suppressions": []}


def _isolated(rule_ids: list[str], options: list[dict[str, Any]], shared: dict[str, Any], limit: float,
              request: tuple[str, Version | None, frozenset[str]]) -> Report:
    """One file in the isolated child: the same analysis, with the same in-process watchdog."""
    text, target, holds = request
    return analyze_batch([text], rule_ids, options, shared, [target], limit, False, [holds])[0]
