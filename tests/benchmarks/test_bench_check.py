"""benchmarks/bench_check.py's set-up: a vllm-mlx mirror given where `fetch` lays it out, or not there at all."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from corpus_bench.mirrors import git_dir_at  # noqa: E402  (benchmarks/ is on the path now)

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_check.py"


def test_a_folder_with_no_git_directory_is_a_usage_error_naming_it(tmp_path):
    done = subprocess.run([sys.executable, str(BENCH), "--floor", "--vllm-mlx", str(tmp_path / "vllm-mlx")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"--vllm-mlx {tmp_path / 'vllm-mlx'}: no git directory there" in done.stderr


def test_the_mirror_is_found_in_the_repo_folder_fetch_makes(tmp_path):
    git = tmp_path / "waybarrios+vllm-mlx" / "repo"
    subprocess.run(["git", "init", "-q", "--bare", str(git)], check=True)
    assert git_dir_at(tmp_path / "waybarrios+vllm-mlx") == git
    assert git_dir_at(git) == git and git_dir_at(tmp_path) is None
