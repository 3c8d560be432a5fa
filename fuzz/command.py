"""Cancellation-fuzz an engine: concurrent requests, cancels, aborts, disconnects, MLX errors and
shutdowns at named points, with the MLX access sentinel watching every entry into MLX.

Exit status: 0 no violation found, 1 a violation (report written), 2 usage error.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Optional

from mlx_invariants.errors import UsageError

DEFAULT_REPORT_DIR = "fuzz-reports"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    target = parser.add_argument_group("what to fuzz (one of)")
    target.add_argument("--engine", metavar="simple|batched|MODULE:FACTORY",
                        help="a reference engine, or a factory returning an adapter or a reference-API engine "
                             "(default: simple)")
    target.add_argument("--url", help="an OpenAI-compatible server already running on a loopback address")
    target.add_argument("--server-cmd", metavar="CMD",
                        help="start this server command on a free 127.0.0.1 port ({port} in CMD) with the "
                             "MLX sentinel injected, fuzz it over HTTP, stop it")
    run = parser.add_argument_group("how long")
    run.add_argument("--budget", type=float, metavar="SECONDS", help="wall-clock budget (profile default)")
    run.add_argument("--examples", type=int, metavar="N", help="examples to generate (profile default)")
    run.add_argument("--seed", type=int, metavar="N", help="Hypothesis seed (default: derandomized in ci)")
    run.add_argument("--profile", choices=("ci", "runner"), default="ci")
    run.add_argument("--jobs", type=int, default=1, metavar="N",
                     help="child processes fuzzing in parallel, each with its own seed; 0 runs in this process")
    run.add_argument("--exhaustive", action="store_true",
                     help="instead of sampling, run every single-fault scenario for one and two requests")
    run.add_argument("--fresh-engine", action="store_true",
                     help="start a fresh engine for every scenario instead of reusing one while scenarios "
                          "leave it clean (slower; failures are always confirmed on a fresh engine anyway)")
    out = parser.add_argument_group("reports and replay")
    out.add_argument("--report", metavar="DIR", default=DEFAULT_REPORT_DIR, help="where failure reports go")
    out.add_argument("--replay", metavar="FILE", help="re-run a saved scenario (scenario.json or report folder)")
    out.add_argument("--replays", type=int, default=3, metavar="N",
                     help="automatic replays of a failure, reported as 'reproduced k/N'")
    out.add_argument("--strict", action="store_true", help="the sentinel refuses bad MLX entries (raises)")
    out.add_argument("--owner", metavar="GLOB",
                     help="thread-name glob of the server's MLX owner thread (default: the first thread to enter)")
    out.add_argument("--model", default="default_model",
                     help="the model name sent in HTTP requests (default: default_model, as mlx_lm.server expects)")


def run(args: argparse.Namespace) -> int:
    from mlx_invariants.extras import require

    require("fuzz", "hypothesis", "mlx.core")
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    from mlx_invariants.fuzz.adapters.http import ServerError
    from mlx_invariants.fuzz.engines import EngineSpecError
    from mlx_invariants.fuzz.replay import ReplayError

    _validate(args)
    try:
        if args.replay:
            return _replay(args)
        options = _options(args)
        factory = build_factory(options)
        if args.exhaustive:
            return _exhaustive(factory, args)
        if args.jobs == 0:
            return _in_process(factory, args)
        return _children(options, args)
    except (EngineSpecError, ReplayError, ServerError) as exc:
        raise UsageError(str(exc)) from None


def _validate(args: argparse.Namespace) -> None:
    chosen = [flag for flag, value in (("--engine", args.engine), ("--url", args.url),
                                       ("--server-cmd", args.server_cmd)) if value]
    if len(chosen) > 1:
        raise UsageError(f"choose one of {', '.join(chosen)}")
    if args.jobs < 0 or (args.examples is not None and args.examples < 1) or args.replays < 0:
        raise UsageError("--jobs must be >= 0, --examples >= 1, --replays >= 0")
    if args.budget is not None and args.budget <= 0:
        raise UsageError("--budget must be a positive number of seconds")
    if args.server_cmd and "{port}" not in args.server_cmd:
        raise UsageError("--server-cmd needs a {port} placeholder, e.g. "
                         "\"python -m mlx_lm.server --model DIR --port {port}\"")
    if args.replay and args.exhaustive:
        raise UsageError("--replay and --exhaustive do not mix")


def _options(args: argparse.Namespace) -> dict[str, Any]:
    """What a child process needs to rebuild the same target; also the report's replay options."""
    if args.url:
        engine_args = f"--url {args.url}"
    elif args.server_cmd:
        engine_args = f"--server-cmd {shlex.quote(args.server_cmd)}"
    else:
        engine_args = f"--engine {args.engine or 'simple'}"
    if args.owner:
        engine_args += f" --owner {shlex.quote(args.owner)}"
    if args.model != "default_model":
        engine_args += f" --model {shlex.quote(args.model)}"
    return {"engine": args.engine or "simple", "url": args.url, "server_cmd": args.server_cmd,
            "owner": args.owner, "model": args.model, "strict": args.strict, "engine_args": engine_args,
            "profile": args.profile, "budget": args.budget, "examples": args.examples, "seed": args.seed,
            "report_dir": str(Path(args.report).resolve()), "reuse": False if args.fresh_engine else None}


