"""Check files: read, prefilter, parse once, run every enabled rule in one walk.

Cheapest first: a file whose size, mtime and inode match the cache is not read;
a file whose content hash matches is not parsed; a file that contains none of
the enabled rules' trigger words is not parsed either. Only files with
findings pay for positions. `--jobs N` spreads the parsing over N processes.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from mlx_invariants.checker import mlx_facts, pins, source, versions
from mlx_invariants.checker.cache import Cache, content_hash
from mlx_invariants.checker.config import Settings, selected
from mlx_invariants.checker.errors import SourceError
from mlx_invariants.checker.files import SourceFile, discover
from mlx_invariants.checker.model import phase
from mlx_invariants.checker.model.unreferenced import Unreferenced
from mlx_invariants.checker.rule import Finding

UNREADABLE = "INV000"
UNUSED = "INV001"
Report = dict[str, Any]  # as in analysis.py: {"findings": [[rule, line, col, message, suppressed_by_line(, requires)]], ...}


@dataclass
class RunResult:
    findings: list[Finding] = field(default_factory=list)
    files: int = 0
    analyzed: int = 0  # files read and analyzed this run (the rest came from the cache)


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
    files = discover(paths, settings, force_exclude)
    cache = Cache(settings.cache_dir, settings.key) if use_cache else None
    reports: dict[str, Report] = {}
    known: dict[str, tuple[os.stat_result, str]] = {}  # each readable file's stat and content digest
    todo: list[tuple[SourceFile, os.stat_result, str, str]] = []
    # The Python each file is written for (requires-python): its syntax is judged in that grammar. The MLX
    # its project runs on: the version facts the analysis reads (mlx_facts.ANALYSIS_FACTS), and later the
    # findings true only on some versions.
    targets = versions.Targets()
    projects = pins.Projects(settings.mlx_versions)
    holds: dict[str, frozenset[str]] = {}
    for file in files:
        if file.problem is not None:
            reports[file.path] = {"findings": [[UNREADABLE, 1, 1, file.problem, 0]], "suppressions": []}
            continue
        try:
            info = os.stat(file.path)
        except OSError:
            info = None
        holds[file.path] = mlx_facts.analysis_facts(projects.of(file.path))
        # A result holds for one target and one set of version facts.
        variant = "@py" + versions.text(targets.of(file.path)) + "".join("@" + fact for fact in sorted(holds[file.path]))
        if cache is not None and info is not None:
            digest = cache.known_hash(file.path, info)
            if digest is not None and digest.endswith(variant) and cache.get(digest) is not None:
                reports[file.path] = cache.get(digest)
                known[file.path] = (info, digest)
                continue
        try:
            data = source.read(file.path, settings.max_file_bytes)
            digest = content_hash(data) + variant
            if cache is not None and cache.get(digest) is not None:
                reports[file.path] = cache.get(digest)
                cache.put(file.path, info or os.stat(file.path), digest, reports[file.path])
                known[file.path] = (info or os.stat(file.path), digest)
                continue
            text = source.decode(data)
        except SourceError as exc:
            reports[file.path] = _error_report(exc)
            continue
        todo.append((file, info or os.stat(file.path), digest, text))
    with _cyclic_gc_paused():
        analyzed = _analyze([t[3] for t in todo], settings, jobs, [targets.of(t[0].path) for t in todo],
                            [holds[t[0].path] for t in todo])
        for (file, info, digest, _), report in zip(todo, analyzed):
            reports[file.path] = report
            known[file.path] = (info, digest)
            if cache is not None:
                cache.put(file.path, info, digest, report)
        # The package-wide step: what crosses modules (model/phase.py); it keeps its summaries in the reports.
        texts = {file.path: text for file, _, _, text in todo}
        across, withdrawn = phase.package_findings(files, reports, known, texts, settings, cache, holds)
        if cache is not None:
            cache.save({f.path for f in files if f.problem is None})
        for path, rows in across.items():
            reports[path] = {**reports[path], "findings": reports[path]["findings"] + rows}
        # Findings in defs their package never names are left out (model/unreferenced.py), unless asked for.
        dead: dict[str, set[int]] = {}
        if not settings.report_unreferenced:
            candidates = {f.path: {row[1] for row in reports[f.path]["findings"] if row[0] != UNREADABLE} for f in files}
            dead = Unreferenced(settings, texts, cache is not None).dead_lines(candidates)
    result = RunResult(files=sum(f.problem is None for f in files), analyzed=len(todo))
    # Findings true only on some versions are judged by the project's MLX after the cache (such a result holds
    # for any version, and an edited pin takes effect at once).
    for file in files:
        result.findings.extend(_file_findings(file, reports[file.path], settings, report_unused,
                                              projects.of(file.path), dead.get(file.path, set()),
                                              withdrawn.get(file.path, set())))
    result.findings.sort()
    return result


@contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Analysis allocates millions of objects and keeps each file's tree alive while it works,
    so Python's cyclic collector keeps traversing trees it cannot free (they hold no cycles):
    3 s of a 10 s run on a 1.9 MB module, 7% on vllm-mlx. The package-wide steps run paused too:
    they leave no cycle (a summary's resolver and its scanner, and an outline's recursive walk,
    used to hold each file's ast tree in one; tests/invariants/test_collector.py checks they
    no longer do), and with the collector on, its collections walked the modules imported for the
    analysis (libcst's), the summaries and the graph. The analysis itself leaves about a dozen
    cyclic objects per file (1 474 over vllm-mlx's 120 files), collected by the next full collection."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if not gc.get_freeze_count():  # nobody else's frozen objects to thaw
                # What the run made and still holds (libcst's modules, the reports) lives until its end: filed
                # as old (freeze, then unfreeze: both splice lists), the first young collection does not walk
                # it (15 to 19 ms of a re-run after one edit of vllm-mlx). The analysis's few cycles wait for
                # the next full collection.
                gc.freeze()
                gc.unfreeze()
            gc.enable()


def _analyze(texts: list[str], settings: Settings, jobs: int, targets: list[versions.Version | None],
             holds: list[frozenset[str]]) -> list[Report]:
    """Each text's report; worker processes fork with the cyclic collector paused too."""
    if not texts:
        return []
    from mlx_invariants.checker import analysis  # libcst and the rules: only when something must be parsed

    rules = analysis.rules_for(settings)
    ids = [r.id for r, _ in rules]
    options = [o for _, o in rules]
    jobs = jobs or os.cpu_count() or 1
    if jobs <= 1 or sum(map(len, texts)) < _SMALL_RUN_CHARS:
        return analysis.analyze_batch(texts, ids, options, settings.shared, targets, settings.max_file_seconds, True,
                                      holds)
    # libcst parses only the files a rule may fire on; CPython's syntax check of the rest is ~5x cheaper.
    costs = [len(t) * (6 if analysis.active(rules, t) else 1) for t in texts]
    chunks = _balanced_chunks(costs, jobs * 2)
    import multiprocessing  # here, with the pool: 8 ms of imports that a re-run after one edit does not need
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() else None
    results: list[Report] = [{}] * len(texts)
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        futures = [pool.submit(analysis.analyze_batch, [texts[i] for i in chunk], ids, options, settings.shared,
                               [targets[i] for i in chunk], settings.max_file_seconds, True,
                               [holds[i] for i in chunk]) for chunk in chunks]
        for chunk, future in zip(chunks, futures):
            for index, report in zip(chunk, future.result()):
                results[index] = report
    return results


