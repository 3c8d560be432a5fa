"""Print a rule's documentation: what it asks, why, its options, a bad and a good example."""

from __future__ import annotations

import argparse
import re
import sys
import textwrap


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("rule", metavar="RULE", help="a rule id (INV105) or name (lock-released-before-worker)")


def _indent(text: str, prefix: str = "    ") -> str:
    return textwrap.indent(text.rstrip("\n"), prefix)


def _example(code: str) -> str:
    return _indent(re.sub(r"# expect: (INV\d+)", r"# <- \1", code))


def _placeholders(message: str) -> str:
    return re.sub(r"\{(\w+)(?::[^}]*)?\}", r"<\1>", message)


def run(args: argparse.Namespace) -> int:
    from mlx_invariants.checker.output import BUILTIN
    from mlx_invariants.checker.rules import RULES

    wanted = args.rule.strip()
    if wanted.upper() in BUILTIN:
        name, summary = BUILTIN[wanted.upper()]
        sys.stdout.write(f"{wanted.upper()} {name}\n\n{summary}\n")
        return 0
    for rule in RULES:
        if wanted.upper() == rule.id or wanted.lower() == rule.name():
            sys.stdout.write(explain(rule))
            return 0
    known = ", ".join([*BUILTIN, *(r.id for r in RULES)])
    print(f"invariants: error: unknown rule '{wanted}'; known rules: {known} (run `invariants rules`)", file=sys.stderr)
    return 2


def explain(rule) -> str:
    from mlx_invariants.checker.config import SHARED_DEFAULTS

    parts = [f"{rule.id} {rule.name()}", ""]
    parts += ["What", _indent(textwrap.fill(_placeholders(rule.message), 88)), ""]
    parts += ["Why", _indent(textwrap.fill(" ".join(rule.why().split()), 88)), ""]
    bad, good = rule.invalid(), rule.valid()
    if bad:
        parts += ["Example", "  Bad:", _example(bad[0].source), "  Good:", _example(good[0].source), ""]
    options = {**rule.options}
    if options:
        parts += [f"Options ([tool.invariants.{rule.id}])"]
        parts += [f"    {key} = {value!r}" for key, value in options.items()]
        parts += [f"    paths = [...]  # only check these paths (globs); shared keys: {', '.join(SHARED_DEFAULTS)}", ""]
    else:
        parts += [f"Options ([tool.invariants.{rule.id}])", "    paths = [...]  # only check these paths (globs)", ""]
    parts += ["Known problems", _indent(textwrap.fill(rule.known_problems or "None known.", 88)), ""]
    return "\n".join(parts)
