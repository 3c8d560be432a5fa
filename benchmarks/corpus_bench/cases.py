"""Case files: bug cases (a defect at one commit, its fix at another) and clean files.

Only the fields the scoring needs are kept; the rest (notes, labels, functions)
stay in the JSON for the reader. A malformed case is named with the field to fix.
Each case file is a split (the training cases, the cases mined from other servers),
scored and reported on its own so that one split's figures never blur another's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Span = tuple[int, int]
DETECTABILITY = ("S", "P", "N")  # N: no static rule can see it (a fuzzer target); scored apart


class CaseError(Exception):
    """The case file cannot be used as it is; the message names the case and the field."""


@dataclass(frozen=True)
class BugCase:
    id: str
    repo: str
    cls: str  # the main class, A..K
    detectability: str  # "S" syntactic, "P" partial/heuristic, "N" no static rule can see it
    path: str
    buggy_commit: str
    spans: tuple[Span, ...]
    fix_commit: str
    fix_span: tuple[Span, ...] | None  # None: the fix is not scored


@dataclass(frozen=True)
class CleanCase:
    id: str
    repo: str
    path: str
    commit: str
    justified: tuple[Span, ...]


Case = BugCase | CleanCase


@dataclass(frozen=True)
class Split:
    name: str  # the case file's stem: "train", "mined"
    source: Path
    cases: tuple[Case, ...]


def load_splits(paths: list[Path], wanted: list[str] | None = None) -> list[Split]:
    """One split per case file, in order, keeping only the `wanted` ids (all when None).

    Ids must be unique across files, since findings are filed by id. The first file
    is the training split and always stays, even if `wanted` leaves it empty; a
    further split left with no case is dropped.
    """
    splits, owner = [], {}
    for path in paths:
        split = Split(path.stem, path, tuple(load(path)))
        if any(s.name == split.name for s in splits):
            raise CaseError(f"{path}: two case files named {split.name!r}; each split needs its own file name")
        for case in split.cases:
            if case.id in owner:
                raise CaseError(f"{path}: case id {case.id!r} is also in {owner[case.id]}")
            owner[case.id] = path
        splits.append(split)
    if not wanted:
        return splits
    unknown = sorted(set(wanted) - set(owner))
    if unknown:
        raise CaseError(f"no case {', '.join(unknown)} in {', '.join(map(str, paths))}; "
                        f"their ids: {', '.join(owner)}")
    kept = [Split(s.name, s.source, tuple(c for c in s.cases if c.id in wanted)) for s in splits]
    return kept[:1] + [s for s in kept[1:] if s.cases]


def load(path: Path) -> list[Case]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CaseError(f"{path}: cannot read the case file ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise CaseError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, list):
        raise CaseError(f"{path}: expected a JSON list of cases")
    cases = [_case(path, index, item) for index, item in enumerate(data)]
    seen: set[str] = set()
    for case in cases:
        if case.id in seen:
            raise CaseError(f"{path}: case id {case.id!r} appears twice")
        seen.add(case.id)
    return cases


def _case(path: Path, index: int, item: Any) -> Case:
    where = f"{path}: case {index}"
    if not isinstance(item, dict):
        raise CaseError(f"{where}: expected an object")
    where = f"{where} ({item.get('id', '?')})"

    def text(key: str) -> str:
        value = item.get(key)
        if not isinstance(value, str) or not value:
            raise CaseError(f"{where}: '{key}' must be a non-empty string")
        return value

    repo = text("repo")
    if repo.count("/") != 1:
        raise CaseError(f"{where}: 'repo' must be OWNER/NAME, got {repo!r}")
    if item.get("kind") == "clean":
        notes = item.get("justified", [])
        if not isinstance(notes, list) or not all(isinstance(n, dict) for n in notes):
            raise CaseError(f"{where}: 'justified' must be a list of {{\"lines\": [s, e], \"note\": ...}}")
        justified = tuple(_span(where, "justified", n.get("lines")) for n in notes)
        return CleanCase(text("id"), repo, text("path"), text("commit"), justified)
    if item.get("kind") != "bug":
        raise CaseError(f"{where}: 'kind' must be \"bug\" or \"clean\"")
    detectability = text("detectability")
    if detectability not in DETECTABILITY:
        raise CaseError(f"{where}: 'detectability' must be \"S\", \"P\" or \"N\", got {detectability!r}")
    fix_span = item.get("fix_span")
    return BugCase(
        id=text("id"), repo=repo, cls=text("class"), detectability=detectability, path=text("path"),
        buggy_commit=text("buggy_commit"), spans=_spans(where, "spans", item.get("spans")),
        fix_commit=text("fix_commit"), fix_span=None if fix_span is None else _spans(where, "fix_span", fix_span),
    )


def _spans(where: str, key: str, value: Any) -> tuple[Span, ...]:
    if not isinstance(value, list) or not value:
        raise CaseError(f"{where}: '{key}' must be a non-empty list of [start, end]")
    return tuple(_span(where, key, v) for v in value)


def _span(where: str, key: str, value: Any) -> Span:
    if (not isinstance(value, list) or len(value) != 2 or not all(type(v) is int for v in value)
            or not 1 <= value[0] <= value[1]):
        raise CaseError(f"{where}: '{key}' has {value!r}; each span is [start, end], 1-based, start <= end")
    return value[0], value[1]
