"""benchmarks/bench_fuzz.py `--against REV` measures REV's fuzzer, not the working tree's twice.

An exported revision must import `mlx_invariants` (and its engine and fuzzer) from its own layout, ahead
of the editable install; and the fuzz command's verdict line must parse into examples and seconds, while
a run that found something must not pass for a rate.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_fuzz  # noqa: E402  (the benchmark script, importable once benchmarks/ is on the path)


@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(), reason="needs the git checkout")
def test_an_exported_revision_imports_its_own_harness(tmp_path: Path) -> None:
    site = bench_fuzz.export_revision("HEAD", tmp_path)
    origins = bench_fuzz.imported_from(site)
    assert origins["mlx_invariants"] == str(site / "mlx_invariants" / "__init__.py")
    assert origins["mlx_invariants.engine"] == str(site / "mlx_invariants" / "engine" / "__init__.py")
    assert origins["mlx_invariants.fuzz"] == str(site / "mlx_invariants" / "fuzz" / "__init__.py")
    assert not Path(bench_fuzz.imported_from(None)["mlx_invariants"]).is_relative_to(site)


def test_an_unknown_revision_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="git archive no-such-revision failed"):
        bench_fuzz.export_revision("no-such-revision", tmp_path)


def test_the_verdict_line_gives_examples_and_seconds() -> None:
    output = ("0/300 (cap) examples, 1s/900s, 0 finding(s), generate: [r0(p1 m1)] cancel at r0@ADMITTED\n"
              "batched: no new finding in 300 example(s), 41.7s (budget 900s, capped at 300 examples)\n"
              "run folder: reports/20261125-063530-batched (summary.md, summary.json, junit.xml)\n")
    assert bench_fuzz.parse_verdict(output) == {"examples": 300, "elapsed_s": 41.7}


def test_a_run_with_a_finding_is_no_rate() -> None:
    with pytest.raises(RuntimeError, match="no 'no new finding' verdict"):
        bench_fuzz.parse_verdict("simple: 1 new finding(s) in 12 example(s), 3.0s (budget 900s)\n")
