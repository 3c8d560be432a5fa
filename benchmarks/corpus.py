"""Score `invariants check` on the real-bug corpus, side by side with flake8-async and ruff.

Each case's file is laid out at its buggy and fix commits (or its one commit, for a
clean file) from local bare git mirrors, with its folder and package; every tool runs
once over all of them (the checker over the laid-out packages, as `invariants check pkg/`
runs, `--scope file` over the files alone; the baselines over the files), and the
findings in each case's file are scored as the corpus defines it (docs/corpus.md):

    .venv/bin/python benchmarks/corpus.py                                 # tables on stdout
    .venv/bin/python benchmarks/corpus.py --head --write docs/corpus.md   # the doc
    .venv/bin/python benchmarks/corpus.py --no-baselines --case V7        # the checker, one case
    .venv/bin/python benchmarks/corpus.py --checker-at f48abc9 --no-loro   # the rules of a past commit
    .venv/bin/python benchmarks/corpus.py --head-servers --checker-at HEAD --write docs/corpus.md \
        --head-jsonl /tmp/head_findings.jsonl                              # the HEAD findings section alone

The training cases (train.json), the cases mined from other MLX servers (mined.json),
the held-out cases of jundot/omlx (omlx.json), those of Blaizzy/mlx-audio and
GradientHQ/parallax (heldout2.json), those of motsognirr/olmlx and tumma72/mlx-manager
(heldout3.json), those of xorbitsai/inference and mudler/LocalAI (heldout4.json), those
of huggingface/speech-to-speech and jamiepine/voicebox (heldout5.json), those of
homelab-00/TranscriptionSuite (heldout6.json), those of transformerlab/transformerlab-api
(heldout7.json), those of fblissjr/heylookitsanllm (heldout8.json), those of
kashman001/local-model, decdees/LOcha and gdemerges/Benji (heldout9.json), those of
andychoi/ai-mlx-server and BuildItCode/MLX-Server (heldout10.json), those of asher/gmlx and
aperepel/claude-mlx-tts (heldout11.json), those of epheterson/immich-ml-metal (heldout12.json),
those of unslothai/unsloth (heldout13.json), those of firstbatchxyz/dnet (heldout14.json), those of
pipecat-ai/pipecat (heldout15.json), those of open-jarvis/OpenJarvis (heldout16.json), those of
opendatalab/MinerU and opendatalab/mineru-vl-utils (heldout17.json), those of avalan-ai/avalan and
lm-sys/FastChat (heldout18.json), those of vectorize-io/hindsight (heldout19.json), those of
geeks-accelerator/ollama-herd (heldout20.json), those of docling-project/docling-serve and
docling-project/docling-jobkit (heldout21.json), those of OpenSourceWTF/mtplx-moe (heldout22.json), those of
ToPo-ToPo-ToPo/local-llm-server (heldout23.json), those of nodetool-ai/nodetool-core (heldout24.json) and those
of isair/jarvis (heldout25.json) are twenty-seven splits: each is scored and reported on its own,
and the targets are judged on the training split alone.

Leave-one-repository-out: each repository's cases are scored again by the checker
of the commit of this project that stood before anyone studied them (loro.py names
it per repository; `--before-studied REPO=COMMIT` changes one), run from that
commit's own tree (`git archive`, checker_at.py), beside today's figures.

`--head` also checks ten MLX servers' packages at the commits recorded in
corpus_bench/head.py and lists every finding, and with --write adds the speed figures of
bench_check's floor comparison (corpus_bench/speed.py); `--head-servers` does only the servers (no
cases, baselines or before-studied runs) and, with --write, rewrites only the doc's
HEAD findings section.

Exit 0 when the run completed (whatever the figures), 2 on a usage or setup
mistake: a missing mirror, commit or case, a malformed case file, a tool that
cannot run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from corpus_bench import cases as case_file
from corpus_bench import checker_at, doc, head, loro, mirrors, report, run, scoring, speed, tools

HERE = Path(__file__).resolve().parent
DEFAULT_CASES = [HERE / "corpus_bench" / "cases" / f"{name}.json"
                 for name in ("train", "mined", "omlx", "heldout2", "heldout3", "heldout4", "heldout5",
                              "heldout6", "heldout7", "heldout8", "heldout9", "heldout10", "heldout11",
                              "heldout12", "heldout13", "heldout14", "heldout15", "heldout16", "heldout17", "heldout18",
                              "heldout19", "heldout20", "heldout21", "heldout22", "heldout23", "heldout24",
                              "heldout25")]
DEFAULT_VENV = Path(tempfile.gettempdir()) / "invariants-corpus-tools"
SETUP_ERRORS = (case_file.CaseError, mirrors.MirrorError, tools.ToolError, checker_at.CheckerError)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=Path, action="append", metavar="FILE",
                        help="case file, scored as its own split; repeatable, the first is the training split "
                             f"(default: {' and '.join(p.name for p in DEFAULT_CASES)})")
    parser.add_argument("--mirrors", type=Path, default=None,
                        help=f"folder holding OWNER+NAME bare mirrors (default: ${mirrors.ENV}, then {mirrors.DEFAULT_ROOT})")
    parser.add_argument("--case", action="append", metavar="ID", help="run only this case (repeatable)")
    parser.add_argument("--no-baselines", action="store_true", help="run the checker only, not flake8-async and ruff")
    parser.add_argument("--scope", choices=run.SCOPES, default="package",
                        help="give the checker each case's file, or the package laid out around it (only findings in "
                             "the file are scored either way; default: %(default)s)")
    parser.add_argument("--tools-venv", type=Path, default=DEFAULT_VENV,
                        help="throwaway venv for flake8-async and ruff (default: %(default)s)")
    parser.add_argument("--head", action="store_true",
                        help="also check the MLX servers of corpus_bench/head.py at their recorded commits and list "
                             "every finding")
    parser.add_argument("--head-servers", action="store_true",
                        help="check only those servers (no cases, baselines or before-studied runs); with --write, "
                             "replace only the doc's HEAD findings section")
    parser.add_argument("--head-jsonl", type=Path, metavar="FILE",
                        help="write each HEAD finding as a JSON line: id, repo, commit, path, line, rule, message, "
                             "and the span of the def (else class, else statement) around it")
    parser.add_argument("--write", type=Path, metavar="DOC", help="write the Markdown doc (e.g. docs/corpus.md)")
    parser.add_argument("--no-speed", action="store_true",
                        help="with --head --write: leave out the speed section (bench_check's floor comparison)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write every finding and score as JSON")
    parser.add_argument("--checker-at", metavar="COMMIT",
                        help="score with the checker of this commit of the project's history (git archive of it, "
                             "run from its own tree) instead of this checkout's")
    parser.add_argument("--checker-repo", type=Path, default=checker_at.PROJECT, metavar="DIR",
                        help="the git repository --checker-at and the before-studied commits are read from "
                             "(default: this project, %(default)s)")
    parser.add_argument("--before-studied", action="append", default=[], metavar="REPO=COMMIT",
                        help="score REPO's cases with this commit's checker as its before-studied rules "
                             "(repeatable; replaces loro.py's choice for REPO)")
    parser.add_argument("--no-loro", action="store_true",
                        help="skip the before-studied (leave-one-repository-out) runs")
    return parser.parse_args(argv)


def loro_plan(pairs: list[str]) -> dict[str, loro.Studied]:
    """loro.py's before-studied commits, with each REPO=COMMIT of the command line in place of its own."""
    plan = dict(loro.BEFORE_STUDIED)
    for pair in pairs:
        repo, sep, commit = pair.partition("=")
        if not sep or repo.count("/") != 1 or not commit:
            raise case_file.CaseError(f"--before-studied takes OWNER/NAME=COMMIT, got {pair!r}")
        plan[repo] = loro.Studied(commit, "given on the command line (--before-studied)")
    return plan


