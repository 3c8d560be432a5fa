"""Mutants nobody planted: what the static check, the engine tests and the fuzzer do on engine bugs
that no catalogue entry contains.

The catalogue (invariants/mutants/catalogue.py) is always 100% killed, but it holds only the bugs we
wrote on purpose, and each layer was tuned until it caught them. This benchmark generates mutants of
the reference engine mechanically, by concurrency-relevant operators on the libcst tree, and runs
each one through the catalogue's own machinery (`Workspace`, the layers, `Runner`, every layer on
every mutant). Every candidate site is listed first and counted per operator; a seed picks the
sample, round-robin over the operators, so a run is reproducible and no operator is left out.

One rule skips a mutant as equivalent without running it: the mutated module compiles to the same
AST as the original. Where two operators make the same module (a counter decrement that is also a
`finally:` statement), it is one mutant, the more specific operator's (`OPERATORS` is in that order).
Every other survivor is printed with its change, for a human to judge.

    .venv/bin/python benchmarks/unseen_mutants.py --list
    .venv/bin/python benchmarks/unseen_mutants.py --sample 14 --seed 1 --fuzz-budget 40

Not a test: it prints the table and summary for docs/benchmarks.md ("Fuzzer: mutants nobody planted").
"""

from __future__ import annotations

import argparse
import ast
import datetime
import os
import random
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

ROOT = Path(__file__).resolve().parents[1]

# -- the operators ------------------------------------------------------------------------------------

RELEASES = frozenset({"release", "leave", "_release"})  # methods that give back a lock, a semaphore or a slot
REMOVALS = frozenset({"pop", "remove", "discard", "clear"})  # a bare call of one: an entry of tracked state goes
OPERATORS = {  # specific first: where two operators make the same module, the mutant is the first one's
    "drop-shield": "`asyncio.shield(x)` becomes `x`: a cancel reaches what was protected",
    "release-early": "a release/leave call moves one statement up (out of its `finally:` to before the `try` "
                     "when it is the first there); a `with` block's last statement moves after the block",
    "cancel-swallow": "a `raise` that re-raises cancellation (in an `except CancelledError/BaseException`, "
                      "or `raise asyncio.CancelledError()`) becomes `pass`",
    "threadsafe-direct": "`loop.call_soon_threadsafe(f, *a)` becomes `f(*a)`, run on the calling thread",
    "offload-direct": "`await asyncio.to_thread(f, *a)` / `await loop.run_in_executor(ex, f, *a)` becomes `f(*a)`",
    "timeout-drop": "`asyncio.wait_for(x, t)` becomes `await`ing `x` with no bound",
    "status-drop": "a counter decrement (`x -= 1`) or a bare `del x[k]` / `x.pop|remove|discard|clear(...)` "
                   "statement is deleted",
    "finally-drop": "one statement of a `finally:` block is deleted (`pass` if it was the only one)",
}


@dataclass(frozen=True)
class Site:
    """One place an operator can change, and the module it produces there."""

    operator: str
    path: str      # as the repository names it: engine/serial.py
    line: int
    change: str    # the change, in one line, for the table and for a human judging a survivor
    original: str
    mutated: str

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass(frozen=True)
class _Candidate:
    operator: str
    anchor: cst.CSTNode       # where the line number is read
    old: cst.CSTNode          # replaced, by identity, in the module
    new: cst.CSTNode
    change: str


