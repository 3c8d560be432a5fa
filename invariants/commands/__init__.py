"""Subcommands of the static checker: check, rules, explain.

Each module exposes `add_arguments(parser)` and `run(args) -> int`, and imports
nothing heavy until `run` is called.
"""
