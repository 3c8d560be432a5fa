"""docs/corpus.md: how to run, the scoring, the tables, and the HEAD findings with their verdicts.

The file is regenerated whole; the one thing a person writes in it, the verdict
column of "HEAD findings", is read back first and kept for every finding that is
still reported at the same commit, place, rule and message.
"""

from __future__ import annotations

import re
from pathlib import Path

from corpus_bench import report
from corpus_bench.cases import Split
from corpus_bench.head import HeadRun
from corpus_bench.loro import RepoScores
from corpus_bench.run import Results
from corpus_bench.tools import FLAKE8_IGNORE, FLAKE8_SELECT, PINS, RUFF_SELECT

HEAD_TITLE = "## HEAD findings"
PROJECT = Path(__file__).resolve().parents[2]
SPLIT_TITLES = {"mined": "Mined cases (other MLX servers)", "omlx": "Held-out cases (jundot/omlx)"}
# Splits whose per-case tables stay out of the doc, so that nobody tunes a rule on them while
# they are meant to measure rules that never saw them; stdout and --json of a run have them.
HELD_OUT_SPLITS = {"omlx"}
_REPO_HEADING = re.compile(r"^### (\S+) @ ([0-9a-f]+)")
_PIPE = re.compile(r"(?<!\\)\|")
VerdictKey = tuple[str, str, str, str, str]  # repo, commit, path:line, rule, message


