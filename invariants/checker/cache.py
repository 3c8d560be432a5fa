"""Results of unchanged files, so a re-run reads nothing it has already checked.

Keyed by content hash, under a key made of the tool's version, its own source
files' sizes and times, and the configuration digest; a file whose size, mtime
and inode match the last run is not even read. A missing, corrupt or foreign
cache file is silently rebuilt; a cache that cannot be written is skipped.

The package model's summaries (model/phase.py) are kept in a file of their own,
read only when a package must be modelled again: they are most of the cache (on
vllm-mlx 770 of 800 kB), and a re-run of an unchanged tree needs none of them.
That file is in `marshal`'s format, not JSON: a re-run after one edit writes it
again, 1.3 ms against 6.5 ms for vllm-mlx's (reading it, 5.8 ms against 6.8 ms).
The format is the running Python's, which the key names.
"""

from __future__ import annotations

import hashlib
import json
import marshal
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx_invariants

_CHECKER_DIR = Path(__file__).resolve().parent


def tool_fingerprint() -> str:
    """Changes whenever the checker's own code changes, released or not, and with the Python that
    runs it (whose parser judges the syntax of files written for it or an older one)."""
    parts = [mlx_invariants.__version__, "py%d.%d" % sys.version_info[:2]]
    for folder, _dirs, files in os.walk(_CHECKER_DIR):
        for name in sorted(files):
            if name.endswith(".py"):
                info = os.stat(os.path.join(folder, name))
                parts.append(f"{name}:{info.st_size}:{info.st_mtime_ns}")
    return hashlib.sha256("|".join(sorted(parts)).encode()).hexdigest()[:16]


def content_hash(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def load_settings(folder: Path, key: str) -> dict[str, Any] | None:
    try:
        return json.loads((folder / f"settings-{key}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def save_settings(folder: Path, key: str, data: dict[str, Any]) -> None:
    """Remember validated settings for the next run with the same table (best effort)."""
    try:
        prepare_folder(folder)
        for old in folder.glob("settings-*.json"):
            old.unlink(missing_ok=True)
        write_atomic(folder, f"settings-{key}.json", data)
    except OSError:
        pass


def prepare_folder(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    gitignore = folder / ".gitignore"
    if not gitignore.exists():
        gitignore.write_text("# written by invariants check\n*\n", encoding="utf-8")


def write_atomic(folder: Path, name: str, data: Any, encode: Callable[[Any], bytes] | None = None) -> None:
    """`data` in `folder/name` (as JSON, or as `encode` gives it), never half written. Encoded
    whole, then written once: `json.dump` to a file encodes in pure Python, piece by piece (40 ms
    against 9 ms for the 785 kB of vllm-mlx's results)."""
    blob = encode(data) if encode is not None else json.dumps(data, separators=(",", ":")).encode("utf-8")
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "wb") as handle:
        handle.write(blob)
    os.replace(tmp, folder / name)


# What `Cache.summary` answers for a content it keeps no summary of (None is a summary: the file's
# text does not parse).
UNKNOWN = object()


class Cache:
    """Per (tool, config) key in the cache folder, one JSON file of results and one of summaries."""

    def __init__(self, folder: Path, key: str) -> None:
        self.folder = folder
        self.file = folder / f"results-{key}.json"
        self.summaries_file = folder / f"summaries-{key}.marshal"
        self.stats: dict[str, list[Any]] = {}
        self.results: dict[str, Any] = {}
        self.summaries: dict[str, Any] | None = None  # by content digest; None until first asked
        self.dirty = False
        self.summaries_dirty = False
        try:
            data = json.loads(self.file.read_text(encoding="utf-8"))
            self.stats, self.results = data["stats"], data["results"]
        except (OSError, ValueError, KeyError, TypeError):
            pass

    @staticmethod
    def stat_key(info: os.stat_result) -> list[int]:
        return [info.st_size, info.st_mtime_ns, info.st_ino]

    def known_hash(self, path: str, info: os.stat_result) -> str | None:
        entry = self.stats.get(path)
        if entry and entry[:3] == self.stat_key(info):
            return entry[3]
        return None

    def get(self, digest: str) -> Any:
        return self.results.get(digest)

    def put(self, path: str, info: os.stat_result, digest: str, report: Any) -> None:
        self.stats[path] = [*self.stat_key(info), digest]
        self.results[digest] = report
        self.dirty = True

    def summary(self, digest: str) -> Any:
        """The package-model summary kept for this content digest, else UNKNOWN."""
        return self._summaries().get(digest, UNKNOWN)

    def put_summary(self, digest: str, summary: Any) -> None:
        self._summaries()[digest] = summary
        self.summaries_dirty = True

    def _summaries(self) -> dict[str, Any]:
        if self.summaries is None:
            try:
                data = marshal.loads(self.summaries_file.read_bytes())
                self.summaries = data if isinstance(data, dict) else {}
            except (OSError, ValueError, EOFError, TypeError):
                self.summaries = {}
        return self.summaries

    def save(self, live_paths: set[str]) -> None:
        """Write atomically, dropping entries of files that no longer exist in this run's paths
        (summaries only when they were read: unread, none was added either)."""
        if not self.dirty and not self.summaries_dirty:
            return
        try:
            prepare_folder(self.folder)
            for old in [*self.folder.glob("results-*.json"), *self.folder.glob("summaries-*")]:
                if old not in (self.file, self.summaries_file):
                    old.unlink(missing_ok=True)
            live_digests = {e[3] for p, e in self.stats.items() if p in live_paths or os.path.exists(p)}
            if self.dirty:
                self.stats = {p: e for p, e in self.stats.items() if e[3] in live_digests}
                self.results = {d: r for d, r in self.results.items() if d in live_digests}
                write_atomic(self.folder, self.file.name, {"stats": self.stats, "results": self.results})
            if self.summaries is not None:
                live = {d: s for d, s in self.summaries.items() if d in live_digests}
                if self.summaries_dirty or len(live) < len(self.summaries):
                    self.summaries = live
                    write_atomic(self.folder, self.summaries_file.name, live, marshal.dumps)
        except OSError:
            pass
