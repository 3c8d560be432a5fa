"""Glob matching of dotted names, for the names a user configures (`lock-names`, `model-names`, `event-names`, ...).

Its own module because the rules and the analysis helpers match names while
`config` imports the rule registry: with `matches_name` in `config` the two
imported each other.
"""

from __future__ import annotations

import fnmatch


def matches_name(text: str | None, patterns: list[str]) -> bool:
    """True when `text` or its last dotted part matches one of the globs."""
    if not text:
        return False
    low = text.lower()
    last = low.rsplit(".", 1)[-1]
    return any(fnmatch.fnmatchcase(low, p.lower()) or fnmatch.fnmatchcase(last, p.lower()) for p in patterns)
