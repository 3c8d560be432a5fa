"""Check files: read, prefilter, parse once, run every enabled rule in one walk.

Cheapest first: a file whose size, mtime and inode match the cache is not read;
a file whose content hash matches is not parsed; a file that contains none of
the enabled rules' trigger words is not parsed either. Only files with
findings pay for positions. `--jobs N` spreads the parsing over N processes.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from invariants import source, suppress
from invariants.cache import Cache, content_hash, tool_fingerprint
from invariants.config import Settings, selected
from invariants.errors import SourceError
from invariants.files import SourceFile, discover
from invariants.rule import Finding, Rule
from invariants.rules import RULES
from invariants.walker import COMPOUND, RawFinding, check_module

UNREADABLE = "INV000"
UNUSED = "INV001"
_RULES_BY_ID = {r.id: r for r in RULES}
# libcst's parser recurses natively; a big thread stack turns deep nesting into a
# clean error (or a success) instead of a crash.
_STACK_BYTES = 256 * 1024 * 1024
_RECURSION_LIMIT = 10_000

Report = dict[str, Any]  # {"findings": [[rule, line, col, message, suppressed_by_line]], "suppressions": [...]}
T = TypeVar("T")


@dataclass
class RunResult:
    findings: list[Finding] = field(default_factory=list)
    files: int = 0
    analyzed: int = 0  # files read and analyzed this run (the rest came from the cache)


def _active(rules: list[tuple[type[Rule], dict[str, Any]]], text: str) -> list[tuple[type[Rule], dict[str, Any]]]:
    return [(r, o) for r, o in rules if all(any(t in text for t in group) for group in r.triggers)]


def analyze_text(text: str, rules: list[tuple[type[Rule], dict[str, Any]]], shared: dict[str, Any]) -> Report:
    """Findings of one file's text (before per-path filtering), with suppressions applied."""
    suppressions = suppress.scan(text)
    report: Report = {
        "findings": [],
        "suppressions": [[s.line, sorted(s.ids) if s.ids is not None else None] for s in suppressions],
    }
    active = _active(rules, text)
    try:
        if not active:
            # No rule can fire here; still say if the file does not compile.
            source.check_syntax(text)
            return report
        module = source.parse(text)
        raw = check_module(module, active, shared)
        if raw:
            report["findings"] = _locate(module, raw, text, suppressions)
    except SourceError as exc:
        report["findings"] = [[UNREADABLE, exc.line, exc.col, f"cannot check this file: {exc.reason}", 0]]
    except RecursionError:
        report["findings"] = [[UNREADABLE, 1, 1, "cannot check this file: nested too deeply to check", 0]]
    return report


def _header_end(statement: cst.CSTNode, start: int, positions: Any) -> int:
    """Last line of a compound statement's header (the line with its colon)."""
    body = getattr(statement, "body", None)
    if isinstance(body, cst.IndentedBlock) and body.body:
        first = body.body[0]
        return max(start, positions[first].start.line - len(getattr(first, "leading_lines", ())) - 1)
    return start


def _locate(module: cst.Module, raw: list[RawFinding], text: str, suppressions: list[suppress.Suppression]) -> list:
    positions = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
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


def _analyze_batch(texts: list[str], rule_ids: list[str], options: list[dict[str, Any]], shared: dict[str, Any]) -> list[Report]:
    rules = [(_RULES_BY_ID[i], o) for i, o in zip(rule_ids, options)]
    return in_deep_stack(lambda: [analyze_text(t, rules, shared) for t in texts])


def _error_report(exc: SourceError) -> Report:
    return {"findings": [[UNREADABLE, exc.line, exc.col, f"cannot check this file: {exc.reason}", 0]], "suppressions": []}


