"""Defs that no code of their package names: what runs only if a user calls it, never the server.

A hazard the rules report needs its code to run. A method that nothing in the package calls,
references, registers or even mentions (in code, a string or a comment), and that no class
outside the package can call back as a hook, never runs while the server runs; nor does a def
named only inside such defs. Findings inside one are left out (issue 23: vllm-mlx's
`Scheduler.promote_from_ssd`, which nothing but the tests calls, and the `async_promote` that
only it calls, were graded false positives blind). A library's users call what its package
never does, so `report-unreferenced = true` reports these too.

What counts as named, deliberately wide (a missed call is a missed alarm, a wrong one silence):
any whole-word occurrence of the def's name anywhere in the package's files (the folder of the
topmost `__init__.py`, discovered with the run's excludes, whichever files the run was given)
outside its own body, other than a `def`/`class` line of that name, unless the occurrence sits
inside defs that are themselves unreferenced. Always live: a decorated def (a route, a
registration, a property), a dunder, a public module-level function (an entry point, the
library's API), a method of a class the package never names (how it is used is unknown), and a
method of a class with a base from outside the package (the framework may call it: `do_POST`,
a gRPC servicer's methods). A file outside any package is not judged.

A module that cannot be imported runs none of its code either: one whose module-level relative
import climbs above the top of its package to a module that does not exist (`from ..api import x`
in a top-level module of the package, a legacy copy left behind when the code moved down a level:
vmlx's `vmlx_engine/simple.py`, six findings graded arguable blind as dead code). Every finding in
it is left out.

A file's defs, classes and relative imports are read from its outline (outline.py), kept in the
cache by the digest of its text, so a re-run after one edit parses only the edited file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mlx_invariants.checker import source
from mlx_invariants.checker.cache import content_hash
from mlx_invariants.checker.errors import SourceError
from mlx_invariants.checker.files import discover
from mlx_invariants.checker.model.layout import Layout
from mlx_invariants.checker.model.outline import ClassSpan, Outline, outline
from mlx_invariants.checker.model.stored import Stored

if TYPE_CHECKING:
    from mlx_invariants.checker.config import Settings

# Bases that call nothing of a subclass by name.
_INERT_BASES = frozenset({"object", "ABC", "Generic", "Protocol"})
_DEFINES = re.compile(r"(?:def|class)\s+$")
_WORD_CHARACTER = re.compile(r"\w")


@dataclass(frozen=True)
class _Def:
    """A def of a parsed file: its span (from its first decorator), the def around it, and the
    class it is a method of."""

    path: str
    name: str
    first: int
    last: int
    parent: _Def | None
    cls: ClassSpan | None
    decorated: bool


class Unreferenced:
    """Answers, for the lines of findings, which lie in a def their package never names."""

    def __init__(self, settings: Settings, texts: dict[str, str], use_cache: bool) -> None:
        self.settings = settings
        self.texts = texts
        self.layout = Layout()
        self.stored = Stored(settings.cache_dir / f"unreferenced-{settings.key}.json" if use_cache else None)
        self._outlines_file = settings.cache_dir / f"outlines-{settings.key}.json" if use_cache else None
        self._kept_outlines: Stored | None = None  # read only when some package must be judged again
        self._packages: dict[str, list[str]] = {}  # package folder -> its files
        self._outlines: dict[str, Outline | None] = {}
        self._defs: dict[str, list[_Def] | None] = {}  # path -> its defs, outermost first
        self._live: dict[tuple[str, int], bool] = {}
        self._visiting: set[tuple[str, int]] = set()

    def dead_lines(self, candidates: dict[str, set[int]]) -> dict[str, set[int]]:
        """For each path, those of its lines inside a def (or inside a def around one) that the
        package never names. A package whose files and candidate lines are unchanged since a
        run that kept its answer is not read again."""
        by_package: dict[str, dict[str, set[int]]] = {}
        for path, lines in candidates.items():
            folder = self._package_of(path) if lines else None
            if folder is not None:
                by_package.setdefault(folder, {})[path] = lines
        dead: dict[str, set[int]] = {}
        for folder, wanted in by_package.items():
            fingerprint = self._fingerprint(folder, wanted)
            found = self.stored.get(fingerprint)
            if found is None:
                found = {path: sorted(self._dead_in(path, lines, folder)) for path, lines in wanted.items()}
                self.stored.put(fingerprint, found)
            dead.update((path, set(lines)) for path, lines in found.items() if lines)
        self.stored.save()
        if self._kept_outlines is not None:
            self._kept_outlines.save()
        return dead

    def _dead_in(self, path: str, lines: set[int], folder: str) -> set[int]:
        if self._unimportable(path):
            return set(lines)
        defs = self._parsed(path)
        if not defs:
            return set()
        dead = set()
        for line in lines:
            inner = _innermost(defs, line)
            chain = []
            while inner is not None:
                chain.append(inner)
                inner = inner.parent
            if any(not self._is_live(d, folder) for d in reversed(chain)):
                dead.add(line)
        return dead

    def _fingerprint(self, folder: str, wanted: dict[str, set[int]]) -> str:
        """The package's files as the file system describes them, and the lines asked about."""
        parts: list[Any] = [sorted((p, sorted(lines)) for p, lines in wanted.items())]
        for path in self._packages[folder]:
            try:
                info = os.stat(path)
                parts.append((path, info.st_size, info.st_mtime_ns, info.st_ino))
            except OSError:
                parts.append((path, None))
        blob = json.dumps(parts, separators=(",", ":"))
        return hashlib.blake2b(blob.encode(), digest_size=16).hexdigest()

    # --- the package -----------------------------------------------------------------------
    def _package_of(self, path: str) -> str | None:
        root, _, _ = self.layout.module_of(path)
        below = os.path.relpath(os.path.abspath(path), root).split(os.sep)
        if len(below) < 2:
            return None  # a module of its own, in no package: no package to look in
        folder = os.path.join(root, below[0])
        if folder not in self._packages:
            found = discover([folder], self.settings, force_exclude=True)
            self._packages[folder] = [f.path for f in found if f.problem is None]
        return folder

    def _text(self, path: str) -> str:
        text = self.texts.get(path)
        if text is None:
            try:
                text = source.decode(source.read(path, self.settings.max_file_bytes))
            except SourceError:
                text = ""
            self.texts[path] = text
        return text

    def _parsed(self, path: str) -> list[_Def] | None:
        if path not in self._defs:
            found = self._outline(path)
            self._defs[path] = _bound(path, found) if found is not None else None
        return self._defs[path]

    def _outline(self, path: str) -> Outline | None:
        """The file's outline: kept in the cache by the digest of its text, else parsed (and kept)."""
        if path not in self._outlines:
            text = self._text(path)
            if self._kept_outlines is None:
                self._kept_outlines = Stored(self._outlines_file)
            digest = content_hash(text.encode("utf-8", "surrogatepass"))
            kept = self._kept_outlines.get(digest)
            if kept is not None:
                found = Outline.from_json(kept["outline"]) if kept["outline"] is not None else None
            else:
                found = outline(text)
                self._kept_outlines.put(digest, {"outline": found.to_json() if found is not None else None})
            self._outlines[path] = found
        return self._outlines[path]

    # --- modules ---------------------------------------------------------------------------
    def _unimportable(self, path: str) -> bool:
        """A module-level relative import climbs above the top of the module's package to a place with
        no such module: importing the module raises ImportError ("attempted relative import beyond
        top-level package"), so none of its code can run. A guarded import (inside `try`) is left
        alone, and so is one whose target exists on disk (a namespace package above may make it work)."""
        found = self._outline(path)
        if found is None:
            return False
        _, dotted, is_init = self.layout.module_of(path)
        depth = len(dotted.split(".")) - (0 if is_init else 1)
        for level, module in found.relative_imports:
            if level > depth:
                above = os.path.dirname(os.path.abspath(path))
                for _ in range(level - 1):
                    above = os.path.dirname(above)
                target = os.path.join(above, *module.split("."))
                if not (os.path.exists(target + ".py") or os.path.isdir(target)):
                    return True
        return False

    # --- liveness --------------------------------------------------------------------------
    def _is_live(self, d: _Def, folder: str) -> bool:
        key = (d.path, d.first)
        if key in self._live:
            return self._live[key]
        if key in self._visiting:
            return False  # defs that name only each other: none of them is reached this way
        self._visiting.add(key)
        try:
            live = self._always_live(d, folder) or self._named(d.name, d, folder)
        finally:
            self._visiting.discard(key)
        self._live[key] = live
        return live

    def _always_live(self, d: _Def, folder: str) -> bool:
        if d.decorated or (d.name.startswith("__") and d.name.endswith("__")):
            return True
        if d.cls is None:
            return d.parent is None and not d.name.startswith("_")  # a public function of the module
        span = (d.path, d.cls.first, d.cls.last)
        return not self._named(d.cls.name, span, folder) or self._hooked(d.cls, d.path, folder, 0)

    def _hooked(self, cls: ClassSpan, path: str, folder: str, depth: int) -> bool:
        """Some base of `cls`, or of its bases in the package, is not the package's own."""
        if depth > 8:
            return True
        for name in cls.bases:
            if name in _INERT_BASES:
                continue
            homes = []
            if name:
                statement = re.compile(rf"class[ \t]+{re.escape(name)}\b")
                homes = [p for p in self._packages[folder] if name in self._text(p) and _declares(self._text(p), statement)]
            if not homes:
                return True
            for home in homes:
                for other in _classes(self._outline(home), name):
                    if self._hooked(other, home, folder, depth + 1):
                        return True
        return False

    def _named(self, name: str, own: _Def | tuple[str, int, int], folder: str) -> bool:
        """`name` occurs somewhere in the package outside `own` (a def, or a path and a line span)
        and outside a def or class line of that name, at a place that runs: module or class
        level, or inside a live def."""
        path, first, last = (own.path, own.first, own.last) if isinstance(own, _Def) else own
        pattern = re.compile(rf"{re.escape(name)}\b")
        for other in self._packages[folder]:
            text = self._text(other)
            if name not in text:
                continue
            defs = None
            line, counted = 1, 0  # the line of offset `counted`: matches come in order, so count on from there
            for start in _whole_words(text, pattern):
                if _DEFINES.search(text, max(0, start - 12), start):
                    continue
                line += text.count("\n", counted, start)
                counted = start
                if other == path and first <= line <= last:
                    continue
                if defs is None:
                    defs = self._parsed(other)
                    if defs is None:
                        return True  # a file that does not parse: assume it calls it
                around = _innermost(defs, line)
                if around is None or self._is_live(around, folder):
                    return True
        return False


