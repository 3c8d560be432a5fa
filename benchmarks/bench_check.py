"""Time `invariants check` side by side with flake8-async and Fixit on large real trees.

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
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
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
    args = parser.parse_args()
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