class _Walk(cst.CSTVisitor):
    """Every node with its ancestors, in source order."""

    def __init__(self) -> None:
        self.stack: list[cst.CSTNode] = []
        self.nodes: list[tuple[cst.CSTNode, tuple[cst.CSTNode, ...]]] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.nodes.append((node, tuple(self.stack)))
        self.stack.append(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self.stack.pop()


def _code(node: cst.CSTNode) -> str:
    return " ".join(cst.Module(body=[]).code_for_node(node).split())


def _called(node: cst.CSTNode, *names: str) -> bool:
    """`node` is a call of `asyncio.NAME(...)`, `x.NAME(...)` or `NAME(...)` for one of `names`."""
    if not isinstance(node, cst.Call):
        return False
    func = node.func
    return (isinstance(func, cst.Attribute) and func.attr.value in names) or (
        isinstance(func, cst.Name) and func.value in names)


def _lone(statement: cst.CSTNode) -> Optional[cst.BaseSmallStatement]:
    """The only small statement of a simple statement line, else None."""
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        return statement.body[0]
    return None


def _without(block: cst.BaseSuite, index: int) -> cst.BaseSuite:
    body = list(block.body)
    del body[index]
    return block.with_changes(body=body or [cst.SimpleStatementLine([cst.Pass()])])


def _unwrap(operator: str, node: cst.Call) -> _Candidate:
    """`f(x, ...)` becomes `x`."""
    inner = node.args[0].value
    return _Candidate(operator, node, node, inner, f"{_code(node)} -> {_code(inner)}")


def _drop_shield(node, parents) -> Iterator[_Candidate]:
    if _called(node, "shield") and len(node.args) == 1:
        yield _unwrap("drop-shield", node)


def _timeout_drop(node, parents) -> Iterator[_Candidate]:
    if _called(node, "wait_for") and node.args:
        yield _unwrap("timeout-drop", node)


def _threadsafe_direct(node, parents) -> Iterator[_Candidate]:
    if _called(node, "call_soon_threadsafe") and node.args:
        direct = cst.Call(node.args[0].value, [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in node.args[1:]])
        yield _Candidate("threadsafe-direct", node, node, direct, f"{_code(node)} -> {_code(direct)}")


def _offload_direct(node, parents) -> Iterator[_Candidate]:
    if not isinstance(node, cst.Await):
        return
    call, skip = node.expression, 0
    if _called(call, "to_thread"):
        skip = 1
    elif _called(call, "run_in_executor"):
        skip = 2
    if skip and len(call.args) >= skip:
        args = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in call.args[skip:]]
        direct = cst.Call(call.args[skip - 1].value, args)
        yield _Candidate("offload-direct", node, node, direct, f"{_code(node)} -> {_code(direct)}")


def _cancel_swallow(node, parents) -> Iterator[_Candidate]:
    if not isinstance(node, cst.Raise):
        return
    handler = next((p for p in reversed(parents) if isinstance(p, (cst.ExceptHandler, cst.FunctionDef))), None)
    in_cancel_handler = (isinstance(handler, cst.ExceptHandler) and handler.type is not None
                         and any(name in _code(handler.type) for name in ("CancelledError", "BaseException")))
    raises_cancel = node.exc is not None and "CancelledError" in _code(node.exc)
    if (in_cancel_handler and node.exc is None) or raises_cancel:
        yield _Candidate("cancel-swallow", node, node, cst.Pass(), f"{_code(node)} -> pass")


def _status_drop(node, parents) -> Iterator[_Candidate]:
    if not isinstance(node, cst.IndentedBlock):
        return
    for index, statement in enumerate(node.body):
        small = _lone(statement)
        decrement = (isinstance(small, cst.AugAssign) and isinstance(small.operator, cst.SubtractAssign)
                     and isinstance(small.value, cst.Integer))
        deletes = isinstance(small, cst.Del) and isinstance(small.target, cst.Subscript)
        removes = isinstance(small, cst.Expr) and _called(small.value, *REMOVALS) and isinstance(
            small.value.func, cst.Attribute)
        if decrement or deletes or removes:
            yield _Candidate("status-drop", statement, node, _without(node, index), f"deleted: {_code(statement)}")


def _finally_drop(node, parents) -> Iterator[_Candidate]:
    if isinstance(node, cst.Finally):
        block = node.body
        for index, statement in enumerate(block.body):
            yield _Candidate("finally-drop", statement, block, _without(block, index), f"deleted: {_code(statement)}")


def _release_early(node, parents) -> Iterator[_Candidate]:
    if isinstance(node, (cst.With,)) and isinstance(node.body, cst.IndentedBlock) and len(node.body.body) >= 2:
        yield from _with_exit_early(node, parents)
    if not isinstance(node, cst.IndentedBlock):
        return
    for index, statement in enumerate(node.body):
        small = _lone(statement)
        if not (isinstance(small, cst.Expr) and _called(small.value, *RELEASES)
                and isinstance(small.value.func, cst.Attribute)):
            continue
        if index > 0:
            body = list(node.body)
            body[index - 1], body[index] = body[index], body[index - 1]
            yield _Candidate("release-early", statement, node, node.with_changes(body=body),
                             f"{_code(statement)} moved above {_code(node.body[index - 1])}")
            continue
        finally_, try_, outer = parents[-3:][::-1] if len(parents) >= 3 else (None, None, None)
        if not (isinstance(finally_, cst.Finally) and isinstance(try_, cst.Try)
                and isinstance(outer, (cst.IndentedBlock, cst.Module))):
            continue
        moved_try = try_.with_changes(finalbody=finally_.with_changes(body=_without(node, index)))
        at = list(outer.body).index(try_)
        body = [*outer.body[:at], statement, moved_try, *outer.body[at + 1:]]
        yield _Candidate("release-early", statement, outer, outer.with_changes(body=body),
                         f"{_code(statement)} moved out of `finally:` to before the `try`")


