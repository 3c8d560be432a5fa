"""The sentinel reaches a launched process whose Python has no mlx_invariants of its own.

A third-party server runs on its own interpreter. The child here is a venv
that sees MLX but cannot import mlx_invariants (`tests/venvs.py`):
the injected `sitecustomize` must load the sentinel from the folders
`sentinel_env` names, and record the child's MLX calls.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from mlx_invariants.fuzz.injection import sentinel_env
from tests.venvs import borrowing_venv

WORK = "import mlx.core as mx\nmx.eval(mx.ones(3) * 2)\n"


def test_a_process_without_the_package_still_records_its_mlx_calls(tmp_path: Path) -> None:
    python, _ = borrowing_venv(tmp_path / "venv")
    env = sentinel_env(tmp_path / "mlx.jsonl", "sticky")
    bare = subprocess.run([str(python), "-c", "import mlx_invariants"], capture_output=True, text=True,
                          env={k: v for k, v in env.items() if k not in ("PYTHONPATH", "MLX_INVARIANTS_SENTINEL")})
    assert bare.returncode != 0, "the child must not have mlx_invariants of its own for this test to mean anything"
    done = subprocess.run([str(python), "-c", WORK], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in (tmp_path / "mlx.jsonl").read_text().splitlines() if line.strip()]
    assert not [r for r in records if "injection_error" in r], records
    assert any(r.get("kind") == "mlx" for r in records), records
