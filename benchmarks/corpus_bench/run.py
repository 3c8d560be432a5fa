"""One benchmark run: lay out every case's file at its commits, run each tool once, score.

Every case gets its own temporary tree per side (buggy, fix, clean), so files of two
commits never mix; the trees are removed when the run ends.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from corpus_bench import mirrors, scoring, tools
from corpus_bench.cases import BugCase, Case, CleanCase
from corpus_bench.checker_at import CheckerTree
from corpus_bench.tools import Finding

CRASH_MARK = "the checker failed on it"


@dataclass
class Results:
    tools: tuple[str, ...]
    split: str = ""  # the split's name in headings and summary lines; "" for the main (training) split
    bugs: dict[str, list[scoring.BugScore]] = field(default_factory=dict)  # by tool, in case order
    cleans: dict[str, list[scoring.CleanScore]] = field(default_factory=dict)
    # by tool, case id and side ("buggy", "fix", "clean"): every finding in the file under test
    findings: dict[str, dict[str, dict[str, list[Finding]]]] = field(default_factory=dict)
    crashes: list[str] = field(default_factory=list)  # "repo@commit path: message" of each checker failure
    checker: CheckerTree | None = None  # the commit whose checker ran; None: this checkout's


def open_mirrors(root: Path, repos: set[str]) -> dict[str, mirrors.Mirror]:
    """Every repository's mirror; all the missing ones are named in one error."""
    found, missing = {}, []
    for repo in sorted(repos):
        try:
            found[repo] = mirrors.find(root, repo)
        except mirrors.MirrorError as exc:
            missing.append(str(exc))
    if missing:
        raise mirrors.MirrorError("\n".join(missing))
    return found


def sides(case: Case) -> dict[str, str]:
    """side -> commit of the file under test."""
    if isinstance(case, BugCase):
        return {"buggy": case.buggy_commit, "fix": case.fix_commit}
    return {"clean": case.commit}


# What the checker is given for a case: the tree laid out around the file under test (its folder and its package,
# mirrors.materialise), as a maintainer runs `invariants check pkg/`, or the file alone. Only the findings in the
# file are scored either way; the baselines, per-file tools, always get the file.
SCOPES = ("package", "file")


def run_cases(cases: list[Case], mirror_root: Path, tool_names: tuple[str, ...], venv: Path | None,
              split: str = "", checker: CheckerTree | None = None, scope: str = "package") -> Results:
    """Every case scored by each tool; the checker is this checkout's, or `checker`'s commit's, run on each
    case's file or on its laid-out package (`scope`)."""
    repos = open_mirrors(mirror_root, {c.repo for c in cases})
    results = Results(tool_names, split, checker=checker)
    with tempfile.TemporaryDirectory(prefix="invariants-corpus-") as tmp:
        root = Path(tmp).resolve()
        placed: dict[tuple[str, str], Path] = {}
        trees: list[Path] = []
        for index, case in enumerate(cases):
            for side, commit in sides(case).items():
                tree = root / f"{index:02d}-{side}"
                placed[case.id, side] = repos[case.repo].materialise(commit, case.path, tree).resolve()
                trees.append(tree.resolve())
        for tool in tool_names:
            given = trees if tool == "invariants" and scope == "package" else list(placed.values())
            found = tools.run(tool, given, root, venv, checker)
            results.findings[tool] = {}
            for (case_id, side), path in placed.items():
                results.findings[tool].setdefault(case_id, {})[side] = found.get(path, [])
            _score(results, tool, cases)
    for case in cases:
        for side, commit in sides(case).items():
            for finding in results.findings["invariants"][case.id][side]:
                if finding.rule == "INV000" and CRASH_MARK in finding.message:
                    results.crashes.append(f"{case.repo}@{commit} {case.path}: {finding.message}")
    return results


def _score(results: Results, tool: str, cases: list[Case]) -> None:
    found = results.findings[tool]
    results.bugs[tool] = [scoring.score_bug(c, found[c.id]["buggy"], found[c.id]["fix"])
                          for c in cases if isinstance(c, BugCase)]
    results.cleans[tool] = [scoring.score_clean(c, found[c.id]["clean"]) for c in cases if isinstance(c, CleanCase)]
