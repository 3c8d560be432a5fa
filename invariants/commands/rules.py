"""List the static rules: id, name, and what each one catches."""

from __future__ import annotations

import argparse
import json
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output format (default: text)")


def run(args: argparse.Namespace) -> int:
    from mlx_invariants.checker.output import BUILTIN
    from mlx_invariants.checker.rules import RULES

    rows = [(rule_id, name, summary) for rule_id, (name, summary) in BUILTIN.items()]
    rows += [(rule.id, rule.name(), rule.summary()) for rule in RULES]
    if args.format == "json":
        print(json.dumps([{"id": i, "name": n, "summary": s} for i, n, s in rows], indent=2))
        return 0
    width = max(len(name) for _, name, _ in rows)
    for rule_id, name, summary in rows:
        sys.stdout.write(f"{rule_id}  {name:<{width}}  {summary}\n")
    sys.stdout.write("\nRun `invariants explain INV105` for a rule's reasons, examples and options.\n")
    return 0
