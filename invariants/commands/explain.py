"""Print a rule's documentation (what it asks, why, its options, a bad and a good example), or a fuzz
violation kind's (its oracle, what it means, whether it is exact and why, known problems).

Violation kinds come from their oracles' declarations (`mlx_invariants.fuzz.oracles.KINDS`), which import
no MLX, Hypothesis or httpx, so this works on the checker-only install."""

from __future__ import annotations

import argparse
import re
import sys
import textwrap


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("rule", metavar="RULE",
                        help="a rule id (INV105) or name (lock-released-before-worker), or a fuzz violation kind "
                             "(slot-freed-early)")


def _indent(text: str, prefix: str = "    ") -> str:
    return textwrap.indent(text.rstrip("\n"), prefix)


def _fill(text: str) -> str:
    """`text` in lines of 88, never split inside a word: "wall-clock" wrapped as "wall-" and "clock" reads
    as two words to a reader, and to anything that searches the output for the sentence."""
    return textwrap.fill(text, 88, break_on_hyphens=False, break_long_words=False)


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
    from mlx_invariants.fuzz.oracles import KINDS

    if wanted.lower() in KINDS:
        sys.stdout.write(explain_kind(KINDS[wanted.lower()]))
        return 0
    known = ", ".join([*BUILTIN, *(r.id for r in RULES)])
    print(f"invariants: error: unknown rule '{wanted}' (nor a fuzz violation kind); known rules: {known} (run "
          f"`invariants rules`); violation kinds: {', '.join(sorted(KINDS))}", file=sys.stderr)
    return 2


def explain(rule) -> str:
    from mlx_invariants.checker.config import SHARED_DEFAULTS

    parts = [f"{rule.id} {rule.name()}", ""]
    if not rule.default_enabled:
        parts += ["Opt-in", _indent(_fill(
            f'Off unless `select` names it: select = ["INV", "{rule.id}"] in [tool.invariants], or '
            f"--select INV,{rule.id}.")), ""]
    parts += ["What", _indent(_fill(_placeholders(rule.message))), ""]
    parts += ["Why", _indent(_fill(" ".join(rule.why().split()))), ""]
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
    parts += ["Known problems", _indent(_fill(rule.known_problems or "None known.")), ""]
    return "\n".join(parts)


def explain_kind(kind) -> str:
    """A fuzz violation kind as its oracle declared it (`fuzz.violation.ViolationKind`)."""
    from mlx_invariants.fuzz.oracles import oracle_of

    oracle = oracle_of(kind)
    summary = (oracle.__doc__ or "").strip().split("\n\n")[0] if oracle is not None else ""
    parts = [f"{kind.name} (fuzz violation kind)", ""]
    parts += ["What", _indent(_fill(kind.doc)), ""]
    parts += ["Oracle", _indent(_fill(f"{kind.oracle}: {' '.join(summary.split())}" if summary else kind.oracle)), ""]
    verdict = ("exact: one sighting fails the run, no replay needed" if kind.exact
               else "not exact: counts once it replays (`--confirm` of the `--replays` re-runs)")
    parts += ["Exact", _indent(_fill(f"{verdict}. {kind.why}")), ""]
    parts += ["Known problems", _indent(_fill(kind.known_problems or "None known.")), ""]
    return "\n".join(parts)
