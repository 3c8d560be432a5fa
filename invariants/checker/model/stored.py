"""Results of the package-wide step kept between runs, one JSON file per kind and configuration,
by a fingerprint of what they were computed from: an unchanged package is answered from it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mlx_invariants.checker.cache import prepare_folder, write_atomic


class Stored:
    """`file` (`<kind>-<configuration key>.json`, None: nothing kept) maps fingerprints to results;
    what this run neither read nor wrote is dropped when it saves, and so are the files of the same
    kind under other configurations."""

    def __init__(self, file: Path | None) -> None:
        self.file = file
        self.old: dict[str, Any] = {}
        self.new: dict[str, Any] = {}
        if self.file is not None:
            try:
                data = json.loads(self.file.read_text(encoding="utf-8"))
                self.old = data if isinstance(data, dict) else {}
            except (OSError, ValueError):
                pass

    def get(self, fingerprint: str) -> Any:
        found = self.old.get(fingerprint)
        if isinstance(found, dict):
            self.new[fingerprint] = found
            return found
        return None

    def put(self, fingerprint: str, result: dict[str, Any]) -> None:
        self.new[fingerprint] = result

    def save(self) -> None:
        if self.file is None or self.new == self.old:
            return
        kind = self.file.name.split("-", 1)[0]
        try:
            prepare_folder(self.file.parent)
            for old in self.file.parent.glob(f"{kind}-*.json"):
                if old != self.file:
                    old.unlink(missing_ok=True)
            write_atomic(self.file.parent, self.file.name, self.new)
        except OSError:
            pass