def _with_exit_early(node: cst.With, parents) -> Iterator[_Candidate]:
    outer = parents[-1] if parents else None
    if not isinstance(outer, (cst.IndentedBlock, cst.Module)):
        return
    last = node.body.body[-1]
    shorter = node.with_changes(body=node.body.with_changes(body=node.body.body[:-1]))
    at = list(outer.body).index(node)
    body = [*outer.body[:at], shorter, last, *outer.body[at + 1:]]
    yield _Candidate("release-early", last, outer, outer.with_changes(body=body),
                     f"{_code(last)} moved out of `with {_code(node.items[0])}`")


FINDERS: tuple[Callable[..., Iterator[_Candidate]], ...] = (
    _drop_shield, _release_early, _finally_drop, _cancel_swallow, _threadsafe_direct, _status_drop,
    _offload_direct, _timeout_drop)


def sites_in(source: str, path: str) -> tuple[list[Site], int]:
    """Every mutation site of `source` (named `path`), and how many were skipped as equivalent (same AST)."""
    wrapper = MetadataWrapper(cst.parse_module(source))
    module, positions = wrapper.module, wrapper.resolve(PositionProvider)
    walk = _Walk()
    module.visit(walk)
    baseline = ast.dump(ast.parse(source))
    found: dict[str, Site] = {}  # by mutated module
    equivalent = 0
    for node, parents in walk.nodes:
        for finder in FINDERS:
            for candidate in finder(node, parents):
                mutated = module.deep_replace(candidate.old, candidate.new).code
                compile(mutated, path, "exec")  # a generator bug, not a mutant, if this raises
                if ast.dump(ast.parse(mutated)) == baseline:
                    equivalent += 1
                    continue
                site = Site(candidate.operator, path, positions[candidate.anchor].start.line, candidate.change,
                            source, mutated)
                if mutated not in found or _rank(site) < _rank(found[mutated]):
                    found[mutated] = site
    return sorted(found.values(), key=lambda s: (s.line, _rank(s))), equivalent


def _rank(site: Site) -> int:
    return list(OPERATORS).index(site.operator)


def find_sites(engine: Path) -> tuple[list[Site], int]:
    """Every site in the engine package at `engine`, in file then source order, and the equivalents skipped."""
    sites, skipped = [], 0
    for module in sorted(engine.rglob("*.py")):
        path = "engine/" + module.relative_to(engine).as_posix()
        found, equivalent = sites_in(module.read_text(), path)
        sites += found
        skipped += equivalent
    return sites, skipped


def sample(sites: Sequence[Site], n: int, seed: int) -> list[Site]:
    """`n` sites picked by `seed`: the operators in a seeded order, then one site of each in turn."""
    rng = random.Random(seed)
    pools = {op: [s for s in sites if s.operator == op] for op in OPERATORS}
    for pool in pools.values():
        rng.shuffle(pool)
    order = [op for op in OPERATORS if pools[op]]
    rng.shuffle(order)
    picked: list[Site] = []
    while len(picked) < n and any(pools.values()):
        for op in order:
            if pools[op] and len(picked) < n:
                picked.append(pools[op].pop())
    return picked


# -- running them through the catalogue's layers ----------------------------------------------------

CORE_TESTS = tuple(f"tests/engine/test_{name}.py" for name in
                   ("serial", "batched", "threads", "status_held", "exit", "prefill", "kv_cache"))
HTTP_TESTS = tuple(f"tests/engine/test_{name}.py" for name in ("http", "http_bad_input", "http_serve"))


def routes_for(path: str) -> tuple[str, ...]:
    """The reference routes whose code `path` is; none for the HTTP layer, which the in-process fuzzer never drives."""
    if path.startswith("engine/http/"):
        return ()
    if path == "engine/serial.py":
        return ("simple",)
    if path in ("engine/batched.py", "engine/prefill.py", "engine/kv_cache.py"):
        return ("batched",)
    return ("simple", "batched")


def to_mutant(index: int, site: Site):
    """The site as a catalogue `Mutant`: one whole-module `Edit`, the engine tests of its layer, its routes."""
    from mlx_invariants.mutants import Edit, Mutant

    tests = HTTP_TESTS if site.path.startswith("engine/http/") else CORE_TESTS
    return Mutant(id=f"U{index:02d}-{site.operator}", title=f"{site.operator} at {site.where}",
                  story=site.change, invariant="(unplanted: whatever the change breaks)",
                  killers=tuple(f"test:{t}" for t in tests), edits=(Edit(site.path, site.original, site.mutated),),
                  routes=routes_for(site.path))


