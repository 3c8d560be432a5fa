"""The `invariants` console script.

Each subcommand lives in its own module exposing `add_arguments(parser)` and
`run(args) -> int`. Only the module of the subcommand being run is imported,
and those modules import nothing heavy at module level either: MLX, the HTTP
stack and Hypothesis load inside `run`, so `invariants check` stays light
enough for a pre-commit hook.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from mlx_invariants.errors import UsageError

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "check": ("mlx_invariants.commands.check", "run the static tripwires on Python files"),
    "rules": ("mlx_invariants.commands.rules", "list the static rules"),
    "explain": ("mlx_invariants.commands.explain", "print a rule's documentation and examples"),
    "serve": ("mlx_invariants.commands.serve", "run the reference OpenAI-compatible MLX engine"),
    "fuzz": ("mlx_invariants.commands.fuzz", "cancellation-fuzz an engine with the MLX access sentinel"),
    "mutants": ("mlx_invariants.commands.mutants", "apply the regression catalogue and show what kills each mutant"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The full parser for `command` (its module imported), and a help-only entry for the others."""
    parser = argparse.ArgumentParser(
        prog="invariants",
        description="Regression and invariant harness for MLX serving engines.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (module_name, help_text) in COMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text)
        if name == command:
            module = importlib.import_module(module_name)
            command_parser.description = module.__doc__
            module.add_arguments(command_parser)
            command_parser.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    args = build_parser(command if command in COMMANDS else None).parse_args(argv)
    try:
        code = int(args._run(args) or 0)
        sys.stdout.flush()  # inside the try: a reader that went away is met here, not at interpreter exit
        return code
    except BrokenPipeError:
        # `invariants ... | head`: the reader has what it wanted. Point stdout at /dev/null so the flush at
        # exit does not raise again, and exit as a shell does for a writer killed by SIGPIPE.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13
    except UsageError as exc:
        print(f"invariants {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