def build_factory(options: dict[str, Any]) -> Any:
    """The adapter factory the options name (HTTP adapters start their server lazily, once)."""
    if options.get("url") or options.get("server_cmd"):
        from mlx_invariants.fuzz.adapters.http import http_engine

        factory = http_engine(url=options.get("url"), server_cmd=options.get("server_cmd"),
                              owner=options.get("owner"), model=options.get("model") or "default_model")
    else:
        from mlx_invariants.fuzz.engines import resolve_engine

        factory = resolve_engine(options["engine"])
    factory.engine_args = options["engine_args"]
    return factory


def _in_process(factory: Any, args: argparse.Namespace) -> int:
    from mlx_invariants.fuzz.driver import DriverSettings
    from mlx_invariants.fuzz.runner import run_fuzz

    line = _ProgressLine()
    result = run_fuzz(factory, profile=args.profile, budget=args.budget, examples=args.examples, seed=args.seed,
                      report_dir=args.report, replays=args.replays, progress=line.update,
                      settings=DriverSettings(strict=args.strict), workdir=Path(args.report) / "work",
                      reuse=False if args.fresh_engine else None)
    line.done()
    return _summary(result.engine, result.examples, result.elapsed_s,
                    result.failure.headline if result.failure else None, result.report_dir)


def _exhaustive(factory: Any, args: argparse.Namespace) -> int:
    from mlx_invariants.fuzz.driver import DriverSettings
    from mlx_invariants.fuzz.runner import run_exhaustive

    line = _ProgressLine()
    result = run_exhaustive(factory, report_dir=args.report, replays=args.replays, progress=line.update,
                            settings=DriverSettings(strict=args.strict), reuse=False if args.fresh_engine else None)
    line.done()
    return _summary(result.engine, result.examples, result.elapsed_s,
                    result.failure.headline if result.failure else None, result.report_dir)


def _children(options: dict[str, Any], args: argparse.Namespace) -> int:
    from mlx_invariants.fuzz.jobs import run_jobs

    line = _ProgressLine()

    def progress(states: list[dict[str, Any]]) -> None:
        line.show(f"{sum(s['examples'] for s in states)} examples in {args.jobs} job(s), "
                  f"{sum(bool(s['failed']) for s in states)} failing, "
                  f"{max(s['elapsed_s'] for s in states):.0f}s")
    options["label"] = options["engine_args"]
    outcomes = run_jobs(options, args.jobs, Path(args.report) / "work", progress)
    line.done()
    failed = [o for o in outcomes if o.failed]
    examples = sum(o.examples for o in outcomes)
    elapsed = max((o.elapsed_s for o in outcomes), default=0.0)
    if not failed:
        return _summary(options["engine_args"], examples, elapsed, None, None)
    first = failed[0]
    return _summary(options["engine_args"], examples, elapsed, first.headline or first.crashed, first.report_dir)


def _replay(args: argparse.Namespace) -> int:
    from mlx_invariants.fuzz.driver import DriverSettings
    from mlx_invariants.fuzz.replay import load_scenario, replay
    from mlx_invariants.fuzz.report import render, write_report

    _, recorded = load_scenario(args.replay)
    if not (args.engine or args.url or args.server_cmd) and recorded and not recorded.startswith("--engine "):
        args = _with_recorded_target(args, recorded)
    engine: Any = None
    if args.engine or args.url or args.server_cmd:
        engine = build_factory(_options(args))
    times = max(args.replays, 1)
    result = replay(args.replay, engine, times=times, settings=DriverSettings(strict=args.strict))
    print(f"replayed {result.scenario.describe()}: violations in {result.reproduced}/{times} run(s)")
    if result.failure is None:
        return 0
    folder = write_report(args.report, result.failure)
    print(render(result.failure, folder / "scenario.json"))
    print(f"report: {folder}")
    return 1


def _with_recorded_target(args: argparse.Namespace, recorded: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    recorded_args = parser.parse_args(shlex.split(recorded))
    for name in ("url", "server_cmd", "owner"):
        if getattr(args, name) is None:
            setattr(args, name, getattr(recorded_args, name))
    if args.model == "default_model":
        args.model = recorded_args.model
    return args


def _summary(engine: str, examples: int, elapsed: float, headline: Optional[str], report: Any) -> int:
    if headline is None:
        print(f"{engine}: no violation in {examples} example(s), {elapsed:.1f}s")
        return 0
    print(f"{engine}: VIOLATION after {examples} example(s), {elapsed:.1f}s: {headline}")
    if report:
        print(f"report: {report}/report.txt")
        print(f"replay: invariants fuzz --replay {report}/scenario.json")
    return 1


class _ProgressLine:
    """One status line on stderr: rewritten in place on a terminal, every few seconds otherwise."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.last = 0.0
        self.shown = False

    def update(self, state: Any) -> None:
        self.show(f"{state.examples} examples, {state.elapsed_s:.0f}s/{state.budget_s:.0f}s, "
                  f"{'FAILING, ' + state.phase if state.failed else state.phase}: {state.scenario[:70]}")

    def show(self, text: str) -> None:
        now = time.monotonic()
        if self.tty:
            sys.stderr.write("\r\033[K" + text)
            sys.stderr.flush()
            self.shown = True
        elif now - self.last >= 5.0:
            self.last = now
            print(text, file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.tty and self.shown:
            sys.stderr.write("\n")
