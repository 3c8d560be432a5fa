"""docs/corpus.md: how to run, the scoring, the tables, and the HEAD findings with their verdicts.

The file is regenerated whole; the one thing a person writes in it, the verdict
column of "HEAD findings", is read back first and kept for every finding that is
still reported at the same commit, place, rule and (shortened) message. `--head-servers`
rewrites the HEAD findings section alone (`replace_head_section`), keeping the rest.
"""

from __future__ import annotations

import re
from pathlib import Path

from corpus_bench import report
from corpus_bench.cases import Split
from corpus_bench.head import HeadRun
from corpus_bench.loro import RepoScores
from corpus_bench.run import CRASH_MARK, Results
from corpus_bench.tools import FLAKE8_IGNORE, FLAKE8_SELECT, PINS, RUFF_SELECT

HEAD_TITLE = "## HEAD findings"
PROJECT = Path(__file__).resolve().parents[2]
SPLIT_TITLES = {"mined": "Mined cases (other MLX servers)", "omlx": "Held-out cases (jundot/omlx)",
                "heldout2": "Held-out cases (Blaizzy/mlx-audio, GradientHQ/parallax)",
                "heldout3": "Held-out cases (motsognirr/olmlx, tumma72/mlx-manager)",
                "heldout4": "Held-out cases (xorbitsai/inference, mudler/LocalAI)",
                "heldout5": "Held-out cases (huggingface/speech-to-speech, jamiepine/voicebox)",
                "heldout6": "Held-out cases (homelab-00/TranscriptionSuite)",
                "heldout7": "Held-out cases (transformerlab/transformerlab-api)",
                "heldout8": "Held-out cases (fblissjr/heylookitsanllm)",
                "heldout9": "Held-out cases (kashman001/local-model, decdees/LOcha, gdemerges/Benji)",
                "heldout10": "Held-out cases (andychoi/ai-mlx-server, BuildItCode/MLX-Server)",
                "heldout11": "Held-out cases (asher/gmlx, aperepel/claude-mlx-tts)",
                "heldout12": "Held-out cases (epheterson/immich-ml-metal)",
                "heldout13": "Held-out cases (unslothai/unsloth)",
                "heldout14": "Held-out cases (firstbatchxyz/dnet)",
                "heldout15": "Held-out cases (pipecat-ai/pipecat)",
                "heldout16": "Held-out cases (open-jarvis/OpenJarvis)",
                "heldout17": "Held-out cases (opendatalab/MinerU, opendatalab/mineru-vl-utils)",
                "heldout18": "Held-out cases (avalan-ai/avalan, lm-sys/FastChat)",
                "heldout19": "Held-out cases (vectorize-io/hindsight)",
                "heldout20": "Held-out cases (geeks-accelerator/ollama-herd)",
                "heldout21": "Held-out cases (docling-project/docling-serve, docling-project/docling-jobkit)",
                "heldout22": "Held-out cases (OpenSourceWTF/mtplx-moe)",
                "heldout23": "Held-out cases (ToPo-ToPo-ToPo/local-llm-server)",
                "heldout24": "Held-out cases (nodetool-ai/nodetool-core)",
                "heldout25": "Held-out cases (isair/jarvis)"}
# Splits whose per-case tables stay out of the doc, so that nobody tunes a rule on them while
# they are meant to measure rules that never saw them; stdout and --json of a run have them.
HELD_OUT_SPLITS = {"omlx", "heldout2", "heldout3", "heldout4", "heldout5", "heldout6", "heldout7",
                   "heldout8", "heldout9", "heldout10", "heldout11", "heldout12", "heldout13", "heldout14",
                   "heldout15", "heldout16", "heldout17", "heldout18", "heldout19",
                   "heldout20", "heldout21", "heldout22", "heldout23", "heldout24", "heldout25"}
_REPO_HEADING = re.compile(r"^### (\S+) @ ([0-9a-f]+)")
_PIPE = re.compile(r"(?<!\\)\|")
_LOCATION = re.compile(r"^`?[^`\s]+:\d+`?$")
_RULE = re.compile(r"^INV\d{3}$")
VerdictKey = tuple[str, str, str, str, str]  # repo, commit (12), path:line, rule, shortened message


