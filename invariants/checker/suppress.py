"""Inline suppressions, scoped to one statement.

    await asyncio.to_thread(step)  # invariants: ignore[INV105] the owner thread drains it
    await asyncio.to_thread(step)  # noqa: INV105

A comment suppresses findings of the statement whose lines it is on (for a
compound statement: its header), or of the statement right below a block of
comment lines it belongs to. `# invariants: ignore` with no ids suppresses every
rule there; a bare `# noqa` suppresses nothing, because other linters own it.
"""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass

_MARK = re.compile(
    r"#\s*(?:invariants:\s*ignore(?:\[(?P<ids>[^\]]*)\])?|noqa\s*:\s*(?P<noqa>[A-Za-z]+\d+(?:\s*,\s*[A-Za-z]+\d+)*))",
    re.IGNORECASE,
)
_ID = re.compile(r"INV\d{3}", re.IGNORECASE)
_OURS = re.compile(r"invariants|INV\d{3}", re.IGNORECASE)


@dataclass(frozen=True)
class Suppression:
    line: int
    ids: frozenset[str] | None  # None: every rule
    own_line: bool  # the comment is alone on its line

    def covers(self, rule: str) -> bool:
        return self.ids is None or rule in self.ids


def scan(text: str) -> list[Suppression]:
    """Every suppression comment in the file (cheap: most files have none)."""
    if "invariants" not in text and "noqa" not in text and "NOQA" not in text:
        return []
    # A line can only suppress if it names the checker or one of its ids: `# noqa: E501` cannot, and
    # most files with a `noqa` have only such lines, so they are not tokenized (a tenth of a second
    # on vllm-mlx).
    candidates = [(number, line, match) for number, line in enumerate(text.splitlines(), start=1)
                  if "#" in line and (match := _MARK.search(line)) is not None and _OURS.search(line)]
    if not candidates:
        return []
    comments = _comments(text)
    found = []
    for number, line, match in candidates:
        if comments is not None:
            match = _MARK.search(comments.get(number, ""))  # a marker quoted in a string is no suppression
            if match is None:
                continue
        if match.group("noqa") is not None:
            ids = frozenset(i.upper() for i in _ID.findall(match.group("noqa")))
            if not ids:
                continue
        elif match.group("ids") is not None:
            ids = frozenset(i.upper() for i in _ID.findall(match.group("ids")))
        else:
            ids = None
        found.append(Suppression(number, ids, line.lstrip().startswith("#")))
    return found


def _comments(text: str) -> dict[int, str] | None:
    """Each line's real comment, from the tokenizer; None when the file does not tokenize."""
    comments = {}
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT:
                comments[token.start[0]] = token.string
    except (tokenize.TokenError, SyntaxError):
        return None
    return comments


def comment_block_above(lines: list[str], first: int) -> range:
    """Line numbers of the comment-only lines directly above line `first` (1-based)."""
    top = first
    while top > 1 and lines[top - 2].lstrip().startswith("#"):
        top -= 1
    return range(top, first)


def covering(suppressions: list[Suppression], rule: str, span: tuple[int, int], above: range) -> Suppression | None:
    """The suppression that silences `rule` for a finding whose statement covers `span`."""
    start, end = span
    for sup in suppressions:
        if sup.covers(rule) and (start <= sup.line <= end or (sup.own_line and sup.line in above)):
            return sup
    return None
