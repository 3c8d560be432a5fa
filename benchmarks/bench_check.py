"""Time `invariants check` side by side with flake8-async and Fixit on large real trees,
and against its floor: libcst's own parse of the same files.

A script, not a test. It installs flake8 + flake8-async and Fixit into a throwaway venv
(never into the project's), then prints lines/second for each tool, cold and for a
re-run of the unchanged tree, in one process and on two:

    .venv/bin/python benchmarks/bench_check.py                  # mlx_lm and transformers
    .venv/bin/python benchmarks/bench_check.py --tree path/to/pkg --competitor-lines 20000

flake8-async and Fixit run at a few hundred to a thousand lines a second, so on a tree
larger than --competitor-lines they run on an evenly spread sample of its files of about
that many lines, and the table says so; invariants always runs on the whole tree. Every
tool reads a copy of the tree's .py files in a temporary folder outside any git checkout
(Fixit skips files its nearest .gitignore ignores, such as anything under .venv/).

`--floor` instead compares a cold `invariants check` (empty cache) with a bare libcst
parse of the same files, each in a fresh process, and prints the ratio, the cold check
without its package model (the per-file rules only: what the model costs), the re-run of
the unchanged tree, the re-run after one file is edited (`--edit`: that file where a tree has
it, else its first file with an `async def`), and the peak RSS of each; on vllm-mlx's HEAD
(`--vllm-mlx` takes a git mirror and checks the `vllm_mlx` package of its HEAD) and on the
generated 1.9 MB module of benchmarks/hostile_trees.py (12 200 small async handlers, every one
a finding). Each is timed twice: wall clock, and the CPU time of the process and its children
(user + sys), which other work on a shared machine disturbs much less. Repeats are interleaved
(round k runs every measurement once, the order rotating with k) and the table shows medians;
a ratio is the median of each round's own ratio. Every child writes its bytecode under the
temporary folder (PYTHONPYCACHEPREFIX, even where PYTHONDONTWRITEBYTECODE is set), so that
after the untimed warm-up the checker is not compiled again on every run, as an installed copy
is not:

    .venv/bin/python benchmarks/bench_check.py --floor --vllm-mlx /path/to/vllm-mlx.git --repeats 3 \
        --edit engine/simple.py
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

VENV = Path(tempfile.gettempdir()) / "invariants-bench-venv"
FIXIT_RULE = '''
import libcst as cst
from fixit import LintRule
from libcst.metadata import QualifiedNameProvider


class BenchWaitFor(LintRule):
    """One qualified-name rule: calls of asyncio.wait_for, however imported."""

    METADATA_DEPENDENCIES = (QualifiedNameProvider,)

    def visit_Call(self, node: cst.Call) -> None:
        names = self.get_metadata(QualifiedNameProvider, node.func, set())
        if any(n.name == "asyncio.wait_for" for n in names):
            self.report(node, "asyncio.wait_for")
'''
FIXIT_DRIVER = '''
import sys
from pathlib import Path

from fixit.api import fixit_paths
from fixit.ftypes import Options, QualifiedRule

if __name__ == "__main__":  # Fixit's parallel mode starts worker processes that import this file
    paths = [Path(p) for p in Path(sys.argv[2]).read_text().split("\\n") if p]
    options = Options(rules=[QualifiedRule("bench_wait_for", "BenchWaitFor")])
    linted = {result.path for result in fixit_paths(paths, options=options, parallel=sys.argv[1] == "2")
              if result.error is None}
    sys.exit(0 if len(linted) == len(paths) else f"Fixit linted {len(linted)} of {len(paths)} files")
'''


@dataclass
class Row:
    tool: str
    tree: str
    lines: int
    sampled: bool
    cold: float
    rerun: float


def copy_tree(tree: Path, work: Path) -> Path:
    """The tree's Python files, copied to `work/trees/<name>`."""
    target = work / "trees" / tree.name
    shutil.copytree(tree, target, ignore=lambda folder, names: [
        n for n in names if not n.endswith(".py") and not (Path(folder) / n).is_dir()
    ])
    return target


def python_files(tree: Path) -> list[Path]:
    return sorted(p for p in tree.rglob("*.py") if p.is_file())


def count_lines(files: list[Path]) -> int:
    return sum(p.read_bytes().count(b"\n") for p in files)


def spread_sample(files: list[Path], max_lines: int) -> list[Path]:
    """Every k-th file, k chosen so the sample has about `max_lines` lines."""
    total = count_lines(files)
    if total <= max_lines:
        return files
    step = max(1, round(total / max_lines))
    return files[::step]