LAYER_NAMES = {"static": "check", "tests": "tests", "fuzz": "fuzz"}


def _cell(result, layer: str, fuzzed: bool) -> str:
    if layer == "fuzz" and not fuzzed:
        return "n/a"
    outcomes = [o for o in result.outcomes if o.layer == layer]
    if not outcomes:
        return "not run"
    killed = [o for o in outcomes if o.killed]
    if killed:
        return f"KILL {killed[0].by.removeprefix('tests/engine/')}"
    bad = [o.verdict for o in outcomes if o.verdict in ("error", "timeout")]
    return bad[0] if bad else "survived"


def render(results, sites: Sequence[Site], layers: Sequence[str], kind: str = "operator",
           place: str = "file:line") -> str:
    """A markdown table: one row per mutant, a cell per layer, who killed it and the time it took.

    `sites` need only `operator` (shown under `kind`), `where` (under `place`) and `change`:
    benchmarks/planted/run.py passes its regressions' class, files and title.
    """
    head = ["mutant", kind, place, *(LAYER_NAMES[name] for name in layers), "killed by", "time"]
    rows = [head, ["---"] * len(head)]
    for result, site in zip(results, sites):
        fuzzed = bool(result.mutant.routes)
        by = [LAYER_NAMES[name] for name in layers if any(o.layer == name and o.killed for o in result.outcomes)]
        rows.append([result.mutant.id, site.operator, site.where,
                     *(_cell(result, name, fuzzed) for name in layers),
                     " + ".join(by) or "none", f"{result.seconds:.0f}s" if result.ran else "not run"])
    return "\n".join("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows)


def summarize(results, sites: Sequence[Site], layers: Sequence[str]) -> str:
    ran = [r for r in results if r.ran]
    lines = [f"{len(ran)} of {len(results)} mutants ran."]
    for name in layers:
        pool = [r for r in ran if name != "fuzz" or r.mutant.routes]
        killed = sum(any(o.layer == name and o.killed for o in r.outcomes) for r in pool)
        problems = sum(any(o.layer == name and o.verdict in ("error", "timeout") for o in r.outcomes) for r in pool)
        extra = f", {problems} error/timeout (not kills)" if problems else ""
        lines.append(f"- {LAYER_NAMES[name]}: killed {killed} of {len(pool)}{extra}")
    if "fuzz" in layers:
        fuzzed = [r for r in ran if r.mutant.routes]
        past = [r for r in fuzzed if not any(o.layer == "fuzz" and o.killed for o in r.outcomes)]
        lines.append(f"- past the fuzzer: {len(past)} of {len(fuzzed)} it ran on "
                     f"({len(ran) - len(fuzzed)} in engine/http/, which its in-process routes never drive)")
    survivors = [(r, s) for r, s in zip(results, sites) if r.ran and not r.killed]
    lines.append(f"- past every layer run: {len(survivors)} of {len(ran)}")
    if survivors:
        lines.append("\nSurvivors (judge each: equivalent here, or a gap in the harness):")
        lines += [f"- {r.mutant.id} {s.where}: {s.change}" for r, s in survivors]
    return "\n".join(lines)


# -- the command ---------------------------------------------------------------------------------------

def _context(args: argparse.Namespace) -> str:
    def git(*argv: str) -> Optional[str]:
        done = subprocess.run(["git", *argv], cwd=args.repo, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "--short", "HEAD")
    if commit is None:
        tree = f"{args.repo} (not a git checkout)"
    else:
        dirty = git("status", "--porcelain", "--", "engine", "fuzz", "invariants")
        tree = f"commit {commit}" + (" with uncommitted changes to engine/, fuzz/ or invariants/" if dirty else "")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    now = datetime.datetime.now(datetime.timezone.utc)
    return f"{now:%Y-%m-%d %H:%M} UTC, {tree}, {os.cpu_count()} cores, load average {load}"


def add_layer_options(parser: argparse.ArgumentParser) -> None:
    """The options of a run through the layers, shared with benchmarks/planted/run.py."""
    parser.add_argument("--fuzz-budget", type=float, default=40.0, metavar="SECONDS",
                        help="the fuzzer's wall budget per route, ci profile otherwise (default 40)")
    parser.add_argument("--layers", default="static,tests,fuzz", metavar="LIST",
                        help="comma-separated layers to run (default static,tests,fuzz)")
    parser.add_argument("--jobs", type=int, default=1, metavar="N", help="mutants checked at once (default 1)")
    parser.add_argument("--full-tests", action="store_true", help="the whole tests/engine per mutant")
    parser.add_argument("--repo", type=Path, default=ROOT, help="the repository holding engine/ (default: this one)")


def chosen_layers(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """`--layers` as a list, after the checks every run needs (a usage error otherwise)."""
    layers = [name.strip() for name in args.layers.split(",") if name.strip()]
    if not layers or any(name not in LAYER_NAMES for name in layers):
        parser.error(f"--layers takes a comma-separated subset of {','.join(LAYER_NAMES)}, got {args.layers!r}")
    if args.fuzz_budget <= 0:
        parser.error("--fuzz-budget must be positive")
    if not (args.repo / "engine" / "__init__.py").is_file():
        parser.error(f"{args.repo} has no engine package; pass --repo")
    return layers


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print every candidate site and the sample; run nothing")
    parser.add_argument("--sample", type=int, default=14, metavar="N", help="mutants to run (default 14)")
    parser.add_argument("--seed", type=int, default=1, help="picks the sample (default 1)")
    add_layer_options(parser)
    args = parser.parse_args(argv)
    layers = chosen_layers(parser, args)
    if args.sample < 1:
        parser.error("--sample must be positive")
    with tempfile.TemporaryDirectory(prefix="unseen-mutants-") as tmp:
        return _measure(args, layers, snapshot(args.repo.resolve(), Path(tmp)))


def snapshot(repo: Path, into: Path) -> Path:
    """What a `Workspace` copies from `repo`, copied once: every mutant and baseline sees the same engine
    even while someone edits the tree during a run that takes many minutes."""
    from mlx_invariants.mutants.copies import IGNORED
    from mlx_invariants.mutants.workspace import COPIED

    for name in ("engine", *COPIED):
        source, target = repo / name, into / name
        if source.is_dir():
            shutil.copytree(source, target, ignore=IGNORED)
        elif source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return into


def _measure(args: argparse.Namespace, layers: list[str], repo: Path) -> int:
    engine = repo / "engine"
    sites, skipped = find_sites(engine)
    print(f"{len(sites)} candidate sites in engine/ ({skipped} skipped as equivalent: same AST as the original)")
    for op, doc in OPERATORS.items():
        print(f"  {op:18} {sum(s.operator == op for s in sites):3}  {doc}")
    if args.list:
        for site in sites:
            print(f"{site.operator:18} {site.where:28} {site.change}")
    picked = sample(sites, args.sample, args.seed)
    mutants = [to_mutant(i, site) for i, site in enumerate(picked, 1)]
    print(f"\nsample (seed {args.seed}): " + ", ".join(f"{m.id} {s.where}" for m, s in zip(mutants, picked)))
    if args.list:
        return 0
    return measure(args, layers, repo, mutants, picked)[0]


def measure(args: argparse.Namespace, layers: list[str], repo: Path, mutants: Sequence, sites: Sequence,
            kind: str = "operator", place: str = "file:line"):
    """Run `mutants` through `layers` (every layer on every one) on the snapshot `repo`; print the table and
    the summary. Returns the exit code and the runner's report (None when nothing ran); `sites` describe
    the mutants one for one (see `render`). Shared with benchmarks/planted/run.py."""
    from mlx_invariants.mutants.errors import MutantsError
    from mlx_invariants.mutants.layers import Settings
    from mlx_invariants.mutants.runner import Runner

    settings = Settings(fuzz_budget_s=args.fuzz_budget, full_tests=args.full_tests)
    runner = Runner(repo, settings, jobs=args.jobs, all_layers=True, layer_names=layers,
                    progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(f"\nstarted: {_context(args)}", flush=True)
    try:
        report = runner.run(mutants)
    except MutantsError as exc:
        print(f"{Path(sys.argv[0]).name}: {exc}", file=sys.stderr)
        return 2, None
    print(f"ended:   {_context(args)}\n")
    if not report.baseline_clean:
        failing = "; ".join(f"{o.layer} {o.verdict} {o.by}" for o in report.baseline.outcomes
                            if o.verdict != "survived")
        print(f"the unmutated engine fails its own checks ({failing}); no mutant result would mean anything")
        return 1, report
    for layer, why in report.skipped_layers.items():
        print(f"note: the {layer} layer did not run: {why}")
    print(render(report.results, sites, runner.layers, kind, place))
    print()
    print(summarize(report.results, sites, runner.layers))
    return 0, report


if __name__ == "__main__":
    sys.exit(main())