def project_commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(HERE), *args], capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return f"`{commit}`" + (" with uncommitted changes" if git("status", "--porcelain") else "")


def as_json(runs: list[tuple[case_file.Split, run.Results]], head_runs: list[head.HeadRun] | None,
            repos: list[loro.RepoScores] | None = None, checker: checker_at.CheckerTree | None = None) -> dict:
    out: dict = {"checker": None if checker is None else checker.commit,
                 "splits": {split.name: split_json(results) for split, results in runs},
                 "crashes": [c for _, results in runs for c in results.crashes]}
    if repos is not None:
        out["by_repository"] = [repo_json(r) for r in repos]
    if head_runs is not None:
        out["head"] = [{"repo": r.repo, "commit": r.commit, "packages": list(r.packages), "exclude": list(r.exclude),
                        "files": r.files, "seconds": round(r.seconds, 2), "pins": r.pins,
                        "findings": head.records([r], checker)}
                       for r in head_runs]
    return out


def repo_json(scores: loro.RepoScores) -> dict:
    def figures(summary: scoring.Summary) -> dict:
        return {"line": summary.line(), "detected": summary.detected, "bugs": summary.bugs,
                "silent_at_fix": summary.silent, "silent_scored": summary.silent_scored,
                "clean_findings": summary.clean_findings, "clean_justified": summary.clean_justified}

    before = None
    if scores.checker is not None and scores.before is not None and scores.studied is not None:
        before = {"commit": scores.checker.commit, "date": scores.checker.date, "held_out": scores.studied.held_out,
                  "why": scores.studied.why, "rules": list(scores.rules), "crashes": list(scores.crashes),
                  **figures(scores.before)}
    return {"repo": scores.repo, "split": scores.split, "clean_files": scores.cleans, "before_studied": before,
            "today": {tool: figures(summary) for tool, summary in scores.today.items()}}


