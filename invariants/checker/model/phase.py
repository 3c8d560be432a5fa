"""The package-wide step of `invariants check`: after every file's own report, build the model
of each package among the files of the run and add what its queries find.

Files are grouped by root: the folder above the topmost `__init__.py` of their folder (a file
outside any package is a module of its own folder). What a module's text says (`text_facts`)
is kept in its cached report (`report["model"]`) and its summary in the cache's summaries, by
content digest, so each is computed once per content; an unchanged package's findings are
kept in the cache folder by the digests of its files, so a re-run of an unchanged tree builds
nothing, reads no summary and never imports libcst.

Only entry modules (an `async def`, `to_thread`, `run_in_executor`, `Thread(` or `.submit(` in
the text, and an import from the package or a mention of MLX) are summarized up front; other
modules are read when a call leads to them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from mlx_invariants.checker import source
from mlx_invariants.checker.cache import UNKNOWN
from mlx_invariants.checker.errors import SourceError
from mlx_invariants.checker.model import blocking
from mlx_invariants.checker.model.cancel import Cancellers
from mlx_invariants.checker.model.graph import Package
from mlx_invariants.checker.model.handed import serves_no_one
from mlx_invariants.checker.model.layout import Layout
from mlx_invariants.checker.model.stored import Stored
from mlx_invariants.checker.model.queries import BEYOND_ENTRIES, QUERIES, ModelFinding
from mlx_invariants.checker.model.summary import FileSummary

if TYPE_CHECKING:
    from mlx_invariants.checker.cache import Cache
    from mlx_invariants.checker.config import Settings
    from mlx_invariants.checker.files import SourceFile

Row = list[Any]  # [rule, line, col, message, suppressed_by_line(, requires)], as in a file's report
Spot = tuple[str, int, int]  # a finding's rule, line and column
# Rules about calls of libraries outside the package, with the kind of call each asks about (model/blocking.py).
_LIBRARY_RULES = {"INV137": blocking.HTTP, "INV138": blocking.INFERENCE}
_ENTRY_WORDS = ("async ", "to_thread", "run_in_executor", "Thread(", ".submit(")  # a thread handoff: INV125
_IMPORTS = re.compile(r"^[ \t]*(?:from[ \t]+(\.+|[A-Za-z_]\w*)|import[ \t]+([A-Za-z_]\w*(?:[ \t]*,[ \t]*[A-Za-z_]\w*)*))", re.M)


def text_facts(text: str) -> dict[str, Any]:
    """What the text alone says about a file, to pick the modules worth summarizing up front:
    whether it has an `async def` or a thread handoff, mentions MLX, and what it imports from
    (the first part of each module name; "." for a relative import); its top-level classes,
    each with the last part of its bases' names and its methods' names, for the modules that may
    implement an abstract method (graph.py, `implementations`); and the attributes it stores on a web
    app's state, for the modules a route's `request.app.state.x` may come from (graph.py, `_member`)."""
    roots = set()
    for match in _IMPORTS.finditer(text):
        if match.group(1):
            roots.add("." if match.group(1).startswith(".") else match.group(1))
        else:
            roots.update(part.strip() for part in match.group(2).split(","))
    facts = {"entry": any(word in text for word in _ENTRY_WORDS), "mlx": "mlx" in text, "imports": sorted(roots)}
    imported = sorted(kind for kind, libraries in blocking.LIBRARIES.items() if roots & libraries)
    if blocking.names_inference(text):  # `engine.transcribe_file(...)`: INV138 judges it by its name alone
        imported = sorted({*imported, blocking.INFERENCE})
    if imported:
        facts["blocking"] = imported
    classes = top_classes(text)
    if classes:
        facts["classes"] = classes
    stored = sorted(set(_STATE_STORE.findall(text)))
    if stored:
        facts["state"] = stored
    return facts


# `app.state.engine = ...`: a store on a web app's state, which a route in another module reads back.
_STATE_STORE = re.compile(r"\.state\.(\w+)[ \t]*(?::[^=\n]*)?=(?!=)")


_CLASS = re.compile(r"class[ \t]+(\w+)[ \t]*(?:\(([^)]*)\))?[ \t]*:")
_METHOD = re.compile(r"([ \t]+)(?:async[ \t]+)?def[ \t]+(\w+)")


def top_classes(text: str) -> dict[str, list[list[str]]]:
    """Each top-level class: [its bases' last names, its methods' names], read line by line (a method is a
    `def` at the first indentation the class body uses)."""
    found: dict[str, list[list[str]]] = {}
    current: list[list[str]] | None = None
    indent = ""
    for line in text.splitlines():
        if not line or line[0] in " \t#":
            if current is not None and (method := _METHOD.match(line)) and (not indent or method.group(1) == indent):
                indent = method.group(1)
                current[1].append(method.group(2))
            continue
        current, indent = None, ""
        header = _CLASS.match(line)
        if header:
            bases = [b.strip().rpartition(".")[2].partition("[")[0] for b in (header.group(2) or "").split(",")]
            current = found[header.group(1)] = [[b for b in bases if b and "=" not in b], []]
    return found


def is_entry(facts: dict[str, Any], tops: set[str], libraries: frozenset[str] = frozenset()) -> bool:
    """An entry module: it has an async def or a handoff, and some chain from it can reach MLX
    (it mentions MLX, or imports from the package: a file that does neither reaches only itself
    and modules outside the package, where the per-file rules already see everything), or, with `libraries`
    (the kinds of blocking call the rules asked about: INV137's HTTP, INV138's inference), such a call (it imports
    a library of that kind, or calls a method named for a model's inference: model/blocking.py). TranscriptionSuite's
    routes call `engine.transcribe_file(...)` on an engine taken from the app's state, in a module whose imports
    name the package by the name it is installed as (`server.core`) rather than its folder's (`backend`)
    (server/backend/api/routes/transcription.py@6e3ea51:265, TS-ROUTEBLOCK)."""
    return bool(facts["entry"]) and (bool(facts["mlx"]) or any(r == "." or r in tops for r in facts["imports"])
                                     or bool(libraries.intersection(facts.get("blocking", ()))))


def package_findings(
    files: list[SourceFile],
    reports: dict[str, dict[str, Any]],
    known: dict[str, tuple[os.stat_result, str]],
    texts: dict[str, str],
    settings: Settings,
    cache: Cache | None,
    holds: dict[str, frozenset[str]] | None = None,
) -> tuple[dict[str, list[Row]], dict[str, set[Spot]]]:
    """Rows to add to each file's report, and the spots of its own findings the model withdraws
    (`WITHDRAWALS`), by path. `known` has each readable file's stat and content digest (its key names the
    version facts of `holds` too), `texts` the text of each file read this run, `holds` each file's facts
    of mlx_facts.ANALYSIS_FACTS."""
    rules = [r for r in (*QUERIES, *WITHDRAWALS) if r in settings.enabled_ids]
    if not rules:
        return {}, {}
    roots: dict[str, dict[str, str]] = {}  # root -> module -> path
    packages: dict[str, bool] = {}
    layout = Layout()
    for file in files:
        if file.problem is None and file.path in known and file.path.endswith(".py"):
            root, module, is_package = layout.module_of(file.path)
            roots.setdefault(root, {})[module] = file.path
            packages[file.path] = is_package
    stored = Stored(settings.cache_dir / f"model-{settings.key}.json" if cache is not None else None)
    found: dict[str, list[Row]] = {}
    withdrawn: dict[str, set[Spot]] = {}
    top = os.path.commonpath(list(roots)) if roots else ""
    for root, modules in roots.items():
        # a module's digest, and whether it is a package: the same text as `a/b.py` and as `a/b/__init__.py`
        # resolves its relative imports to different modules
        shape = {m: known[p][1] + ("/" if packages[p] else "") for m, p in modules.items()}
        # Modules outside any package, in a folder of tests, benchmarks or scripts (`benchmarks/run_load.py`,
        # `tests/evals/gsm8k/run.py`: a folder on the way down to them from the checked tree's top), serve no
        # one, as a package's `tests` module does: nothing of theirs is an entry.
        idle = any(serves_no_one(part) for part in _folders_below(top, root))
        fingerprint = _fingerprint([*rules, "idle"] if idle else rules, shape)
        result = stored.get(fingerprint)
        if result is None:
            result = _check_package(modules, packages, reports, known, texts, settings, cache, rules, holds or {},
                                    idle)
            stored.put(fingerprint, result)
        for module, items in result["add"].items():
            if module in modules:
                found.setdefault(modules[module], []).extend(items)
        for module, spots in result["withdraw"].items():
            if module in modules:
                withdrawn.setdefault(modules[module], set()).update((r, line, col) for r, line, col in spots)
    stored.save()
    return found, withdrawn


def _check_package(modules: dict[str, str], packages: dict[str, bool], reports: dict[str, dict[str, Any]],
                   known: dict[str, tuple[os.stat_result, str]], texts: dict[str, str], settings: Settings,
                   cache: Cache | None, rules: list[str], holds: dict[str, frozenset[str]],
                   idle: bool = False) -> dict[str, Any]:
    """Rows to add ("add") and spots withdrawn ("withdraw"), by module name (paths may change while the
    contents stay the same)."""
    summaries = _Summaries(reports, known, texts, settings, cache, holds)
    tops = {m.split(".", 1)[0] for m in modules}
    kinds = frozenset(kind for rule, kind in _LIBRARY_RULES.items() if rule in rules)
    entries = [] if idle else [m for m, p in modules.items() if is_entry(summaries.facts(p), tops, kinds)]
    package = Package({m: packages[p] for m, p in modules.items()}, lambda m: summaries.get(modules[m]), settings.shared,
                      {m: summaries.facts(p).get("classes", {}) for m, p in modules.items()},
                      {m: summaries.facts(p).get("state", []) for m, p in modules.items()})
    cancellers = Cancellers(package, lambda m: summaries.text(modules[m]) if m in modules else None)
    withdrawn = _withdrawn(cancellers, modules, reports, rules)
    if not entries:
        return {"add": {}, "withdraw": withdrawn}
    package.prepare(entries)
    rows: dict[str, list[Row]] = {}
    asked = {rule: set(entries) | (BEYOND_ENTRIES[rule](package) if rule in BEYOND_ENTRIES else set())
             for rule in rules if rule in QUERIES}
    for module in sorted(set().union(*asked.values()) & set(modules)):
        path = modules[module]
        report = reports[path]
        taken = {(r[0], r[1], r[2]) for r in report["findings"]}
        for rule in (r for r in rules if r in QUERIES and module in asked[r]):
            for finding in QUERIES[rule](package, module):
                spot = (finding.rule, finding.place.line, finding.place.col)
                if spot in taken:
                    continue  # the file's own rule already reports this call
                if rule in _LEFT_TO and any(r in _LEFT_TO[rule] and line == finding.place.line for r, line, _ in taken):
                    continue  # a more precise rule reports this line
                if rule in WITHDRAWALS and WITHDRAWALS[rule](cancellers, module, finding.place.line):
                    continue  # what the test withdraws from a file's own report, the model does not add either
                taken.add(spot)
                rows.setdefault(module, []).append(_row(finding, report["suppressions"]))
    return {"add": rows, "withdraw": withdrawn}


def _withdrawn(cancellers: Cancellers, modules: dict[str, str], reports: dict[str, dict[str, Any]],
               rules: list[str]) -> dict[str, list[Spot]]:
    """The spots of the files' own findings that the model shows cannot happen, by module: for each rule of
    `WITHDRAWALS`, those its test rejects, and for every rule, those in code that cannot run (after a call
    that raises each time: model/raises.py). Answered before `prepare`: it asks only the summaries and names."""
    asks = [r for r in rules if r in WITHDRAWALS]
    found: dict[str, list[Spot]] = {}
    for module, path in modules.items():
        for rule, line, col, _message, suppressed_by, *_ in reports[path]["findings"]:
            if suppressed_by or rule in _ALWAYS_SHOWN:
                continue
            if (rule in asks and WITHDRAWALS[rule](cancellers, module, line)) or cancellers.package.dead_line(module, line):
                found.setdefault(module, []).append((rule, line, col))
    return found


_ALWAYS_SHOWN = frozenset({"INV000", "INV001"})  # an unreadable file, an unused suppression: about the text itself


# A rule whose finding on a line gives way to another rule's on the same line: a model's inference (INV138, a
# method named for inference) that INV108 knows to be MLX on the loop is INV108's.
_LEFT_TO: dict[str, tuple[str, ...]] = {"INV138": ("INV108",)}


# Per-file rules whose findings the model withdraws, each with its test (the model's own findings of the rule
# pass the same test): INV105's lock freed by a cancelled await is no hazard where only the server's shutdown
# can cancel the coroutine; INV107's pool thread cannot meet a request's MLX in Metal at start-up, before the
# server serves anyone, in start-up code or a coroutine only start-up code awaits (model/cancel.py); INV132's close
# can meet a step still running only where a cancellation or the coroutine's own deadline cuts the await short;
# INV121's worker loop wastes work only once its caller stops waiting, which a caller only the shutdown cancels
# never does; INV141's thread takes a lock nobody releases only where a cancellation or the coroutine's own deadline
# cuts the await short.
WITHDRAWALS: dict[str, Callable[[Cancellers, str, int], bool]] = {
    "INV105": Cancellers.shutdown_only,
    "INV141": Cancellers.shutdown_only,
    "INV132": Cancellers.shutdown_only,
    "INV107": Cancellers.at_startup,
    "INV121": Cancellers.handed_by_shutdown_only,
}


def _row(finding: ModelFinding, suppressions: Iterable[list[Any]]) -> Row:
    place = finding.place
    covering = 0
    for line, ids in suppressions:
        if (ids is None or finding.rule in ids) and (place.first <= line <= place.last or place.above <= line < place.first):
            covering = line
            break
    row = [finding.rule, place.line, place.col, finding.message, covering]
    return row + [list(finding.requires)] if finding.requires else row


class _Summaries:
    """Each file's summary: from the cache, else from its text (read if need be)."""

    def __init__(self, reports: dict[str, dict[str, Any]], known: dict[str, tuple[os.stat_result, str]],
                 texts: dict[str, str], settings: Settings, cache: Cache | None,
                 holds: dict[str, frozenset[str]]) -> None:
        self.reports, self.known, self.texts, self.settings, self.cache = reports, known, texts, settings, cache
        self.holds = holds
        self.made: dict[str, Any] = {}  # summaries made in this run, by content digest

    def facts(self, path: str) -> dict[str, Any]:
        model = self.reports[path].get("model")
        if model is None:
            text = self.text(path)
            model = text_facts(text) if text is not None else {"entry": False, "mlx": False, "imports": []}
            self._store(path, model)
        return model

    def get(self, path: str) -> FileSummary | None:
        digest = self.known[path][1]
        data = self.made.get(digest, UNKNOWN)
        if data is UNKNOWN and self.cache is not None:
            data = self.cache.summary(digest)
        if data is UNKNOWN:
            text = self.text(path)
            data = None
            if text is not None:
                from mlx_invariants.checker.model.collect import summarize  # libcst, through mlx_api

                try:
                    data = summarize(text, self.settings.shared, self.holds.get(path, frozenset())).to_json()
                except (SyntaxError, ValueError, RecursionError, MemoryError):
                    data = None  # the file's own report says why (INV000)
            self.made[digest] = data
            if self.cache is not None:
                self.cache.put_summary(digest, data)
        return FileSummary.from_json(data) if data is not None else None

    def text(self, path: str) -> str | None:
        text = self.texts.get(path)
        if text is None:
            try:
                text = source.decode(source.read(path, self.settings.max_file_bytes))
            except SourceError:
                return None
            self.texts[path] = text
        return text

    def _store(self, path: str, model: dict[str, Any]) -> None:
        """Keep the text's facts in the file's report, and so in the cache (reports are content-keyed)."""
        report = self.reports[path] = {**self.reports[path], "model": model}
        if self.cache is not None:
            info, digest = self.known[path]
            self.cache.put(path, info, digest, report)


def _folders_below(top: str, root: str) -> list[str]:
    """The names of the folders from `top` (exclusive: the folder a run was pointed at is checked, whatever its
    name) down to `root`."""
    return [part for part in os.path.relpath(root, top).split(os.sep) if part not in (".", "..")]


def _fingerprint(rules: list[str], digests: dict[str, str]) -> str:
    blob = json.dumps([rules, sorted(digests.items())], separators=(",", ":"))
    return hashlib.blake2b(blob.encode(), digest_size=16).hexdigest()