def check_paths(
    paths: list[str],
    settings: Settings,
    *,
    jobs: int = 1,
    use_cache: bool = True,
    report_unused: bool = False,
    force_exclude: bool = False,
) -> RunResult:
    """Check every Python file under `paths`; the findings are sorted by path and line."""
    rules = rules_for(settings)
    files = discover(paths, settings, force_exclude)
    cache = Cache(settings.cache_dir, f"{tool_fingerprint()}-{settings.digest()}") if use_cache else None
    reports: dict[str, Report] = {}
    todo: list[tuple[SourceFile, os.stat_result, str, str]] = []
    for file in files:
        try:
            info = os.stat(file.path)
        except OSError:
            info = None
        if cache is not None and info is not None:
            digest = cache.known_hash(file.path, info)
            if digest is not None and cache.get(digest) is not None:
                reports[file.path] = cache.get(digest)
                continue
        try:
            data = source.read(file.path, settings.max_file_bytes)
            digest = content_hash(data)
            if cache is not None and cache.get(digest) is not None:
                reports[file.path] = cache.get(digest)
                cache.put(file.path, info or os.stat(file.path), digest, reports[file.path])
                continue
            text = source.decode(data)
        except SourceError as exc:
            reports[file.path] = _error_report(exc)
            continue
        todo.append((file, info or os.stat(file.path), digest, text))
    for (file, info, digest, _), report in zip(todo, _analyze_all([t[3] for t in todo], rules, settings, jobs)):
        reports[file.path] = report
        if cache is not None:
            cache.put(file.path, info, digest, report)
    if cache is not None:
        cache.save({f.path for f in files})
    result = RunResult(files=len(files), analyzed=len(todo))
    for file in files:
        result.findings.extend(_file_findings(file, reports[file.path], settings, report_unused))
    result.findings.sort()
    return result


def _analyze_all(texts: list[str], rules: list[tuple[type[Rule], dict[str, Any]]], settings: Settings, jobs: int) -> list[Report]:
    ids = [r.id for r, _ in rules]
    options = [o for _, o in rules]
    jobs = jobs or os.cpu_count() or 1
    if jobs <= 1 or len(texts) < 2:
        return _analyze_batch(texts, ids, options, settings.shared)
    # Interleaved chunks balance the big files between workers.
    chunks = [texts[i::jobs * 2] for i in range(min(len(texts), jobs * 2))]
    order = [list(range(len(texts)))[i::jobs * 2] for i in range(len(chunks))]
    import multiprocessing

    context = multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() else None
    results: list[Report] = [{}] * len(texts)
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        futures = [pool.submit(_analyze_batch, chunk, ids, options, settings.shared) for chunk in chunks]
        for indexes, future in zip(order, futures):
            for index, report in zip(indexes, future.result()):
                results[index] = report
    return results


def _file_findings(file: SourceFile, report: Report, settings: Settings, report_unused: bool) -> list[Finding]:
    enabled = {r.id for r in settings.enabled(RULES)}
    found: list[Finding] = []
    used: set[tuple[int, str]] = set()
    for rule, line, col, message, suppressed_by in report["findings"]:
        if rule == UNREADABLE:
            if selected(UNREADABLE, settings.select, settings.ignore) and settings.applies(rule, file.relpath):
                found.append(Finding(file.display, line, col, rule, message))
            continue
        if rule not in enabled or not settings.applies(rule, file.relpath):
            continue
        if suppressed_by:
            used.add((suppressed_by, rule))
            continue
        found.append(Finding(file.display, line, col, rule, message))
    if report_unused and selected(UNUSED, settings.select, settings.ignore):
        for line, ids in report["suppressions"]:
            if ids is None:
                if not any(u_line == line for u_line, _ in used):
                    found.append(Finding(file.display, line, 1, UNUSED, "unused suppression: nothing is reported on this statement; remove it"))
                continue
            for rule in ids:
                if rule in enabled and settings.applies(rule, file.relpath) and (line, rule) not in used:
                    found.append(Finding(file.display, line, 1, UNUSED, f"unused suppression of {rule}: it reports nothing on this statement; remove it"))
    return found


def check_source(text: str, settings: Settings, path: str = "<string>") -> list[Finding]:
    """Findings of one snippet, as `invariants check` would report them (used by the tests and examples)."""
    rules = rules_for(settings)
    report = in_deep_stack(analyze_text, text, rules, settings.shared)
    file = SourceFile(path, path, path)
    return sorted(_file_findings(file, report, settings, report_unused=True))
