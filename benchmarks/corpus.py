"""Score `invariants check` on the real-bug corpus, side by side with flake8-async and ruff.

Each case's file is laid out at its buggy and fix commits (or its one commit, for a
clean file) from local bare git mirrors, every tool runs once over all of them, and
the findings are scored as the corpus defines it (docs/corpus.md):

    .venv/bin/python benchmarks/corpus.py                                 # tables on stdout
    .venv/bin/python benchmarks/corpus.py --head --write docs/corpus.md   # the doc
    .venv/bin/python benchmarks/corpus.py --no-baselines --case V7        # the checker, one case

The training cases (train.json) and the cases mined from other MLX servers
(mined.json) are two splits: each is scored and reported on its own, and the
targets are judged on the training split alone.

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
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from corpus_bench import cases as case_file
from corpus_bench import doc, head, mirrors, report, run, tools

HERE = Path(__file__).resolve().parent
DEFAULT_CASES = [HERE / "corpus_bench" / "cases" / "train.json", HERE / "corpus_bench" / "cases" / "mined.json"]
DEFAULT_VENV = Path(tempfile.gettempdir()) / "invariants-corpus-tools"
SETUP_ERRORS = (case_file.CaseError, mirrors.MirrorError, tools.ToolError)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=Path, action="append", metavar="FILE",
                        help="case file, scored as its own split; repeatable, the first is the training split "
                             f"(default: {' and '.join(p.name for p in DEFAULT_CASES)})")
    parser.add_argument("--mirrors", type=Path, default=None,
                        help=f"folder holding OWNER+NAME bare mirrors (default: ${mirrors.ENV}, then {mirrors.DEFAULT_ROOT})")
    parser.add_argument("--case", action="append", metavar="ID", help="run only this case (repeatable)")
    parser.add_argument("--no-baselines", action="store_true", help="run the checker only, not flake8-async and ruff")
    parser.add_argument("--tools-venv", type=Path, default=DEFAULT_VENV,
                        help="throwaway venv for flake8-async and ruff (default: %(default)s)")
    parser.add_argument("--head", action="store_true",
                        help="also check HEAD of each mirror's default branch and list every finding")
    parser.add_argument("--write", type=Path, metavar="DOC", help="write the Markdown doc (e.g. docs/corpus.md)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write every finding and score as JSON")
    return parser.parse_args(argv)


def project_commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(HERE), *args], capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return f"`{commit}`" + (" with uncommitted changes" if git("status", "--porcelain") else "")


def as_json(runs: list[tuple[case_file.Split, run.Results]], head_runs: list[head.HeadRun] | None) -> dict:
    out: dict = {"splits": {split.name: split_json(results) for split, results in runs},
                 "crashes": [c for _, results in runs for c in results.crashes]}
    if head_runs is not None:
        out["head"] = [{"repo": r.repo, "commit": r.commit, "packages": list(r.packages), "files": r.files,
                        "findings": [{"path": p, **asdict(f)} for p, f in r.findings]} for r in head_runs]
    return out


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
    args = parse_args(argv)
    try:
        import mlx_invariants
    except ImportError:
        print("corpus: mlx_invariants is not importable; run this with the project's venv (.venv/bin/python)",
              file=sys.stderr)
        return 2
    mirror_root = args.mirrors or mirrors.default_root()
    try:
        splits = case_file.load_splits(args.cases or DEFAULT_CASES, args.case)
        repos = {c.repo for split in splits for c in split.cases}
        run.open_mirrors(mirror_root, repos)  # every missing mirror named at once, before anything runs
        venv = None if args.no_baselines else tools.ensure_venv(args.tools_venv)
        names = ("invariants",) if args.no_baselines else tools.TOOLS
        runs = [(split, run.run_cases(list(split.cases), mirror_root, names, venv, "" if index == 0 else split.name))
                for index, split in enumerate(splits)]
        head_runs = head.run_head(mirror_root, repos) if args.head else None
    except SETUP_ERRORS as exc:
        print(f"corpus: error: {exc}", file=sys.stderr)
        return 2
    versions = {"invariants": mlx_invariants.__version__, "flake8-async": f"{tools.PINS['flake8-async']} "
                f"(flake8 {tools.PINS['flake8']})", "ruff": tools.PINS["ruff"]}
    sys.stdout.write(report.stdout_report([results for _, results in runs], versions))
    if head_runs is not None:
        sys.stdout.write("\n" + "\n".join(doc.head_section(head_runs, {})))
    for crash in [c for _, r in runs for c in r.crashes] + [c for r in head_runs or [] for c in r.crashes()]:
        print(f"corpus: checker failure: {crash}", file=sys.stderr)
    try:
        if args.json:
            args.json.write_text(json.dumps(as_json(runs, head_runs), indent=2) + "\n", encoding="utf-8")
        if args.write:
            args.write.write_text(document(runs, head_runs, versions, args.write), encoding="utf-8")
    except OSError as exc:
        print(f"corpus: error: cannot write {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return 0


def document(runs: list[tuple[case_file.Split, run.Results]], head_runs: list[head.HeadRun] | None,
             versions: dict[str, str], path: Path) -> str:
    from mlx_invariants.checker.rules import RULES

    meta = {"date": datetime.date.today().isoformat(), "commit": project_commit(),
            "rules": ", ".join(r.id for r in RULES),
            "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores, "
                       f"Python {platform.python_version()}"}
    return doc.document(runs, head_runs, meta, versions, doc.read_verdicts(path))


if __name__ == "__main__":
    sys.exit(main())
