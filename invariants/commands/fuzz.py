"""Cancellation-fuzz an engine: concurrent requests, cancels, aborts, disconnects, MLX errors and
shutdowns at named points, with the MLX access sentinel watching every entry into MLX.

Exit status: 0 no violation found, 1 a violation (report written), 2 usage error.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from mlx_invariants.errors import UsageError
from mlx_invariants.fuzz.defaults import HTTP_MODEL, REPLAYS, REPORT_DIR, ROUTE
from mlx_invariants.fuzz.settings import FuzzSettings
from mlx_invariants.fuzz.target import Target

if TYPE_CHECKING:
    from mlx_invariants.fuzz.runner import FuzzResult, Progress


def add_arguments(parser: argparse.ArgumentParser) -> None:
    target = parser.add_argument_group("what to fuzz (one of)")
    target.add_argument("--engine", metavar="simple|batched|MODULE:FACTORY",
                        help="a reference engine route, or a factory returning an adapter or a reference-API "
                             f"engine (default: {ROUTE})")
    target.add_argument("--url", help="an OpenAI-compatible server already running on a loopback address")
    target.add_argument("--server-cmd", metavar="CMD",
                        help="start this server command on a free 127.0.0.1 port ({port} in CMD) with the "
                             "MLX sentinel injected, fuzz it over HTTP, stop it")
    target.add_argument("--owner", metavar="GLOB",
                        help="--url/--server-cmd: thread-name glob of the server's MLX owner thread "
                             "(default: the first thread to enter)")
    target.add_argument("--model", help=f"--url/--server-cmd: the model name sent in requests "
                                        f"(default: {HTTP_MODEL}, as mlx_lm.server expects)")
    run_group = parser.add_argument_group("how long")
    run_group.add_argument("--budget", type=float, metavar="SECONDS", help="wall-clock budget (profile default)")
    run_group.add_argument("--examples", type=int, metavar="N", help="examples to generate (profile default)")
    run_group.add_argument("--seed", type=int, metavar="N", help="Hypothesis seed (default: derandomized in ci)")
    run_group.add_argument("--profile", choices=("ci", "runner"), default="ci")
    run_group.add_argument("--jobs", type=int, default=1, metavar="N",
                           help="child processes fuzzing in parallel, each with its own seed; 0 runs in this process")
    run_group.add_argument("--exhaustive", action="store_true",
                           help="instead of sampling, run every single-fault scenario for one and two requests")
    run_group.add_argument("--fresh-engine", action="store_true",
                           help="start a fresh engine for every scenario instead of reusing one while scenarios "
                                "leave it clean (slower; failures are always confirmed on a fresh engine anyway)")
    out = parser.add_argument_group("reports and replay")
    out.add_argument("--report", metavar="DIR", default=REPORT_DIR, help=f"where failure reports go (default: {REPORT_DIR})")
    out.add_argument("--replay", metavar="FILE",
                     help="re-run a saved scenario (scenario.json, report.json or report folder) on the target "
                          "it names, or on the one given")
    out.add_argument("--replays", type=int, default=REPLAYS, metavar="N",
                     help=f"automatic replays of a failure, reported as 'reproduced k/N' (default: {REPLAYS})")
    out.add_argument("--strict", action="store_true", help="the sentinel refuses bad MLX entries (raises)")


def run(args: argparse.Namespace) -> int:
    from mlx_invariants.extras import require

    require("fuzz", "hypothesis", "mlx.core")
    if args.jobs < 0:
        raise UsageError("--jobs must be >= 0")
    if args.replay and args.exhaustive:
        raise UsageError("--replay and --exhaustive do not mix")
    target = target_of(args)
    if args.replay:
        return _replay(args, target)
    if target is None:
        target = Target.reference(ROUTE)
    settings = settings_of(args)
    if args.exhaustive:
        return _exhaustive(target, settings)
    if args.jobs == 0:
        return _in_process(target, settings)
    return _children(target, settings, args.jobs)


def target_of(args: argparse.Namespace) -> Optional[Target]:
    """The target the flags name, or None if they name none (a replay then uses the file's)."""
    chosen = [flag for flag, value in (("--engine", args.engine), ("--url", args.url),
                                       ("--server-cmd", args.server_cmd)) if value]
    if len(chosen) > 1:
        raise UsageError(f"choose one of {', '.join(chosen)}")
    http = {"owner": args.owner, "model": args.model or HTTP_MODEL}
    if (args.owner or args.model) and not (args.url or args.server_cmd):
        raise UsageError("--owner and --model go with --url or --server-cmd")
    if args.url:
        return Target.url(args.url, **http)
    if args.server_cmd:
        return Target.server(args.server_cmd, **http)
    return Target.engine(args.engine) if args.engine else None


def settings_of(args: argparse.Namespace) -> FuzzSettings:
    report = Path(args.report).resolve()
    return FuzzSettings(profile=args.profile, budget_s=args.budget, examples=args.examples, seed=args.seed,
                        replays=args.replays, reuse=False if args.fresh_engine else None, strict=args.strict,
                        report_dir=str(report), workdir=str(report / "work"))


def _in_process(target: Target, settings: FuzzSettings) -> int:
    from mlx_invariants.fuzz.runner import run_fuzz

    line = _ProgressLine()
    result = run_fuzz(target, settings, progress=line.update)
    line.done()
    return _result_summary(result)


def _exhaustive(target: Target, settings: FuzzSettings) -> int:
    from mlx_invariants.fuzz.runner import run_exhaustive

    line = _ProgressLine()
    result = run_exhaustive(target, settings, progress=line.update)
    line.done()
    return _result_summary(result)


def _children(target: Target, settings: FuzzSettings, jobs: int) -> int:
    from mlx_invariants.fuzz.jobs import run_jobs

    line = _ProgressLine()

    def progress(states: list[dict[str, Any]]) -> None:
        line.show(f"{sum(s['examples'] for s in states)} examples in {jobs} job(s), "
                  f"{sum(bool(s['failed']) for s in states)} failing, "
                  f"{max(s['elapsed_s'] for s in states):.0f}s")
    outcomes = run_jobs(target, settings, jobs, Path(settings.workdir), progress)
    line.done()
    failed = [o for o in outcomes if o.failed]
    examples = sum(o.examples for o in outcomes)
    elapsed = max((o.elapsed_s for o in outcomes), default=0.0)
    if not failed:
        return _summary(target.label, examples, elapsed, None, None)
    first = failed[0]
    return _summary(target.label, examples, elapsed, first.headline or first.crashed, first.report_dir)


def _replay(args: argparse.Namespace, target: Optional[Target]) -> int:
    from mlx_invariants.fuzz.replay import replay
    from mlx_invariants.fuzz.report import render, write_report

    times = max(args.replays, 1)
    result = replay(args.replay, target, times=times, strict=args.strict)
    print(f"replayed {result.scenario.describe()} on {result.target.label}: violations in {result.reproduced}/{times} run(s)")
    if result.failure is None:
        return 0
    folder = write_report(args.report, result.failure)
    print(render(result.failure, folder / "scenario.json"))
    print(f"report: {folder}")
    return 1


def _result_summary(result: "FuzzResult") -> int:
    return _summary(result.engine, result.examples, result.elapsed_s,
                    result.failure.headline if result.failure else None, result.report_dir)


def _summary(engine: str, examples: int, elapsed: float, headline: Optional[str], report: Any) -> int:
    from mlx_invariants.fuzz.report import replay_command

    if headline is None:
        print(f"{engine}: no violation in {examples} example(s), {elapsed:.1f}s")
        return 0
    print(f"{engine}: VIOLATION after {examples} example(s), {elapsed:.1f}s: {headline}")
    if report:
        print(f"report: {report}/report.txt")
        print(f"replay: {replay_command(Path(report) / 'scenario.json')}")
    return 1


class _ProgressLine:
    """One status line on stderr: rewritten in place on a terminal, every few seconds otherwise."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.last = 0.0
        self.shown = False

    def update(self, state: "Progress") -> None:
        phase = state.phase.value
        self.show(f"{state.examples} examples, {state.elapsed_s:.0f}s/{state.budget_s:.0f}s, "
                  f"{'FAILING, ' + phase if state.failed else phase}: {state.scenario[:70]}")

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