# Below this much text, starting worker processes costs more than it saves.
_SMALL_RUN_CHARS = 400_000


def _balanced_chunks(costs: list[int], count: int) -> list[list[int]]:
    """Indexes split into `count` chunks of similar total cost, the costliest chunk first."""
    chunks: list[list[int]] = [[] for _ in range(count)]
    totals = [0] * count
    for index in sorted(range(len(costs)), key=costs.__getitem__, reverse=True):
        lightest = totals.index(min(totals))
        chunks[lightest].append(index)
        totals[lightest] += costs[index]
    order = sorted(range(count), key=totals.__getitem__, reverse=True)
    return [chunks[i] for i in order if chunks[i]]


def _file_findings(file: SourceFile, report: Report, settings: Settings, report_unused: bool,
                   project: pins.Pins, dead: set[int] = frozenset(),  # type: ignore[assignment]
                   withdrawn: set[tuple[str, int, int]] = frozenset()) -> list[Finding]:  # type: ignore[assignment]
    """What the report shows of `file`, less the lines in `dead` (defs the package never names) and the
    findings the package model withdraws (`withdrawn`: rule, line, column; model/phase.py); a suppression
    there still counts as used."""
    enabled = set(settings.enabled_ids)
    found: list[Finding] = []
    used: set[tuple[int, str]] = set()
    for rule, line, col, message, suppressed_by, *requires in report["findings"]:
        if requires:  # true only before some MLX release: not reported where the project is past it
            verdict = mlx_facts.judge(requires[0], project)
            if verdict is mlx_facts.Verdict.HOLDS:
                continue
            if verdict is mlx_facts.Verdict.UNKNOWN:
                message += mlx_facts.unknown_note(requires[0], project)
        if rule == UNREADABLE:
            if selected(UNREADABLE, settings.select, settings.ignore) and settings.applies(rule, file.relpath):
                found.append(Finding(file.display, line, col, rule, message))
            continue
        if rule not in enabled or not settings.applies(rule, file.relpath):
            continue
        if suppressed_by:
            used.add((suppressed_by, rule))
            continue
        if line in dead or (rule, line, col) in withdrawn:
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
    from mlx_invariants.checker import analysis

    project = pins.settled(pins.Pins(), settings.mlx_versions)  # a snippet has only the settings
    report = analysis.in_deep_stack(analysis.analyze_text, text, analysis.rules_for(settings), settings.shared, None,
                                    None, mlx_facts.analysis_facts(project))
    file = SourceFile(path, path, path)
    return sorted(_file_findings(file, report, settings, True, project))
