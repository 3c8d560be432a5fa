"""Analyze one file's text: prefilter, parse once, run every enabled rule in one walk.

Imported only when some file is not in the cache, so a re-run of an unchanged
tree never pays for importing libcst.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import libcst as cst

from mlx_invariants.checker import source, suppress
from mlx_invariants.checker.config import Settings
from mlx_invariants.checker.errors import SourceError
from mlx_invariants.checker.rule import Rule
from mlx_invariants.checker.rules import RULES
from mlx_invariants.checker.positions import positions as positions_of
from mlx_invariants.checker.walker import COMPOUND, RawFinding, check_module, located_nodes

UNREADABLE = "INV000"
_RULES_BY_ID = {r.id: r for r in RULES}
# libcst's parser recurses natively; a big thread stack turns deep nesting into a
# clean error (or a success) instead of a crash.
_STACK_BYTES = 256 * 1024 * 1024
_RECURSION_LIMIT = 10_000

Report = dict[str, Any]  # {"findings": [[rule, line, col, message, suppressed_by_line]], "suppressions": [...]}
T = TypeVar("T")


def active(rules: list[tuple[type[Rule], dict[str, Any]]], text: str) -> list[tuple[type[Rule], dict[str, Any]]]:
    return [(r, o) for r, o in rules if all(any(t in text for t in group) for group in r.triggers)]


def analyze_text(text: str, rules: list[tuple[type[Rule], dict[str, Any]]], shared: dict[str, Any]) -> Report:
    """Findings of one file's text (before per-path filtering), with suppressions applied."""
    suppressions = suppress.scan(text)
    report: Report = {
        "findings": [],
        "suppressions": [[s.line, sorted(s.ids) if s.ids is not None else None] for s in suppressions],
    }
    firing = active(rules, text)
    try:
        if not firing:
            # No rule can fire here; still say if the file does not compile.
            source.check_syntax(text)
            return report
        module = source.parse(text)
        raw = check_module(module, firing, shared)
        if raw:
            report["findings"] = _locate(module, raw, text, suppressions)
    except SourceError as exc:
        report["findings"] = [[UNREADABLE, exc.line, exc.col, f"cannot check this file: {exc.reason}", 0]]
    except RecursionError:
        report["findings"] = [[UNREADABLE, 1, 1, "cannot check this file: nested too deeply to check", 0]]
    except Exception as exc:  # a checker bug on one odd file must not stop the run over the others
        message = f"cannot check this file: the checker failed on it ({type(exc).__name__}: {exc}); please report it"
        report["findings"] = [[UNREADABLE, 1, 1, message, 0]]
    return report


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
        item = (finding.rule, where.start.line, where.start.column + 1, finding.message, covering.line if covering else 0)
        if item[:4] not in seen:
            seen.add(item[:4])
            located.append(list(item))
    located.sort(key=lambda f: (f[1], f[2], f[0]))
    return located


def in_deep_stack(fn: Callable[..., T], *args: Any) -> T:
    """Run `fn` in a thread with a large stack and a higher recursion limit."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        old = sys.getrecursionlimit()
        sys.setrecursionlimit(max(old, _RECURSION_LIMIT))
        try:
            outcome["value"] = fn(*args)
        except BaseException as exc:  # re-raised in the caller's thread below
            outcome["error"] = exc
        finally:
            sys.setrecursionlimit(old)

    previous = threading.stack_size()
    try:
        threading.stack_size(_STACK_BYTES)
        thread = threading.Thread(target=target, name="invariants-check", daemon=True)
        thread.start()
    except (ValueError, RuntimeError):  # a platform that refuses big stacks: run here
        threading.stack_size(previous)
        return fn(*args)
    finally:
        threading.stack_size(previous)
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def rules_for(settings: Settings) -> list[tuple[type[Rule], dict[str, Any]]]:
    return [(r, settings.options_for(r)) for r in settings.enabled(RULES)]


def analyze_batch(texts: list[str], rule_ids: list[str], options: list[dict[str, Any]], shared: dict[str, Any]) -> list[Report]:
    rules = [(_RULES_BY_ID[i], o) for i, o in zip(rule_ids, options)]
    return in_deep_stack(lambda: [analyze_text(t, rules, shared) for t in texts])
