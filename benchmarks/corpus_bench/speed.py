"""`--head`'s speed section: benchmarks/bench_check.py's floor comparison, run by the same command as the
rest of docs/corpus.md, so the doc's figures all come from one run of one checker.

Issue 23 states three speed targets for the checker with its package-wide phase: a cold run within
1.5x a bare libcst parse of the same files, an unchanged re-run within 0.3 s, and a one-file change
in a 120-file package within 1 s. bench_check measures all three on vllm-mlx's HEAD (120 files),
each a fresh process, in CPU time beside the wall clock; here it runs the checker under test (the
`--checker-at` tree when one is given, the installed package otherwise) and its CPU table is kept.
On a shared VM the ratio is what to read: absolute times come from a dedicated machine
(docs/checker.md "Speed").
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from corpus_bench import mirrors
from corpus_bench.checker_at import CheckerTree

BENCH = Path(__file__).resolve().parent.parent / "bench_check.py"
REPO = "waybarrios/vllm-mlx"
EDITED = "engine/simple.py"
REPEATS = 3


def floor_section(mirror_root: Path, checker: CheckerTree | None, timeout: float = 3600) -> list[str]:
    """The doc's "Speed" section: bench_check's CPU table for vllm-mlx's HEAD and its dense module."""
    git_dir = mirrors.find(mirror_root, REPO).git_dir
    command = [sys.executable, str(BENCH), "--floor", "--vllm-mlx", str(git_dir), "--repeats", str(REPEATS),
               "--edit", EDITED]
    env = checker.env(dict(os.environ)) if checker is not None else dict(os.environ)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise mirrors.MirrorError(f"bench_check --floor failed ({done.returncode}): {done.stderr.strip()[-300:]}")
    out = done.stdout
    machine = next((line for line in out.splitlines() if line.startswith("Machine:")), "")
    table = out.split("CPU time:", 1)[1].split("wall time:", 1)[0].strip().splitlines() if "CPU time:" in out else []
    notes = next((line for line in out.splitlines() if line.startswith("Medians of")), "")
    return [
        "## Speed", "",
        f"`benchmarks/bench_check.py --floor --vllm-mlx MIRROR --repeats {REPEATS} --edit {EDITED}`, run by this "
        f"doc's command with the checker it scores ({machine.removeprefix('Machine: ').strip()}). The targets: a "
        "cold run within 1.5x the bare libcst parse (the ratio column), an unchanged re-run within 0.3 s, a one-file "
        "change in a 120-file package within 1 s. On this shared VM read the ratio; absolute times from a "
        "dedicated machine are in docs/checker.md \"Speed\". CPU seconds:", "",
        *table, "", notes, "",
    ]
