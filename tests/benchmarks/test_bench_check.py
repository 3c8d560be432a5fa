"""benchmarks/bench_check.py's set-up: a vllm-mlx mirror given where `fetch` lays it out, or not there at all."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_check.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=120)


def test_a_folder_with_no_git_directory_is_a_usage_error_naming_it(tmp_path):
    done = _run("--floor", "--vllm-mlx", str(tmp_path / "vllm-mlx"))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"--vllm-mlx {tmp_path / 'vllm-mlx'}: no git directory there" in done.stderr


def test_the_mirror_is_found_in_the_repo_folder_fetch_makes(tmp_path):
    sys.path.insert(0, str(BENCH.parent))
    try:
        from bench_check import git_dir
    finally:
        sys.path.remove(str(BENCH.parent))
    git = tmp_path / "waybarrios+vllm-mlx" / "repo"
    subprocess.run(["git", "init", "-q", "--bare", str(git)], check=True)
    assert git_dir(tmp_path / "waybarrios+vllm-mlx", None) == git  # type: ignore[arg-type]