def ensure_venv(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"creating {venv} with flake8, flake8-async and fixit ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "flake8", "flake8-async", "fixit"], check=True)
    return python


def timed(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return elapsed


def bench_invariants(tree: Path, jobs: int, work: Path) -> tuple[float, float]:
    """Cold (empty cache) and re-run, as the console script runs them."""
    cache = work / f"cache-{tree.name}-{jobs}"
    shutil.rmtree(cache, ignore_errors=True)
    config = work / "pyproject.toml"
    config.write_text(f'[tool.invariants]\ncache-dir = "{cache}"\n')
    cmd = [sys.executable, "-m", "mlx_invariants", "check", "-q", "--exit-zero", "--jobs", str(jobs),
           "--config", str(config), str(tree)]
    return timed(cmd, work), timed(cmd, work)


def bench_flake8(python: Path, files: list[Path], jobs: int, work: Path) -> tuple[float, float]:
    listing = [str(p) for p in files]
    cmd = [str(python), "-m", "flake8", "--select", "ASYNC", "--exit-zero", "-j", str(jobs), *listing]
    return timed(cmd, work), timed(cmd, work)


def bench_fixit(python: Path, files: list[Path], jobs: int, work: Path) -> tuple[float, float]:
    rules = work / "fixit_rules"
    rules.mkdir(exist_ok=True)
    (rules / "bench_wait_for.py").write_text(FIXIT_RULE)
    (work / "fixit_driver.py").write_text(FIXIT_DRIVER)
    listing = work / "fixit_files.txt"
    listing.write_text("\n".join(str(p) for p in files))
    env = dict(os.environ, PYTHONPATH=str(rules))
    cmd = [str(python), str(work / "fixit_driver.py"), str(jobs), str(listing)]
    return timed(cmd, work, env), timed(cmd, work, env)


# The floor: read and parse every file with libcst, nothing else, in a fresh process as the checker runs.
PARSE_DRIVER = '''
import sys
from pathlib import Path

import libcst

for path in Path(sys.argv[1]).read_text().split("\\n"):
    if path:
        libcst.parse_module(Path(path).read_text(encoding="utf-8"))
'''


# The checker without its package-wide step (checker/model/): the per-file rules only, for the model's cost.
NO_MODEL_DRIVER = '''
import sys

from mlx_invariants.checker import runner

runner.phase.package_findings = lambda *args, **kwargs: ({}, {})
from mlx_invariants.cli import main

sys.exit(main(sys.argv[1:]))
'''


@dataclass
class FloorRow:
    target: str
    files: int
    lines: int
    megabytes: float
    edited_file: str = ""
    # Each measurement: (wall s, CPU s), one per round.
    cold: list[tuple[float, float]] = field(default_factory=list)
    parse: list[tuple[float, float]] = field(default_factory=list)
    warm: list[tuple[float, float]] = field(default_factory=list)
    cold_rss: list[float] = field(default_factory=list)
    parse_rss: list[float] = field(default_factory=list)
    bare: list[tuple[float, float]] = field(default_factory=list)  # cold, without the package model
    edited: list[tuple[float, float]] = field(default_factory=list)  # re-run after one file changed


def measured(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[tuple[float, float], float]:
    """(wall seconds, CPU seconds of the process and its children) and peak RSS (MB) of one child process."""
    start = time.perf_counter()
    child = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    elapsed = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    err = child.stderr.read().decode(errors="replace") if child.stderr else ""
    if child.returncode != 0:
        raise SystemExit(f"{cmd[:4]} failed ({child.returncode}): {err.strip()[-500:]}")
    return (elapsed, usage.ru_utime + usage.ru_stime), usage.ru_maxrss / 1024  # Linux reports KB


def floor_targets(args: argparse.Namespace, work: Path) -> list[tuple[str, Path]]:
    """(label, folder) of each tree to measure: vllm-mlx HEAD's package, --floor-tree folders, the dense module."""
    targets = []
    if args.vllm_mlx:
        head = work / "vllm-mlx-head"
        head.mkdir()
        archive = subprocess.run(["git", "--git-dir", str(args.vllm_mlx), "archive", "HEAD"], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(head)], input=archive.stdout, check=True)
        commit = subprocess.run(["git", "--git-dir", str(args.vllm_mlx), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, check=True).stdout.strip()
        targets.append((f"vllm-mlx HEAD {commit} (vllm_mlx/)", head / "vllm_mlx"))
    for tree in args.floor_tree or []:
        targets.append((tree.name, copy_tree(tree.resolve(), work)))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from hostile_trees import _huge_module  # the reliability run's "large-module" case, the same bytes

    dense = work / "dense"
    _huge_module(dense / "large.py", 1.9)
    targets.append(("generated dense module (1.9 MB)", dense))
    return targets


def bench_floor(args: argparse.Namespace) -> list[FloorRow]:
    rows: list[FloorRow] = []
    with tempfile.TemporaryDirectory(prefix="invariants-floor-") as tmp:
        work = Path(tmp)
        targets = floor_targets(args, work)
        plans = []
        for label, tree in targets:
            files = python_files(tree)
            listing = work / f"files-{len(plans)}.txt"
            listing.write_text("\n".join(str(p) for p in files))
            cache = work / f"cache-{len(plans)}"
            config = work / f"pyproject-{len(plans)}.toml"
            config.write_text(f'[tool.invariants]\ncache-dir = "{cache}"\n')
            args_ = ["check", "-q", "--exit-zero", "--config", str(config), str(tree)]
            check = [sys.executable, "-m", "mlx_invariants", *args_]
            bare = [sys.executable, "-c", NO_MODEL_DRIVER, *args_]
            parse = [sys.executable, "-c", PARSE_DRIVER, str(listing)]
            megabytes = sum(p.stat().st_size for p in files) / 1e6
            handler = tree / args.edit if args.edit and (tree / args.edit).is_file() else next(
                (p for p in files if "async def" in p.read_text(encoding="utf-8", errors="replace")), files[0])
            rows.append(FloorRow(label, len(files), count_lines(files), megabytes, str(handler.relative_to(tree))))
            plans.append((rows[-1], check, parse, cache, bare, handler))
        env = dict(os.environ, PYTHONPYCACHEPREFIX=str(work / "bytecode"))
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        # Untimed: compile the checker's bytecode and load libcst once, as any installed copy already has.
        warm = work / "warm-up"
        warm.mkdir()
        (warm / "warm.py").write_text("import asyncio\n\n\nasync def f(step):\n    return await asyncio.to_thread(step)\n")
        measured([sys.executable, "-m", "mlx_invariants", "check", "-q", "--exit-zero", "--no-cache", str(warm)], work, env)
        for k in range(args.repeats):
            for row, check, parse, cache, bare, handler in plans[k % len(plans):] + plans[: k % len(plans)]:
                steps = ["cold", "parse", "bare"] if k % 2 == 0 else ["bare", "parse", "cold"]
                for step in steps:
                    if step == "parse":
                        seconds, rss = measured(parse, work, env)
                        row.parse.append(seconds)
                        row.parse_rss.append(rss)
                        continue
                    shutil.rmtree(cache, ignore_errors=True)
                    if step == "bare":
                        row.bare.append(measured(bare, work, env)[0])
                        continue
                    seconds, rss = measured(check, work, env)
                    row.cold.append(seconds)
                    row.cold_rss.append(rss)
                    row.warm.append(measured(check, work, env)[0])
                    original = handler.read_bytes()
                    handler.write_bytes(original + b"\n# edited by bench_check.py\n")
                    try:
                        row.edited.append(measured(check, work, env)[0])
                    finally:
                        handler.write_bytes(original)
                print(f"  round {k + 1}: {row.target}: " + ", ".join(
                    f"{name} {wall:.2f}s (CPU {cpu:.2f}s)" for name, (wall, cpu) in (
                        ("check", row.cold[-1]), ("without the model", row.bare[-1]), ("parse", row.parse[-1]),
                        ("re-run", row.warm[-1]), ("one edit", row.edited[-1]))), file=sys.stderr)
    return rows


def print_floor(rows: list[FloorRow], repeats: int) -> None:
    med = statistics.median
    for index, clock in ((1, "CPU"), (0, "wall")):
        print(f"\n{clock} time:\n")
        print(f"| target | files | lines | MB | checker cold s | without the model s | the model s | bare libcst parse s "
              f"| ratio | re-run s | one file edited s (file) | checker peak RSS MB | parse peak RSS MB |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            cold, bare, parse = ([m[index] for m in ms] for ms in (r.cold, r.bare, r.parse))
            ratio = med(c / p for c, p in zip(cold, parse))
            model = med(c - b for c, b in zip(cold, bare))
            print(f"| {r.target} | {r.files} | {r.lines:,} | {r.megabytes:.1f} | {med(cold):.2f} | {med(bare):.2f} | "
                  f"{model:+.2f} | {med(parse):.2f} | {ratio:.2f}x | {med(m[index] for m in r.warm):.2f} | "
                  f"{med(m[index] for m in r.edited):.2f} (`{r.edited_file}`) | "
                  f"{max(r.cold_rss):.0f} | {max(r.parse_rss):.0f} |")
    print(f"\nMedians of {repeats} interleaved round(s); CPU: user + sys of the process and its children; ratio: "
          "median of each round's checker / parse; the model: median of each round's checker cold minus the same "
          "without the package model (per-file rules only); one file edited: the re-run after a comment is "
          "appended to that file; peak RSS: the largest of the rounds. Load average at the end: "
          + ", ".join(f"{x:.1f}" for x in os.getloadavg()) + ".")


def default_trees() -> list[Path]:
    site = Path(sysconfig.get_paths()["purelib"])
    return [site / name for name in ("mlx_lm", "transformers") if (site / name).is_dir()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", type=Path, help="a package folder (repeatable); default: mlx_lm, transformers")
    parser.add_argument("--venv", type=Path, default=VENV, help=f"throwaway venv for the other tools (default {VENV})")
    parser.add_argument("--competitor-lines", type=int, default=30_000,
                        help="run flake8-async and Fixit on a sample of about this many lines per tree")
    parser.add_argument("--skip-competitors", action="store_true", help="time invariants only")
    parser.add_argument("--floor", action="store_true",
                        help="compare a cold check with a bare libcst parse of the same files instead")
    parser.add_argument("--vllm-mlx", type=Path, metavar="GITDIR", help="with --floor: a vllm-mlx git mirror (or the folder holding it as repo/); checks HEAD's vllm_mlx/")
    parser.add_argument("--floor-tree", action="append", type=Path, metavar="PATH", help="with --floor: another folder (repeatable)")
    parser.add_argument("--repeats", type=int, default=3, help="with --floor: interleaved rounds (default 3)")
    parser.add_argument("--edit", metavar="RELPATH",
                        help="with --floor: the file to edit for the one-file re-run, relative to each tree "
                             "(default, or where a tree lacks it: its first file with an async def)")
    args = parser.parse_args()
    if args.floor:
        if args.vllm_mlx is not None:
            from corpus_bench.mirrors import git_dir_at  # beside this script, as corpus.py finds its mirrors

            found = git_dir_at(args.vllm_mlx)
            if found is None:
                parser.error(f"--vllm-mlx {args.vllm_mlx}: no git directory there (nor in its repo/ or .git/); "
                             "get one with `git clone --mirror https://github.com/waybarrios/vllm-mlx`")
            args.vllm_mlx = found
        rows = bench_floor(args)
        print(f"\nMachine: {platform.system()} {platform.machine()}, {os.cpu_count()} cores, "
              f"Python {platform.python_version()}\n")
        print_floor(rows, args.repeats)
        return 0
    trees = [t.resolve() for t in (args.tree or default_trees())]
    python = None if args.skip_competitors else ensure_venv(args.venv)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="invariants-bench-") as tmp:
        work = Path(tmp)
        for original in trees:
            tree = copy_tree(original, work)
            files = python_files(tree)
            lines = count_lines(files)
            for jobs in (1, 2):
                cold, rerun = bench_invariants(tree, jobs, work)
                rows.append(Row(f"invariants check --jobs {jobs}", tree.name, lines, False, cold, rerun))
                print(f"  {rows[-1].tool} on {tree.name}: {cold:.2f}s cold, {rerun:.2f}s re-run", file=sys.stderr)
            if python is None:
                continue
            sample = spread_sample(files, args.competitor_lines)
            sample_lines = count_lines(sample)
            for jobs in (1, 2):
                for name, bench in (("flake8 --select ASYNC", bench_flake8), ("Fixit, 1 qualified-name rule", bench_fixit)):
                    cold, rerun = bench(python, sample, jobs, work)
                    rows.append(Row(f"{name} -j{jobs}", tree.name, sample_lines, sample is not files, cold, rerun))
                    print(f"  {rows[-1].tool} on {tree.name}: {cold:.2f}s cold, {rerun:.2f}s re-run", file=sys.stderr)
    cpu = os.cpu_count()
    print(f"\nMachine: {platform.system()} {platform.machine()}, {cpu} cores, Python {platform.python_version()}\n")
    print("| tool | tree | lines | cold s | cold lines/s | re-run s | re-run lines/s |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        tree = f"{r.tree} (sample)" if r.sampled else r.tree
        print(f"| {r.tool} | {tree} | {r.lines:,} | {r.cold:.2f} | {r.lines / r.cold:,.0f} | {r.rerun:.2f} | "
              f"{r.lines / r.rerun:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