def read_verdicts(path: Path) -> dict[VerdictKey, str]:
    """The non-empty verdicts of an existing doc's HEAD findings tables."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return {}
    verdicts: dict[VerdictKey, str] = {}
    heading = None
    for line in lines[lines.index(HEAD_TITLE) + 1:] if HEAD_TITLE in lines else []:
        match = _REPO_HEADING.match(line)
        if match:
            heading = match.groups()
            continue
        cells = [c.strip().replace("\\|", "|") for c in _PIPE.split(line.strip())[1:-1]]
        if heading and len(cells) == 4 and cells[3] and not set(cells[3]) <= set("-:"):
            verdicts[(*heading, cells[0].strip("`"), cells[1], cells[2])] = cells[3]
    return verdicts


def head_section(runs: list[HeadRun], verdicts: dict[VerdictKey, str]) -> list[str]:
    lines = [HEAD_TITLE, "",
             "`invariants check` (default configuration) on the newest commit of each mirror's default branch, "
             "package folders only. The verdict column is for a reviewer (true bug, acceptable, false positive, "
             "and why); regenerating the doc keeps each verdict whose finding is still reported at the same commit.",
             ""]
    given = [verdicts.get((run.repo, run.commit[:12], f"{path}:{f.line}", f.rule, f.message), "")
             for run in runs for path, f in run.findings]
    if given:
        # "arguable" counts as false, as the target does.
        true = sum(v.startswith("true positive") for v in given)
        lines += [f"Verdicts: {true} of {len(given)} findings are true positives ({100 * true / len(given):.0f} %), "
                  f"{sum(not v for v in given)} without a verdict yet.", ""]
    for run in runs:
        commit = run.commit[:12]
        lines += [f"### {run.repo} @ {commit}", "",
                  f"Packages: {', '.join(f'`{p}/`' for p in run.packages)} ({run.files} files); "
                  f"{len(run.findings)} finding{'s' if len(run.findings) != 1 else ''}.", ""]
        rows = [[f"`{path}:{f.line}`", f.rule, f.message,
                 verdicts.get((run.repo, commit, f"{path}:{f.line}", f.rule, f.message), "")]
                for path, f in run.findings]
        lines += [*(report.table(["location", "rule", "message", "verdict"], rows) if rows else ["No findings."]), ""]
    return lines


def _shown(path: Path) -> str:
    try:
        return path.resolve().relative_to(PROJECT).as_posix()
    except ValueError:
        return str(path)


def _repos(split: Split) -> str:
    return ", ".join(f"`{r}`" for r in sorted({c.repo for c in split.cases}))


def by_repository(scores: list[RepoScores], baselines: tuple[str, ...]) -> list[str]:
    """The leave-one-repository-out section: the table, the clean files, and which commit stood for each repository."""
    lines = [
        "## By repository (leave-one-repository-out)", "",
        "Each repository's cases scored by the checker as it stood before anyone here studied that repository's "
        "cases (**before**: the checker of that commit of this project, run from its own tree with "
        "`--checker-at`'s machinery), by today's checker (**today**), and by the baselines. A rule tuned on a "
        "case and scored on the same case measures memory, not the rule, so *before* is the generalisation "
        "figure; it is a held-out one only for the repositories marked held out below. Bug cases are counted "
        "S / P / N; N cases (no static rule can see them, fuzzer targets) are in no detection column and are "
        "scored for silence at the fix like the rest. `-`: nothing to count.", "",
        *report.repo_table(scores, baselines), "",
        "Findings on clean files, by repository:", "",
        *report.repo_clean_table(scores, baselines), "",
        "The before-studied commit of each repository:", "",
    ]
    seen: dict[str, list[RepoScores]] = {}
    for s in scores:
        if s.checker is not None:
            seen.setdefault(s.checker.commit, []).append(s)
    for group in seen.values():
        first = group[0]
        names = ", ".join(f"`{s.repo}`" for s in group)
        subject = first.checker.subject if len(first.checker.subject) <= 80 else first.checker.subject[:77] + "..."
        lines.append(f"- {names}: `{first.checker.short}` ({first.checker.date}, \"{subject}\"), "
                     f"{first.studied.why}. Its rules: {', '.join(first.rules) or 'none listed'}.")
    missing = [s.repo for s in scores if s.checker is None]
    if missing:
        lines.append(f"- {', '.join(f'`{r}`' for r in missing)}: no before-studied commit declared "
                     "(`benchmarks/corpus_bench/loro.py`, or `--before-studied REPO=COMMIT`).")
    training = [s.repo for s in scores if s.studied is not None and not s.studied.held_out]
    if training:
        lines += ["", f"Plainly: the rules were grown on {', '.join(f'`{r}`' for r in training)} from the start, "
                  "so no checker of this project ever stood before studying them; their *before* figure is the "
                  "earliest checker's, not a held-out score, and only the held-out rows measure generalisation."]
    crashes = [c for s in scores for c in s.crashes]
    if crashes:
        lines += ["", "The before-studied checkers failed on these files (INV000):", "", *(f"- {c}" for c in crashes)]
    return lines + [""]


def held_out_figures(results: Results, versions: dict[str, str]) -> list[str]:
    """A held-out split in the doc: its summary only."""
    return ["```", *(report.summary_line(results, t) for t in results.tools), "```", "",
            *report.summary_table(results, versions), "",
            "Held out: the per-case tables of this split are left out of this doc so that no rule is tuned on "
            "them; a run prints them on stdout and `--json` writes them.", ""]


def figures(results: Results, versions: dict[str, str], level: str) -> list[str]:
    """The summary lines and every table of one split, under headings of the given level."""
    lines = ["```", *(report.summary_line(results, t) for t in results.tools), "```", "",
             *report.summary_table(results, versions), "",
             f"{level} By class", "", *report.class_table(results), "",
             f"{level} Bug cases (invariants)", "", *report.case_table(results), ""]
    if len(results.tools) > 1:
        lines += [f"{level} Bug cases, side by side", "", *report.comparison_table(results), ""]
    return lines + [f"{level} Clean files", "", *report.clean_table(results), "",
                    "The checker's findings on clean files:", "", *report.clean_findings(results), "",
                    f"{level} Every finding of the checker, per bug case", "", *report.details_table(results), ""]


def document(runs: list[tuple[Split, Results]], head: list[HeadRun] | None, meta: dict[str, str],
             versions: dict[str, str], verdicts: dict[VerdictKey, str], by_repo: list[RepoScores] | None = None) -> str:
    """The whole doc; the first split is the training split the targets are judged on, the others follow apart."""
    pins = ", ".join(f"{name} {version}" for name, version in PINS.items())
    (main, results), others = runs[0], runs[1:]
    repos = sorted({c.repo for split, _ in runs for c in split.cases})
    width = max(map(len, repos), default=0)
    also = "".join(f" The cases of `{_shown(split.source)}` ({_repos(split)}) are scored the same way, reported "
                   "apart" + (", held out (no per-case tables here)," if split.name in HELD_OUT_SPLITS else ",")
                   + " and not part of the targets." for split, _ in others)
    lines = [
        "# Real-bug corpus benchmark", "",
        "<!-- Generated by benchmarks/corpus.py (the command below). Edit only the verdict column of "
        "\"HEAD findings\": a regeneration keeps those and rewrites the rest. -->", "",
        f"How `invariants check` does on real historical concurrency bugs of MLX servers ({_repos(main)}), "
        "and how much it reports on files reviewers judged correct, side by side with flake8-async and ruff's "
        "asyncio rules. The checker was built from this project's own fixtures; this is the bar of real code. "
        f"The training cases (ids, commits, paths, spans, classes, notes) are in `{_shown(main.source)}`; the "
        f"issue's targets are judged on them alone.{also} The code the cases point at is read from local git "
        "mirrors into a temporary folder and never kept in this repository.", "",
        "## How to run", "",
        "```",
        *(f"git clone --mirror https://github.com/{r:<{width}}  $MIRRORS/{r.replace('/', '+')}" for r in repos),
        ".venv/bin/python benchmarks/corpus.py --mirrors $MIRRORS               # tables on stdout",
        ".venv/bin/python benchmarks/corpus.py --head --checker-at HEAD --write docs/corpus.md   # this file",
        ".venv/bin/python benchmarks/corpus.py --no-baselines --case V7 --case FP05   # the checker only, two cases",
        ".venv/bin/python benchmarks/corpus.py --checker-at f48abc9 --no-loro          # a past commit's rules",
        "```", "",
        "`--mirrors` defaults to `$MLX_INVARIANTS_MIRRORS`, then `/work/.mirror` (a mirror is found at "
        "`OWNER+NAME/` or `OWNER+NAME/repo/`, as `fetch` lays it out); a missing mirror stops the run "
        "(exit 2) with the clone command. `--cases FILE` (repeatable) replaces the case files; each file is "
        "its own split, the first one the training split. `--json FILE` writes every finding and score. The "
        f"baselines are installed on first use into a throwaway venv (`--tools-venv`, pinned: {pins}); "
        f"`--no-baselines` skips them. flake8 runs as `flake8 --isolated --select {FLAKE8_SELECT} "
        f"--extend-ignore {FLAKE8_IGNORE} --asyncio` (ASYNC9xx are opt-in trio-style checkpoint rules); ruff as "
        f"`ruff check --isolated --select {RUFF_SELECT}`: its flake8-async port plus RUF006 (a dropped "
        "`create_task` result), its one other asyncio rule. Broad-except rules (BLE001, S110) were left out: "
        "they flag every `except Exception`, not cancellation handling. `--head` lists the HEAD findings of the "
        "training split's repositories only.", "",
        "`--checker-at COMMIT` scores with the checker of a commit of this project's history instead of this "
        "checkout's (this file uses `HEAD`: the committed rules, without a working tree's uncommitted edits): "
        "`git archive COMMIT` into a temporary folder, its packages laid out as that commit's "
        "`pyproject.toml` maps them (`[tool.setuptools.package-dir]`, e.g. `invariants/` -> `mlx_invariants`; "
        "the early commits' top-level packages as they are), run through that commit's own `invariants` script "
        "entry with only that tree on `PYTHONPATH` (`--checker-repo DIR` reads the commits from another clone; "
        "a shallow clone needs `git fetch --unshallow`). The same machinery scores each repository's cases "
        "with the checker of the commit that stood before its cases were studied "
        "(`benchmarks/corpus_bench/loro.py` names one per repository; `--before-studied OWNER/NAME=COMMIT` "
        "replaces one, `--no-loro` skips these runs).", "",
        "## Scoring", "",
        "As the corpus defines it. Each file is checked at its commit in a temporary tree that keeps its "
        "repository path, with the other `.py`/`.pyi` files of its folder and the `__init__.py` of each parent "
        "package at the same commit; only the file under test is scored. **Detected**: some finding in the buggy "
        "file lies within a span widened by ±3 lines. **Silent at fix**: no finding in the fixed file lies inside "
        "`fix_span` (not widened); a case whose `fix_span` is null is not scored for this. **Clean files**: every "
        "finding counts; one inside a `justified` span (±3 lines) is also counted as justified. S: a syntactic "
        "rule can match the defect; P: partial or heuristic; N: no static rule can see it (a fuzzer target), in no "
        "detection figure but scored for silence at the fix.", "",
        "## Figures", "",
        f"Run {meta['date']} on {meta['machine']}, this project at {meta['commit']}"
        + (f", as `{meta['command']}`" if meta.get("command") else "") + "; "
        f"the checker's rules: {meta['rules']}. Training split: {len(results.bugs['invariants'])} bug cases and "
        f"{len(results.cleans['invariants'])} clean files.", "",
        *figures(results, versions, "###"),
    ]
    for split, other in others:
        lines += [f"## {SPLIT_TITLES.get(split.name, f'Split `{split.name}`')}", "",
                  f"{len(other.bugs['invariants'])} bug cases and {len(other.cleans['invariants'])} clean files "
                  f"from {_repos(split)} (`{_shown(split.source)}`), scored exactly as the training split and "
                  "kept out of its figures and targets.", "",
                  *(held_out_figures(other, versions) if split.name in HELD_OUT_SPLITS
                    else figures(other, versions, "###"))]
    if by_repo:
        lines += by_repository(by_repo, tuple(t for t in results.tools if t != "invariants"))
    crashes = [c for _, r in runs for c in r.crashes] + [c for run in head or [] for c in run.crashes()]
    if crashes:
        lines += ["## Checker failures", "", *(f"- {c}" for c in crashes), ""]
    if head is not None:
        lines += head_section(head, verdicts)
    return "\n".join(lines).rstrip("\n") + "\n"
