"""`python -m zoo install|run|doc|list` from the repository root, or `python CHECKOUT/zoo ...` from anywhere
(ci/zoo.sh is the documented front door).

install  put each recipe's pinned server into its venv under the zoo cache
run      install, fuzz each recipe for --budget seconds once per seed (runner profile, --keep-going), run its
         reproducers, save zoo.json, write docs/zoo.md; --note says what else loaded the machine
         (naming recipes re-runs only those and keeps the other servers' entries of the saved zoo.json)
doc      rewrite docs/zoo.md from a saved zoo.json (with the recipes' current reports, reasons and the servers
         that do not run here)
list     the recipes and the servers that do not run here
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

if not __package__:  # `python zoo ...` or `python CHECKOUT/zoo ...`: put the checkout root, not the working folder, first
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from zoo import doc, install  # noqa: E402
from zoo.recipes import ALL, BLOCKED, find  # noqa: E402

HERE = Path(__file__).resolve().parent  # zoo/; its parent is the repository root
RESULT = HERE / "results" / "zoo.json"
DOC = HERE.parent / "docs" / "zoo.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zoo", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("install", "run"):
        command = sub.add_parser(name)
        command.add_argument("names", nargs="*", help="recipe names (default: all)")
        if name == "run":
            command.add_argument("--budget", type=float, default=90.0, help="seconds of fuzzing per server")
            command.add_argument("--repro-runs", type=int, default=2, help="runs of each reproducer")
            command.add_argument("--seed", type=int, action="append", dest="seeds", metavar="SEED",
                                 help="a Hypothesis seed; every recipe is fuzzed once per seed (repeat it for "
                                 "several; default: --seeds of them drawn once and recorded)")
            command.add_argument("--seeds", type=int, default=3, dest="seed_count", metavar="N",
                                 help="how many seeds to draw when no --seed is given (default 3)")
            command.add_argument("--note", default="", help="what else the machine was doing (shown in the doc)")
            command.add_argument("--result", type=Path, default=RESULT)
            command.add_argument("--doc", type=Path, default=DOC)
    rewrite = sub.add_parser("doc")
    rewrite.add_argument("--result", type=Path, default=RESULT)
    rewrite.add_argument("--doc", type=Path, default=DOC)
    sub.add_parser("list")
    args = parser.parse_args(argv)
    try:
        recipes = [find(name) for name in getattr(args, "names", [])] or list(ALL)
    except KeyError as exc:
        parser.error(exc.args[0])
    if args.command == "list":
        for recipe in ALL:
            print(f"{recipe.name:24} {recipe.package + '==' + recipe.version:26} {install.venv_dir(recipe)}")
        for blocked in BLOCKED:
            print(f"{blocked.name:24} {blocked.package + '==' + blocked.version:26} (does not run here: {blocked.error})")
        return 0
    if args.command == "install":
        return _install(recipes)
    if args.command == "doc":
        result = json.loads(args.result.read_text())
        result["blocked"] = _blocked()  # recipe data, like each finding's why: the list as it stands now
        args.doc.write_text(doc.write(result))
        print(f"wrote {args.doc}")
        return 0
    return _run(recipes, args)


def _install(recipes: list) -> int:
    failed = 0
    for recipe in recipes:
        try:
            print(f"{recipe.name}: {install.install(recipe)}")
        except install.InstallError as exc:
            failed += 1
            print(f"{recipe.name}: {exc}", file=sys.stderr)
    return 1 if failed else 0


def _run(recipes: list, args: argparse.Namespace) -> int:
    from mlx_invariants.engine import tiny_model_path
    from zoo.run import run_zoo

    if args.budget <= 0 or args.repro_runs < 1 or args.seed_count < 1:
        print("--budget must be positive, --repro-runs and --seeds at least 1", file=sys.stderr)
        return 2
    seeds = args.seeds or [random.getrandbits(32) for _ in range(args.seed_count)]
    work = Path(tempfile.mkdtemp(prefix="mlx-invariants-zoo-"))
    result = run_zoo(recipes, args.budget, str(tiny_model_path()), work, args.repro_runs, seeds, note=args.note)
    if args.names and args.result.exists():
        result["servers"] = _merged(json.loads(args.result.read_text())["servers"], result["servers"])
    args.result.parent.mkdir(parents=True, exist_ok=True)
    args.result.write_text(json.dumps(result, indent=1) + "\n")
    args.doc.write_text(doc.write(result))
    print(f"wrote {args.result} and {args.doc}; fuzz reports under {work}")
    return 0


def _blocked() -> list[dict]:
    return [{"name": b.name, "package": b.package, "version": b.version, "reason": b.reason, "error": b.error}
            for b in BLOCKED]


def _merged(kept: list[dict], fresh: list[dict]) -> list[dict]:
    """A run of some recipes updates their entries in the saved result and keeps the others', in recipe order."""
    by_name = {server["name"]: server for server in kept + fresh}
    return [by_name[recipe.name] for recipe in ALL if recipe.name in by_name]


if __name__ == "__main__":
    sys.exit(main())
