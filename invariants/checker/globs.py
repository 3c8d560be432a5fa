"""Glob matching of dotted names, for the names a user configures (`lock-names`, `model-names`, `event-names`, ...).

Its own module because the rules and the analysis helpers match names while
`config` imports the rule registry: with `matches_name` in `config` the two
imported each other.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable

# One pattern per list of globs, by its contents: the rules ask `model-names` for most calls of a file (16 000
# times on vllm-mlx), and fnmatch lower-cased and looked up each glob at every ask.
_COMPILED: dict[tuple[str, ...], Callable[[str | None], bool]] = {}


def matcher(patterns: list[str]) -> Callable[[str | None], bool]:
    """`matches_name` for one list of globs, compiled once (the package model keeps one per setting)."""
    key = tuple(patterns)
    found = _COMPILED.get(key)
    if found is None:
        # fnmatchcase(name, glob) is re.match(fnmatch.translate(glob), name); one alternation asks them all.
        match = re.compile("|".join(fnmatch.translate(p.lower()) for p in key) or "(?!)").match

        def matches(text: str | None) -> bool:
            if not text:
                return False
            low = text.lower()
            return match(low) is not None or match(low.rsplit(".", 1)[-1]) is not None

        found = _COMPILED[key] = matches
    return found


def matches_name(text: str | None, patterns: list[str]) -> bool:
    """True when `text` or its last dotted part matches one of the globs."""
    return matcher(patterns)(text)