def split_json(results: run.Results) -> dict:
    def found(items: list[tools.Finding]) -> list[dict]:
        return [asdict(f) for f in items]

    out: dict = {"summary": {t: report.summary_line(results, t) for t in results.tools}, "bugs": [], "clean": []}
    for index, bug in enumerate(results.bugs["invariants"]):
        entry: dict = {"id": bug.case.id, "class": bug.case.cls, "detectability": bug.case.detectability}
        for tool in results.tools:
            score = results.bugs[tool][index]
            entry[tool] = {"detected": score.detected, "on_defect": found(list(score.on_defect)),
                           "silent_at_fix": score.silent_at_fix,
                           "in_fix_span": None if score.in_fix_span is None else found(list(score.in_fix_span)),
                           "buggy": found(results.findings[tool][bug.case.id]["buggy"]),
                           "fix": found(results.findings[tool][bug.case.id]["fix"])}
        out["bugs"].append(entry)
    for index, clean in enumerate(results.cleans["invariants"]):
        entry = {"id": clean.case.id}
        for tool in results.tools:
            score = results.cleans[tool][index]
            entry[tool] = {"justified": found(list(score.justified)), "unjustified": found(list(score.unjustified))}
        out["clean"].append(entry)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    try:
        import mlx_invariants
    except ImportError:
        print("corpus: mlx_invariants is not importable; run this with the project's venv (.venv/bin/python)",
              file=sys.stderr)
        return 2
    mirror_root = args.mirrors or mirrors.default_root()
    if args.head_servers:
        return head_servers(args, argv, mirror_root)
    try:
        splits = case_file.load_splits(args.cases or DEFAULT_CASES, args.case)
        repos = {c.repo for split in splits for c in split.cases}
        # every missing mirror named at once, before anything runs
        run.open_mirrors(mirror_root, repos | ({s.repo for s in head.SERVERS} if args.head else set())
                         | ({speed.REPO} if args.head and args.write and not args.no_speed else set()))
        plan = loro_plan(args.before_studied)
        venv = None if args.no_baselines else tools.ensure_venv(args.tools_venv)
        names = ("invariants",) if args.no_baselines else tools.TOOLS
        with tempfile.TemporaryDirectory(prefix="invariants-checker-at-") as tmp:
            checker = None if not args.checker_at else checker_at.build(args.checker_at, Path(tmp), args.checker_repo)
            runs = [(split, run.run_cases(list(split.cases), mirror_root, names, venv,
                                          "" if index == 0 else split.name, checker, args.scope))
                    for index, split in enumerate(splits)]
            repo_scores = None if args.no_loro else loro.by_repository(runs, mirror_root, plan, args.checker_repo,
                                                                       args.scope)
            head_runs = head.run_head(mirror_root, head.SERVERS, checker) if args.head else None
            timing = speed.floor_section(mirror_root, checker) if args.head and args.write and not args.no_speed else None
            rules = checker.rules() if checker else None
    except SETUP_ERRORS as exc:
        print(f"corpus: error: {exc}", file=sys.stderr)
        return 2
    versions = {"invariants": mlx_invariants.__version__ if checker is None else f"at {checker.short}",
                "flake8-async": f"{tools.PINS['flake8-async']} (flake8 {tools.PINS['flake8']})",
                "ruff": tools.PINS["ruff"]}
    sys.stdout.write(report.stdout_report([results for _, results in runs], versions, repo_scores))
    if head_runs is not None:
        sys.stdout.write("\n" + "\n".join(doc.head_section(head_runs, {})))
    crashes = [c for _, r in runs for c in r.crashes] + [c for r in head_runs or [] for c in r.crashes()]
    for crash in crashes + [c for r in repo_scores or [] for c in r.crashes]:
        print(f"corpus: checker failure: {crash}", file=sys.stderr)
    try:
        if args.json:
            args.json.write_text(json.dumps(as_json(runs, head_runs, repo_scores, checker), indent=2) + "\n",
                                 encoding="utf-8")
        if args.head_jsonl and head_runs is not None:
            head.write_jsonl(args.head_jsonl, head_runs, checker)
        if args.write:
            args.write.write_text(document(runs, head_runs, repo_scores, versions, args.write, checker, rules,
                                           argv, timing), encoding="utf-8")
    except OSError as exc:
        print(f"corpus: error: cannot write {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return 0


def head_servers(args: argparse.Namespace, argv: list[str], mirror_root: Path) -> int:
    """`--head-servers`: the HEAD findings of head.SERVERS alone; --write replaces that section of the doc."""
    try:
        with tempfile.TemporaryDirectory(prefix="invariants-checker-at-") as tmp:
            checker = None if not args.checker_at else checker_at.build(args.checker_at, Path(tmp), args.checker_repo)
            head_runs = head.run_head(mirror_root, head.SERVERS, checker)
    except SETUP_ERRORS as exc:
        print(f"corpus: error: {exc}", file=sys.stderr)
        return 2
    commit = project_commit() if checker is None else f"`{checker.short}` (`--checker-at`, its own tree)"
    meta = {"date": datetime.date.today().isoformat(), "commit": commit,
            "command": " ".join([".venv/bin/python benchmarks/corpus.py", *map(shlex.quote, argv)]),
            "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores, "
                       f"Python {platform.python_version()}"}
    verdicts = doc.read_verdicts(args.write) if args.write else {}
    section = doc.head_section(head_runs, verdicts, meta)
    sys.stdout.write("\n".join(section) + "\n")
    for crash in (c for r in head_runs for c in r.crashes()):
        print(f"corpus: checker failure: {crash}", file=sys.stderr)
    try:
        if args.json:
            args.json.write_text(json.dumps(as_json([], head_runs, None, checker), indent=2) + "\n", encoding="utf-8")
        if args.head_jsonl:
            head.write_jsonl(args.head_jsonl, head_runs, checker)
        if args.write:
            old = args.write.read_text(encoding="utf-8") if args.write.exists() else ""
            args.write.write_text(doc.replace_head_section(old, section), encoding="utf-8")
    except OSError as exc:
        print(f"corpus: error: cannot write {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return 0


def document(runs: list[tuple[case_file.Split, run.Results]], head_runs: list[head.HeadRun] | None,
             repos: list[loro.RepoScores] | None, versions: dict[str, str], path: Path,
             checker: checker_at.CheckerTree | None = None, rules: list[str] | None = None,
             argv: list[str] | None = None, timing: list[str] | None = None) -> str:
    if rules is None:
        from mlx_invariants.checker.rules import RULES

        rules = [r.id for r in RULES]
    commit = project_commit() if checker is None else f"`{checker.short}` (`--checker-at`, its own tree)"
    meta = {"date": datetime.date.today().isoformat(), "commit": commit, "rules": ", ".join(rules),
            "command": " ".join([".venv/bin/python benchmarks/corpus.py", *map(shlex.quote, argv or [])]),
            "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores, "
                       f"Python {platform.python_version()}"}
    return doc.document(runs, head_runs, meta, versions, doc.read_verdicts(path), repos, timing)


if __name__ == "__main__":
    sys.exit(main())