def _bound(path: str, found: Outline) -> list[_Def]:
    """The outline's defs, outermost first, as defs of `path`."""
    defs: list[_Def] = []
    for d in found.defs:
        defs.append(_Def(path, d.name, d.first, d.last, defs[d.parent] if d.parent >= 0 else None,
                         found.classes[d.cls] if d.cls >= 0 else None, d.decorated))
    return defs


def _whole_words(text: str, word: re.Pattern[str]) -> Iterator[int]:
    """Where `word` (a name and `\\b`) starts as a whole word in `text`, in order: where no word character
    is right before it. The pattern leaves that test out: one that starts with `\\b` is tried at every offset
    of the text (80 ms to find a common name in all of vllm-mlx's 2.5 MB), one that starts with the name's
    letters is searched for them (4 ms)."""
    for match in word.finditer(text):
        start = match.start()
        if not start or not _WORD_CHARACTER.match(text, start - 1):
            yield start


def _declares(text: str, statement: re.Pattern[str]) -> bool:
    """A line of `text` starts with `statement` (`class Name`) after its indentation. The words are searched
    first: a pattern that starts with a line's indentation (`^[ \\t]*class ...`, multiline) is tried at every
    offset of the text, 1 ms per file of vllm-mlx that names a base class."""
    for match in statement.finditer(text):
        line = text.rfind("\n", 0, match.start()) + 1
        if not text[line:match.start()].strip(" \t"):
            return True
    return False


def _innermost(defs: list[_Def], line: int) -> _Def | None:
    best = None
    for d in defs:
        if d.first <= line <= d.last and (best is None or d.first >= best.first):
            best = d
    return best


def _classes(found: Outline | None, name: str) -> list[ClassSpan]:
    return [c for c in found.classes if c.name == name] if found is not None else []
