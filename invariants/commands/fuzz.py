"""Cancellation-fuzz an engine: concurrent requests, cancels, aborts, disconnects, MLX errors and
shutdowns at named points, with the MLX access sentinel watching every entry into MLX.

Exit status: 0 no new finding, 1 new finding(s) (reports written), 2 usage or setup error.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import textwrap
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from mlx_invariants.errors import UsageError
from mlx_invariants.fuzz.defaults import CONFIRM, HTTP_MODEL, REPLAYS, REPORT_DIR, ROUTE
from mlx_invariants.fuzz.profiles import PROFILES
from mlx_invariants.fuzz.scenario import FAULT_KINDS, ROUTES
from mlx_invariants.fuzz.settings import FuzzSettings
from mlx_invariants.fuzz.target import Target

if TYPE_CHECKING:
    from mlx_invariants.fuzz.runner import FuzzResult, Progress
    from mlx_invariants.fuzz.summary import RunSummary


def add_arguments(parser: argparse.ArgumentParser) -> None:
    target = parser.add_argument_group("what to fuzz (one of)")
    target.add_argument("--engine", metavar="simple|batched|http-simple|http-batched|MODULE:FACTORY",
                        help="a reference engine route; http-ROUTE: that route behind its own HTTP app (the one "
                             "`invariants serve` runs), served on 127.0.0.1 inside this process, so requests go "
                             "over HTTP while the engine's points, threads and MLX stay in sight; or a factory "
                             f"returning an adapter or a reference-API engine (default: {ROUTE})")
    target.add_argument("--url", help="an OpenAI-compatible server already running on a loopback address")
    target.add_argument("--server-cmd", metavar="CMD",
                        help="start this server command on a free 127.0.0.1 port ({port} in CMD) with the "
                             "MLX sentinel injected, fuzz it over HTTP, stop it")
    target.add_argument("--owner", metavar="GLOB",
                        help="--url/--server-cmd: thread-name glob of the server's MLX owner thread; MLX entered "
                             "on any other thread is then a violation (default: none declared: another thread "
                             "than the first into MLX is reported only where the server's MLX version shares "
                             "one stream between threads, before 0.31.2)")
    target.add_argument("--model", help=f"--url/--server-cmd: the model name sent in requests "
                                        f"(default: {HTTP_MODEL}, as mlx_lm.server expects)")
    target.add_argument("--routes", metavar="completions,chat",
                        help="--url/--server-cmd: the OpenAI routes the server answers, comma-separated; requests "
                             "and the follow-up use only these (default: both)")
    target.add_argument("--request-body", metavar="JSON",
                        help="--url/--server-cmd: a JSON object merged into every request body, over the fuzzer's "
                             "own fields (e.g. '{\"temperature\": 0.1}' for a server that rejects 0.0)")
    target.add_argument("--health", metavar="PATH",
                        help="--url/--server-cmd: the server's health route (e.g. /health); after a worker fault "
                             "it must stop answering 200 (health-lies), and between scenarios a server whose "
                             "route does not answer 200 is replaced")
    target.add_argument("--faults", metavar="KIND,...",
                        help="the fault kinds scenarios draw, comma-separated (default: every kind the target "
                             "takes but the opt-in ones, which kill or wedge the engine's worker: worker-dies, worker-wedges; "
                             "with --server-cmd they are armed in the server's sentinel); "
                             "docs/fuzz-reference.md says what each does")
    target.add_argument("--capacity", type=int, metavar="N",
                        help="requests the target holds at once (slots and queue); scenarios draw a few more. "
                             "Default: what the engine's adapter reports; a server's is unknown unless given, "
                             "and then the profile's number of requests is drawn")
    run_group = parser.add_argument_group("how long")
    run_group.add_argument("--budget", type=float, metavar="SECONDS",
                           help="wall-clock budget; alone, no example cap applies (default: the profile's "
                                "budget and example cap)")
    run_group.add_argument("--examples", type=int, metavar="N", help="stop after N examples (default: none with "
                                                                     "--budget, else the profile's cap)")
    run_group.add_argument("--keep-going", action="store_true",
                           help="after a finding, search on until the budget ends; each distinct finding "
                                "(oracle and engine frames) is shrunk, for at most a quarter of the budget left, "
                                "and reported once")
    run_group.add_argument("--seed", type=int, metavar="N", help="Hypothesis seed (default: derandomized in ci)")
    run_group.add_argument("--profile", choices=tuple(PROFILES), default="ci", help=_profiles_help())
    run_group.add_argument("--jobs", type=int, default=1, metavar="N",
                           help="child processes fuzzing in parallel, each with its own seed; 0 runs in this process")
    run_group.add_argument("--exhaustive", action="store_true",
                           help="instead of sampling, run every single-fault scenario for one and two requests "
                                "(two streaming, or a streaming and a plain one)")
    run_group.add_argument("--steer", action="store_true",
                           help="end each round that is not derandomized (runner profile, --seed) in Hypothesis's "
                                "target phase, climbing towards scenarios that came near firing a timing oracle "
                                "(off by default: it has not been shown to find bugs sooner, docs/fuzz.md)")
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
    out.add_argument("--confirm", type=int, default=CONFIRM, metavar="K",
                     help=f"a finding of an inexact oracle counts only if K of the --replays re-runs show it "
                          f"again (default: {CONFIRM}); others are listed as unconfirmed")
    out.add_argument("--baseline", metavar="FILE",
                     help="accepted findings (from --write-baseline): listed, not failing the run")
    out.add_argument("--write-baseline", metavar="FILE",
                     help="write every finding of this run (and --baseline's) to FILE as accepted; exits 0")
    out.add_argument("--database", metavar="DIR|redis://HOST:PORT/DB",
                     help="the Hypothesis example database: a directory, or a Redis server shared by a fleet of "
                          "runners (needs the 'redis' extra); its failures for this target are replayed first, "
                          "and what the run finds is written to it (default: the profile's, see --profile)")
    out.add_argument("--database-readonly", action="store_true",
                     help="read the example database, write nothing to it (pull-request runs of a shared one)")
    out.add_argument("--strict", action="store_true", help="the sentinel refuses bad MLX entries (raises)")


def _profiles_help() -> str:
    return "how to search (default: ci): " + "; ".join(f"{name}: {p.describe()}" for name, p in PROFILES.items())


def run(args: argparse.Namespace) -> int:
    from mlx_invariants.extras import require

    require("fuzz", "hypothesis", "mlx.core")
    if args.jobs < 0:
        raise UsageError("--jobs must be >= 0")
    if args.replay and args.exhaustive:
        raise UsageError("--replay and --exhaustive do not mix")
    if args.replay and (args.baseline or args.write_baseline or args.keep_going):
        raise UsageError("--baseline, --write-baseline and --keep-going apply to a search, not to --replay")
    if args.capacity is not None and (args.replay or args.exhaustive):
        raise UsageError("--capacity applies to a search, not to --replay or --exhaustive")
    if (args.database or args.database_readonly) and (args.replay or args.exhaustive):
        raise UsageError("--database and --database-readonly apply to a search, not to --replay or --exhaustive")
    target = target_of(args)
    if args.replay:
        return _replay(args, target)
    if target is None:
        target = Target.reference(ROUTE)
    settings = settings_of(args)
    if not args.exhaustive:
        _check_database(settings)
    if args.exhaustive:
        return _exhaustive(target, settings, args)
    if args.jobs == 0:
        return _in_process(target, settings, args)
    return _children(target, settings, args.jobs, args)


def _accept(args: argparse.Namespace, settings: FuzzSettings, summary: "RunSummary", code: int) -> int:
    """With --write-baseline, accept what was found (and what the baseline read held); the run then passes."""
    if not args.write_baseline:
        return code
    from mlx_invariants.fuzz.baseline import write_baseline

    findings = [f.to_json() for f in summary.findings]
    path = write_baseline(args.write_baseline, findings, keep=settings.baseline)
    print(f"baseline: wrote {path} accepting {len(findings) + len(settings.baseline)} signature(s)")
    return 0


def target_of(args: argparse.Namespace) -> Optional[Target]:
    """The target the flags name, or None if they name none (a replay then uses the file's)."""
    chosen = [flag for flag, value in (("--engine", args.engine), ("--url", args.url),
                                       ("--server-cmd", args.server_cmd)) if value]
    if len(chosen) > 1:
        raise UsageError(f"choose one of {', '.join(chosen)}")
    http = {"owner": args.owner, "model": args.model or HTTP_MODEL, "routes": _routes(args.routes),
            "request_body": args.request_body or "", "health": args.health or ""}
    if (args.owner or args.model or args.request_body or args.health) and not (args.url or args.server_cmd):
        raise UsageError("--owner, --model, --request-body and --health go with --url or --server-cmd")
    if args.routes and not (args.url or args.server_cmd):
        raise UsageError("--routes goes with --url or --server-cmd")
    if args.url:
        target = Target.url(args.url, **http)
    elif args.server_cmd:
        target = Target.server(args.server_cmd, **http)
    elif args.engine:
        target = Target.engine(args.engine)
    else:
        if args.faults:
            raise UsageError("--faults goes with --engine, --url or --server-cmd")
        return None
    return dataclasses.replace(target, fault_kinds=_faults(args.faults)) if args.faults else target


def _faults(value: str) -> tuple[str, ...]:
    """`--faults cancel,worker-dies` as a tuple; an unknown kind is a usage error naming the known ones."""
    kinds = tuple(dict.fromkeys(kind.strip() for kind in value.split(",") if kind.strip()))
    unknown = [kind for kind in kinds if kind not in FAULT_KINDS]
    if unknown or not kinds:
        raise UsageError(f"--faults: {', '.join(unknown) or 'none given'}; choose from {', '.join(FAULT_KINDS)}")
    return kinds


def _routes(value: Optional[str]) -> tuple[str, ...]:
    """`--routes chat,completions` as a tuple (both when not given); a route no server has is a usage error."""
    if not value:
        return ROUTES
    routes = tuple(dict.fromkeys(r.strip() for r in value.split(",") if r.strip()))
    if not routes or not set(routes) <= set(ROUTES):
        raise UsageError(f"--routes takes some of {', '.join(ROUTES)}, comma-separated; got {value!r}")
    return routes


def settings_of(args: argparse.Namespace) -> FuzzSettings:
    from mlx_invariants.fuzz.baseline import load_baseline

    report = Path(args.report).resolve()
    baseline = tuple(sorted(load_baseline(args.baseline))) if args.baseline else ()
    return FuzzSettings(profile=args.profile, budget_s=args.budget, examples=args.examples, seed=args.seed,
                        replays=args.replays, confirm=args.confirm, keep_going=args.keep_going, baseline=baseline,
                        reuse=False if args.fresh_engine else None, strict=args.strict, capacity=args.capacity,
                        steer=args.steer,
                        database=args.database, database_readonly=args.database_readonly,
                        report_dir=str(report), workdir=str(report / "work"))


def _check_database(settings: FuzzSettings) -> None:
    """A Redis database without its client, or whose server does not answer, is a usage error now, once,
    not a traceback in every job later."""
    from mlx_invariants.fuzz.database import open_database

    path = settings.database_path()
    if path is not None:
        open_database(path, readonly=settings.database_readonly)
    elif settings.database_readonly:
        print(f"invariants fuzz: no example database to read (no --database, and the {settings.profile} profile "
              "has none): --database-readonly has nothing to do", file=sys.stderr)


def _in_process(target: Target, settings: FuzzSettings, args: argparse.Namespace) -> int:
    from mlx_invariants.fuzz.runner import run_fuzz

    line = _ProgressLine()
    result = run_fuzz(target, settings, progress=line.update)
    line.done()
    return _result_summary(result, args, settings)


def _exhaustive(target: Target, settings: FuzzSettings, args: argparse.Namespace) -> int:
    from mlx_invariants.fuzz.runner import run_exhaustive

    line = _ProgressLine()
    result = run_exhaustive(target, settings, progress=line.update)
    line.done()
    return _result_summary(result, args, settings)


def _children(target: Target, settings: FuzzSettings, jobs: int, args: argparse.Namespace) -> int:
    from mlx_invariants.fuzz.jobs import run_jobs

    line = _ProgressLine()

    def progress(states: list[dict[str, Any]]) -> None:
        cap = states[0].get("examples_cap")
        line.show(f"{sum(s['examples'] for s in states)}{f'/{cap * jobs}' if cap else ''} examples in {jobs} "
                  f"job(s), {sum(s.get('findings', 0) for s in states)} finding(s), "
                  f"{sum(bool(s['failed']) for s in states)} job(s) failing, "
                  f"{max(s['elapsed_s'] for s in states):.0f}s")
    run = run_jobs(target, settings, jobs, Path(settings.workdir), progress)
    line.done()
    return _accept(args, settings, run.summary, print_summary(run.summary))


def _replay(args: argparse.Namespace, target: Optional[Target]) -> int:
    from mlx_invariants.fuzz.replay import replay
    from mlx_invariants.fuzz.report import write_report

    times = max(args.replays, 1)
    result = replay(args.replay, target, times=times, strict=args.strict)
    print(f"replayed {result.scenario.describe()} on {result.target.label}: violations in {result.reproduced}/{times} run(s)")
    if result.failure is None:
        return 0
    folder = write_report(args.report, result.failure)
    print((folder / "report.txt").read_text(), end="")
    print(f"report: {folder}")
    return 1


def _result_summary(result: "FuzzResult", args: argparse.Namespace, settings: FuzzSettings) -> int:
    from mlx_invariants.fuzz.evidence import summarize

    summary = result.summary or summarize(result)
    return _accept(args, settings, summary, print_summary(summary))


def print_summary(summary: "RunSummary") -> int:
    """Print the verdict, each new finding with its report and replay command (`render_finding`), a line
    for each other one, the crashed jobs and the run folder; returns the exit status (1: something new
    was found or a job crashed)."""
    from mlx_invariants.fuzz.summary import render_finding

    counts = summary.counts
    noted = ", ".join(f"{counts[s]} {s}" for s in ("accepted", "unconfirmed") if counts[s])
    startup = f" after a {summary.startup_s:.1f}s start-up" if summary.startup_s else ""  # outside the budget
    where = (f"in {summary.examples} example(s), {summary.elapsed_s:.1f}s{startup}"
             + (f" ({summary.limits()})" if summary.budget_s else ""))
    found = f"{len(summary.new_findings) + len(summary.crashes)} new finding(s)" if summary.failed else "no new finding"
    print(f"{summary.label}: {found} {where}" + (f"; {noted}" if noted else ""))
    for finding in summary.new_findings:
        print(textwrap.indent(render_finding(finding), "  "))
    for crash in summary.crashes:
        print(f"  VIOLATION process-crashed: {crash.why}")
        if crash.report:
            print(f"      report: {crash.report}/report.txt")
            print(f"      replay: {crash.replay}")
    for finding in summary.findings:
        if not finding.new:
            print(textwrap.indent(render_finding(finding, detail=False), "  "))
    if summary.run_dir:
        print(f"run folder: {summary.run_dir} (summary.md, summary.json, junit.xml)")
    return summary.exit_code


class _ProgressLine:
    """One status line on stderr: rewritten in place on a terminal, every few seconds otherwise."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.last = 0.0
        self.shown = False

    def update(self, state: "Progress") -> None:
        phase = state.phase.value
        cap = f"/{state.examples_cap} (cap)" if state.examples_cap else ""
        self.show(f"{state.examples}{cap} examples, {state.elapsed_s:.0f}s/{state.budget_s:.0f}s, "
                  f"{state.findings} finding(s), "
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
