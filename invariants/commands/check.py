"""Check Python files for MLX serving concurrency bugs (exit 0 clean, 1 findings, 2 error)."""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="*", default=["."], metavar="PATH", help="files or folders (default: .)")
    parser.add_argument("--format", choices=("text", "json", "sarif", "github"), default="text",
                        help="output format (default: text, `path:line:col: CODE message`)")
    parser.add_argument("-o", "--output", metavar="FILE", help="write the findings to FILE instead of stdout")
    parser.add_argument("--select", metavar="IDS", help="comma-separated rule ids or prefixes to run (replaces the config's)")
    parser.add_argument("--ignore", metavar="IDS", help="comma-separated rule ids or prefixes to skip (added to the config's)")
    parser.add_argument("--config", metavar="PYPROJECT", help="read [tool.invariants] from this file")
    parser.add_argument("-j", "--jobs", type=int, default=1, metavar="N", help="parse in N processes (0: one per core)")
    parser.add_argument("--no-cache", action="store_true", help="neither read nor write the result cache")
    parser.add_argument("--report-unused-suppressions", action="store_true",
                        help="report suppression comments that silence nothing (INV001)")
    parser.add_argument("--force-exclude", action="store_true",
                        help="apply excludes to files named on the command line too (use in pre-commit)")
    parser.add_argument("--exit-zero", action="store_true", help="exit 0 even when there are findings")
    parser.add_argument("-q", "--quiet", action="store_true", help="no summary line on stderr")


def _ids(text: str | None) -> list[str] | None:
    return None if text is None else [part.strip().upper() for part in text.split(",") if part.strip()]


def run(args: argparse.Namespace) -> int:
    import atexit
    import gc
    from pathlib import Path

    # At exit the interpreter's last collection walks every object still alive (libcst's classes, the
    # cache's reports): 0.04 s of CPU of a 0.55 s re-run after one edit of vllm-mlx. Frozen, they are
    # skipped; the process ends right after, so nothing is kept longer (one handler, however often
    # an in-process caller runs the command).
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)

    from mlx_invariants.checker import config, output
    from mlx_invariants.checker.runner import check_paths
    from mlx_invariants.errors import UsageError

    try:
        if args.jobs < 0:
            raise UsageError(f"--jobs must be 0 (one per core) or more, got {args.jobs}")
        overrides = {k: v for k, v in (("select", _ids(args.select)), ("ignore", _ids(args.ignore))) if v is not None}
        config_path = Path(args.config) if args.config else None
        settings = config.load_fast(config_path, Path.cwd(), overrides, remember=not args.no_cache)
        result = check_paths(
            args.paths, settings, jobs=args.jobs, use_cache=not args.no_cache,
            report_unused=args.report_unused_suppressions, force_exclude=args.force_exclude,
        )
        rules = []
        if args.format == "sarif":
            from mlx_invariants.checker.rules import RULES

            rules = [r for r in RULES if r.id in settings.enabled_ids]
        text = output.render(result.findings, args.format, rules)
        if args.output:
            Path(args.output).write_text(text, encoding="utf-8")
        else:
            sys.stdout.write(text)
            sys.stdout.flush()
    except UsageError as exc:
        print(f"invariants: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"invariants: error: {exc.strerror or exc}: {exc.filename or ''}", file=sys.stderr)
        return 2
    except Exception as exc:  # an internal error: one line, exit 2, never a raw traceback
        print(f"invariants: internal error: {type(exc).__name__}: {exc}; please report it with the file that caused it",
              file=sys.stderr)
        return 2
    if not args.quiet:
        files = "file" if result.files == 1 else "files"
        found = len(result.findings)
        print(f"invariants: {found} finding{'s' if found != 1 else ''} in {result.files} {files}", file=sys.stderr)
    return 0 if args.exit_zero or not result.findings else 1