def short_message(message: str, limit: int = 160) -> str:
    """The message up to its first ": " outside backticks (what is wrong, not the remedy), at most `limit`
    characters; shortening a shortened message changes nothing."""
    ticks = 0
    for index, char in enumerate(message):
        if char == "`":
            ticks += 1
        elif char == ":" and not ticks % 2 and message[index + 1:index + 2] == " ":
            message = message[:index]
            break
    if len(message) <= limit:
        return message
    cut = message[:limit - 1]
    return (cut[:cut.rindex(" ")] if " " in cut[limit // 2:] else cut) + "\u2026"


REPLAYED = "replayed:"


def verdict_key(repo: str, commit: str, location: str, rule: str, message: str) -> VerdictKey:
    return repo, commit[:12], location.strip("`"), rule, short_message(message)


def read_verdicts(path: Path) -> dict[VerdictKey, str]:
    """The non-empty verdicts of an existing doc's HEAD findings tables: rows of `repo | commit | location | rule
    | message | verdict`, or of the older `location | rule | message | verdict` under a `### repo @ commit`."""
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
        if len(cells) == 4 and heading:
            cells = [*heading, *cells]
        if len(cells) != 6 or not _LOCATION.match(cells[2]) or not _RULE.match(cells[3]):
            continue
        if cells[5] and not set(cells[5]) <= set("-:"):
            verdicts[verdict_key(*cells[:5])] = cells[5]
    return verdicts


def replace_head_section(text: str, section: list[str]) -> str:
    """`text` (a whole doc) with its HEAD findings section, which runs to the end, replaced by `section`."""
    lines = text.splitlines()
    kept = lines[:lines.index(HEAD_TITLE)] if HEAD_TITLE in lines else [*lines, ""] if lines else []
    return "\n".join([*kept, *section]).rstrip("\n") + "\n"


def head_section(runs: list[HeadRun], verdicts: dict[VerdictKey, str], meta: dict[str, str] | None = None) -> list[str]:
    repos = [run.repo for run in runs]
    width = max(map(len, repos), default=0)
    ran = "" if not meta else (
        f"Run {meta['date']} on {meta['machine']}, the checker at {meta['commit']}"
        + (f", as `{meta['command']}`" if meta.get("command") else "") + ". ")
    lines = [HEAD_TITLE, "",
             "`invariants check` on the Python package of each of these MLX servers at the commit recorded in "
             "`benchmarks/corpus_bench/head.py` (`SERVERS`): the package folders exported with `git archive` into a "
             "temporary folder, with the project metadata of each folder from the repository's top down to them (the "
             "MLX versions the server admits, by which the checker judges the findings true only on some versions: "
             "docs/checker.md, \"MLX version\"), and checked in one run per server, with the default configuration plus the "
             "server's `exclude` (vendored third-party code, example scripts and the tests kept inside a package, "
             "as its maintainers would configure it; no tests are checked). `--head-servers` runs this section "
             "alone and rewrites only it (`--checker-at HEAD`: the committed rules, as the before-studied runs "
             "use them); `--head` adds it to a whole run. `--head-jsonl FILE` writes each finding as one JSON "
             "line (id `repo:path:line:rule`, commit, path, line, rule, the whole message, and the first and "
             "last line of the def, else class, else top-level statement around it) for adjudication. " + ran
             + "The verdict column is for a reviewer (true positive, arguable, false positive, and why); "
             "regenerating keeps each verdict whose finding is still reported at the same commit, place, rule and "
             "shortened message. The message column is cut at its remedy.", "",
             "```",
             *(f"git clone --mirror https://github.com/{r:<{width}}  $MIRRORS/{r.replace('/', '+')}" for r in repos),
             ".venv/bin/python benchmarks/corpus.py --head-servers --checker-at HEAD --write docs/corpus.md "
             "--head-jsonl /tmp/head_findings.jsonl",
             "```", ""]
    given = [verdicts.get(verdict_key(run.repo, run.commit, f"{path}:{f.line}", f.rule, f.message), "")
             for run in runs for path, f in run.findings]
    if given:
        # "arguable" counts as false, as the target does.
        true = sum(v.startswith("true positive") for v in given)
        # A verdict is read from the code; "replayed:" in it names a standalone reproducer that showed the bug.
        replayed = sum(v.startswith("true positive") and REPLAYED in v for v in given)
        lines += [f"Verdicts: {true} of {len(given)} findings are true positives ({100 * true / len(given):.0f} %), "
                  f"{replayed} of them replayed by a standalone reproducer (the verdict names it, after "
                  f"`{REPLAYED}`), {sum(not v for v in given)} without a verdict yet.", ""]
    rules = sorted({f.rule for run in runs for _, f in run.findings})
    rows = [[f"`{run.repo}`", f"`{run.commit[:12]}`", ", ".join(f"`{p}/`" for p in run.packages),
             ", ".join(f"`{e}`" for e in run.exclude) or "-", run.files, len(run.findings), f"{run.seconds:.1f}"]
            for run in runs]
    total_seconds = sum(run.seconds for run in runs)
    rows.append(["all", "", "", "", sum(r.files for r in runs), sum(len(r.findings) for r in runs),
                 f"{total_seconds:.1f}"])
    lines += [*report.table(["server", "commit", "packages", "excluded", "files", "findings", "seconds"], rows,
                            right={4, 5, 6}), ""]
    if rules:
        by_rule = [[rule, sum(f.rule == rule for run in runs for _, f in run.findings),
                    ", ".join(f"{run.repo} {n}" for run in runs
                              for n in [sum(f.rule == rule for _, f in run.findings)] if n)] for rule in rules]
        lines += [*report.table(["rule", "findings", "by server"], by_rule, right={1}), ""]
    crashes = [c for run in runs for c in run.crashes()]
    unread = [f"{run.repo}@{run.commit[:12]} `{path}:{f.line}`: {f.message}" for run in runs
              for path, f in run.findings if f.rule == "INV000" and CRASH_MARK not in f.message]
    if crashes or unread:
        lines += ["INV000 (the checker failed on a file, or could not read it):", "",
                  *(f"- {c}" for c in crashes + unread), ""]
    for run in runs:
        commit = run.commit[:12]
        excluded = (f"; excluded: {', '.join(f'`{e}`' for e in run.exclude)}"
                    + (f" ({run.note})" if run.note else "")) if run.exclude else ""
        lines += [f"### {run.repo} @ {commit}", "",
                  f"Packages: {', '.join(f'`{p}/`' for p in run.packages)}{excluded}; "
                  + (f"MLX admitted: {run.pins}; " if run.pins else "")
                  + f"{run.files} files checked in "
                  f"{run.seconds:.1f} s; {len(run.findings)} finding{'s' if len(run.findings) != 1 else ''}.", ""]
        rows = [[run.repo, commit, f"`{path}:{f.line}`", f.rule, short_message(f.message),
                 verdicts.get(verdict_key(run.repo, commit, f"{path}:{f.line}", f.rule, f.message), "")]
                for path, f in run.findings]
        lines += [*(report.table(["repo", "commit", "location", "rule", "message", "verdict"], rows) if rows
                    else ["No findings."]), ""]
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
             versions: dict[str, str], verdicts: dict[VerdictKey, str], by_repo: list[RepoScores] | None = None,
             timing: list[str] | None = None) -> str:
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
        "they flag every `except Exception`, not cancellation handling. `--head` adds the HEAD findings of ten "
        "MLX servers at recorded commits (their own section, below, says how; `--head-servers` runs that alone).",
        "",
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
        "repository path, with the other `.py`/`.pyi` files of its folder, every `.py`/`.pyi` file of the package "
        "it belongs to (the folder of its topmost `__init__.py`) and the `__init__.py` of each parent package at "
        "the same commit. `invariants check` is given that whole tree, as a maintainer runs it on a package "
        "(`invariants check pkg/`): its package-wide model follows calls into the other modules, and the "
        "unreferenced-def step reads them (docs/checker.md). The baselines, per-file tools, are given the file. "
        "Only findings in the file under test are scored. `--scope file` gives the checker the file alone, as "
        "this doc did until the sixth session of 2026-11-28 (it cost the model every reach into another module: "
        "V21 and OM95 are detected only with their package). **Detected**: some finding in the buggy "
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
    crashes = [c for _, r in runs for c in r.crashes]  # the HEAD servers' are listed in their own section
    if crashes:
        lines += ["## Checker failures", "", *(f"- {c}" for c in crashes), ""]
    lines += timing or []
    if head is not None:
        lines += head_section(head, verdicts, meta)
    return "\n".join(lines).rstrip("\n") + "\n"
