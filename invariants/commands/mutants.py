"""Apply the regression catalogue to copies of engine/ and show which check kills each mutant.

Each mutant is a known bug of MLX serving engines (see `--list`), applied to a
temporary copy of engine/. The unmutated copy must pass every check first;
then each mutant goes through the static checker, the engine tests that target
it, and the cancellation fuzzer (ci profile), cheapest first, until one kills
it. With --must-kill, each mutant instead goes through exactly the layers its
entry says must kill it, and every one of them must. Exit status: 0 all
killed, 1 a survivor (or a must-kill layer missed) or an unclean baseline, 2
usage error or a mutant whose anchor no longer matches the engine.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--only", action="append", metavar="ID",
                        help="run only this mutant (full id or number, e.g. M07); repeatable")
    parser.add_argument("--list", action="store_true", help="print the catalogue and exit")
    parser.add_argument("--jobs", type=int, default=2, metavar="N", help="mutants checked at once (default 2)")
    parser.add_argument("--budget", type=float, default=0.0, metavar="SECONDS",
                        help="stop starting mutants after this long; unrun mutants fail the run (default: none)")
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--all-layers", action="store_true",
                     help="run every layer on every mutant instead of stopping at the first kill")
    how.add_argument("--must-kill", action="store_true",
                     help="run on each mutant every layer its entry says must kill it (of --layers), "
                          "and fail unless each one does")
    parser.add_argument("--layers", default="static,tests,fuzz", metavar="LIST",
                        help="comma-separated layers to run (default static,tests,fuzz)")
    parser.add_argument("--full-tests", action="store_true",
                        help="run the whole tests/engine suite per mutant instead of the tests aimed at it")
    parser.add_argument("--test-timeout", type=int, default=15, metavar="SECONDS",
                        help="per engine test; a deadlocked mutant is killed by this (default 15)")
    parser.add_argument("--repo", type=Path, default=Path("."), help="the repository holding engine/ (default .)")


def run(args: argparse.Namespace) -> int:
    from mlx_invariants.mutants.catalogue import select
    from mlx_invariants.mutants.errors import MutantsError
    from mlx_invariants.mutants.layers import Settings
    from mlx_invariants.mutants.listing import describe
    from mlx_invariants.mutants.mutant import LAYERS
    from mlx_invariants.mutants.runner import Runner
    from mlx_invariants.mutants.table import render, summary

    try:
        mutants = select(args.only)
    except MutantsError as exc:
        print(f"invariants mutants: {exc}", file=sys.stderr)
        return 2
    if args.list:
        print(describe(mutants))
        return 0
    chosen = [name.strip() for name in args.layers.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in LAYERS]
    if unknown or not chosen:
        print(f"invariants mutants: unknown layer {', '.join(unknown) or '(none)'}; use {','.join(LAYERS)}",
              file=sys.stderr)
        return 2
    repo = args.repo.resolve()
    if not (repo / "engine").is_dir():
        print(f"invariants mutants: {repo} has no engine/ folder; run from the repository or pass --repo",
              file=sys.stderr)
        return 2
    settings = Settings(test_timeout_s=args.test_timeout, full_tests=args.full_tests)
    runner = Runner(repo, settings, jobs=args.jobs, budget_s=args.budget, all_layers=args.all_layers,
                    layer_names=chosen, must_kill=args.must_kill,
                    progress=lambda line: print(line, file=sys.stderr, flush=True))
    try:
        report = runner.run(mutants)
    except MutantsError as exc:
        print(f"invariants mutants: {exc}", file=sys.stderr)
        return 2
    print(render(report))
    print(summary(report))
    return 0 if report.ok else 1
