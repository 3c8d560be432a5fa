"""Glob matching of dotted names, for the names a user configures (`lock-names`, `model-names`, `event-names`, ...).

Its own module because the rules and the analysis helpers match names while
`config` imports the rule registry: with `matches_name` in `config` the two
imported each other.
"""

from __future__ import annotations

import fnmatch
import re

# One pattern per list of globs, by its contents: the rules ask `model-names` for most calls of a file (16 000
# times on vllm-mlx), and fnmatch lower-cased and looked up each glob at every ask.
_COMPILED: dict[tuple[str, ...], re.Pattern[str]] = {}


def matches_name(text: str | None, patterns: list[str]) -> bool:
    """True when `text` or its last dotted part matches one of the globs."""
    if not text:
        return False
    key = tuple(patterns)
    compiled = _COMPILED.get(key)
    if compiled is None:
        # fnmatchcase(name, glob) is re.match(fnmatch.translate(glob), name); one alternation asks them all.
        compiled = _COMPILED[key] = re.compile("|".join(fnmatch.translate(p.lower()) for p in key) or "(?!)")
    low = text.lower()
    return compiled.match(low) is not None or compiled.match(low.rsplit(".", 1)[-1]) is not None
